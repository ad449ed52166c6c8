"""What xccl adds to a native call: ``dist.*`` on xccl's group and ``xccl.*``, against the vendor's own group.

A world of ``--world`` ranks of the ``--plugin`` (cpu: gloo; cuda: NCCL, one GPU per rank), a 1-element float32
collective (``--op``: all_reduce by default; all_gather_into_tensor, reduce_scatter_tensor, broadcast,
all_to_all_single). Five variants, interleaved in one process: every round runs a block of ``--calls`` calls of each
(on a GPU followed by one synchronize), in an order that rotates from round to round, so that machine noise falls on
all of them alike:

* ``vendor``: the ``torch.distributed`` call on a plain ``torch.distributed.ProcessGroup`` whose backend is the
  vendor's own communicator under xccl's world (the same backend object: the same connections, worker thread or
  NCCL communicator), with no xccl code on its path;
* ``vendor again``: the same call again, an A/A control that shows how far noise alone moves a ratio;
* ``dist on xccl``: the ``torch.distributed`` call on xccl's world group (its process group, its hooks);
* ``xccl``: the ``xccl.*`` call on the world;
* ``other group``: the ``torch.distributed`` call on a separate group of the vendor's backend (``new_group``):
  shown, not the reference. Each gloo backend has its own worker thread, and at a world of one a call is mostly
  the hand-off to that thread and back; where the scheduler happens to place two backends' threads differs by tens
  of percent from one process to the next on a 2-core VM, which would be measured as xccl's cost if the reference
  were another backend.

Reported: each variant's median per-call time and its median ratio to ``vendor`` over rounds, xccl's dispatch
alone (the same ``xccl.*`` call with its planned kernel replaced by a no-op: group lookup, validation, plan cache, the
group's hooks), and what ``group.rank()`` and ``group.size()`` together cost on xccl's world and on the vendor's
group, the fastest of five alternating blocks (torch's Python asks for them often: ``dist.get_rank()``, FSDP2). Each
tree runs in its default configuration (the flight recorder is on by default since the call pipeline; before it,
off).

``--baseline REV`` runs the same measurement on another commit side by side: it checks ``REV`` out into a temporary
git worktree and alternates fresh interpreters of each tree (``--repeats`` each, which goes first alternating),
``PYTHONPATH`` putting that tree's ``xccl`` first, and reports the median of each tree's figures.

Usage: ``python benchmarks/overhead.py [--plugin cpu|cuda|ascend|sophgo] [--op OP] [--world 1|2] [--rounds 40] [--calls 200]
[--baseline REV] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

VARIANTS = ("vendor", "vendor again", "dist on xccl", "xccl", "other group")
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")


def _state_of() -> Any:
    try:
        from xccl.collectives._groups import state_of
    except ImportError:  # a tree from before the call pipeline (--baseline)
        from xccl.collectives._state import state_of  # type: ignore[no-redef]
    return state_of(None)


def _calls(op: str, world: int, device: torch.device, groups: dict[str, Any]) -> dict[str, Any]:
    """Each variant's call of ``op`` on 1-element float32 tensors (``groups``: variant -> group, None for the world)."""
    import torch.distributed as dist

    import xccl

    one = torch.ones(1, device=device)
    many = torch.ones(world, device=device)
    out = torch.empty(world, device=device)
    calls: dict[str, Any] = {}
    for variant, group in groups.items():
        api = xccl if variant == "xccl" else dist
        kw = {} if variant == "xccl" else {"group": group}
        if op == "all_reduce":
            calls[variant] = lambda api=api, kw=kw: api.all_reduce(one, **kw)
        elif op == "all_gather_into_tensor":
            calls[variant] = lambda api=api, kw=kw: api.all_gather_into_tensor(many, one, **kw)
        elif op == "reduce_scatter_tensor":
            calls[variant] = lambda api=api, kw=kw: api.reduce_scatter_tensor(one, many, **kw)
        elif op == "broadcast":  # group_src: the vendor's group is not in torch's world map to translate src by
            calls[variant] = (lambda: xccl.broadcast(one, 0)) if variant == "xccl" else (
                lambda g=group: dist.broadcast(one, group=g, group_src=0))
        else:
            calls[variant] = lambda api=api, kw=kw: api.all_to_all_single(out, many, **kw)
    return calls


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    import xccl

    cuda = args.plugin == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    simulated = args.plugin in ("ascend", "sophgo")
    xccl.init(args.plugin, simulate=simulated)
    kind = dist.ProcessGroup.BackendType.NCCL if cuda else dist.ProcessGroup.BackendType.GLOO
    other = dist.new_group(backend="nccl" if cuda else "gloo")
    # The vendor's own group: torch's ProcessGroup over the very backend xccl's world calls (its kernels' target); a
    # simulated vendor's is its simulated group itself (its checks and run time, then gloo).
    vendor = _state_of().native
    if not simulated:
        vendor = dist.ProcessGroup(dist.HashStore(), rank, world)
        vendor._register_backend(device, kind, _state_of().native)
        vendor._set_default_backend(kind)
    calls = _calls(args.op, world, device,
                   {"vendor": vendor, "vendor again": vendor, "dist on xccl": None, "xccl": None, "other group": other})
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def block(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        sync()
        return (time.perf_counter() - t0) / args.calls

    for fn in calls.values():  # warm up every path and the plan caches
        for _ in range(20):
            fn()
    sync()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for v in order:
            if world > 1:
                dist.barrier(group=other)
            times[v].append(block(calls[v]))
    # Dispatch alone: the same call with its planned kernel replaced by a no-op (collective-free, local only).
    st = _state_of()
    collective = xccl.Collective[args.op.upper()]
    key = next((k for k in st.plans if k[0] == collective and k[1] == torch.float32), None)
    dispatch = float("nan")  # a tree that keys its plans otherwise (--baseline)
    if key is not None:
        real = st.plans[key]
        st.plans[key] = lambda *a, **k: None
        n = 100_000
        fn = calls["xccl"]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dispatch = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            pass
        dispatch -= (time.perf_counter() - t0) / n
        st.plans[key] = real
    # A group's rank() and size(), which torch's Python asks for often (dist.get_rank, FSDP2), on xccl's world and
    # on the vendor's group, alternating.
    world_pg = dist.group.WORLD
    ask = {"xccl": lambda: (world_pg.rank(), world_pg.size()), "vendor": lambda: (vendor.rank(), vendor.size())}
    asked: dict[str, list[float]] = {k: [] for k in ask}
    for _ in range(5):
        for k, fn in ask.items():
            t0 = time.perf_counter()
            for _ in range(args.calls * 20):
                fn()
            asked[k].append((time.perf_counter() - t0) / (args.calls * 20))
    if world > 1:
        dist.barrier(group=other)
    if rank == 0:
        queue.put({"times": times, "dispatch_s": dispatch, "rank_size_s": {k: min(v) for k, v in asked.items()}})
    xccl.shutdown()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run of this checkout (whatever ``xccl`` this interpreter imports)."""
    from xccl.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, args.world, port, args, queue)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    res = queue.get(timeout=900)
    for proc in procs:
        proc.join(timeout=60)
    times = res["times"]
    base = times["vendor"]
    return {
        "plugin": args.plugin,
        "op": args.op,
        "world_size": args.world,
        "tensor": "1 x float32",
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "median_us": {v: statistics.median(times[v]) * 1e6 for v in VARIANTS},
        "ratio_to_vendor": {v: statistics.median(x / b for x, b in zip(times[v], base, strict=True)) for v in VARIANTS},
        "dispatch_us": res["dispatch_s"] * 1e6,
        "rank_size_us": {k: v * 1e6 for k, v in res["rank_size_s"].items()},
        "torch": torch.__version__,
    }


def _print(out: dict[str, Any]) -> None:
    print(f"{out['op']} on {out['plugin']}, world of {out['world_size']}, {out['tensor']}, {out['rounds']} rounds of "
          f"{out['calls_per_round']} calls")
    print(f"{'variant':<16}{'median per call':>18}{'ratio to vendor':>16}")
    for v in VARIANTS:
        print(f"{v:<16}{out['median_us'][v]:>15.2f} us{out['ratio_to_vendor'][v]:>16.3f}")
    print(f"xccl's dispatch alone (no-op kernel): {out['dispatch_us']:.2f} us per call")
    rs = out["rank_size_us"]
    print(f"group.rank() + group.size(): xccl's group {rs['xccl']:.3f} us, the vendor's {rs['vendor']:.3f} us")


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """This checkout against ``args.baseline``, alternating fresh interpreters of each."""
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="xccl-baseline-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", "-q", str(base), args.baseline],
                       check=True, timeout=120)
        try:
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
            for i in range(args.repeats):
                order = [("baseline", base), ("current", here)]
                for name, tree in order if i % 2 == 0 else order[::-1]:
                    out = Path(tmp) / f"{name}-{i}.json"
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
                    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--world", str(args.world),
                                    "--plugin", args.plugin, "--op", args.op,
                                    "--rounds", str(args.rounds), "--calls", str(args.calls), "--json", str(out),
                                    "--quiet"], check=True, env=env, cwd=tmp, timeout=1800)
                    runs[name].append(json.loads(out.read_text()))
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(base)], timeout=120,
                           check=False)

    def med(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"median_us": {v: statistics.median(r["median_us"][v] for r in rs) for v in VARIANTS},
                "ratio_to_vendor": {v: statistics.median(r["ratio_to_vendor"][v] for r in rs) for v in VARIANTS},
                "dispatch_us": statistics.median(r["dispatch_us"] for r in rs),
                "rank_size_us": {k: statistics.median(r["rank_size_us"][k] for r in rs) for k in ("xccl", "vendor")}}

    return {"baseline": args.baseline, "world_size": args.world, "repeats": args.repeats,
            "median": {name: med(rs) for name, rs in runs.items()}, "runs": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plugin", default="cpu", choices=("cpu", "cuda", "ascend", "sophgo"),
                   help="cuda: NCCL, one GPU per rank; ascend, sophgo: simulated")
    p.add_argument("--op", default="all_reduce", choices=OPS)
    p.add_argument("--world", type=int, default=2, choices=(1, 2))
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default="benchmarks/results/overhead.json")
    p.add_argument("--baseline", help="a git revision to compare with, side by side")
    p.add_argument("--repeats", type=int, default=4, help="runs per tree with --baseline")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="2 rounds of 10 calls: a smoke run (tests)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.calls, args.repeats = 2, 10, 1
    if args.baseline:
        out = compare(args)
        b, c = out["median"]["baseline"], out["median"]["current"]
        print(f"{args.op} on {args.plugin}, world of {args.world}, median of {args.repeats} runs per tree; ratio: "
              "median over rounds of the variant's time over the vendor group's in the same round")
        print(f"{'variant':<16}{'baseline us':>13}{'ratio':>8}{'current us':>13}{'ratio':>8}")
        for v in VARIANTS:
            print(f"{v:<16}{b['median_us'][v]:>13.2f}{b['ratio_to_vendor'][v]:>8.3f}{c['median_us'][v]:>13.2f}"
                  f"{c['ratio_to_vendor'][v]:>8.3f}")
        print(f"{'dispatch alone':<16}{b['dispatch_us']:>13.2f}{'':>8}{c['dispatch_us']:>13.2f}")
        for k in ("xccl", "vendor"):
            print(f"{'rank+size ' + k:<16}{b['rank_size_us'][k]:>13.3f}{'':>8}{c['rank_size_us'][k]:>13.3f}")
    else:
        out = measure(args)
        if not args.quiet:
            _print(out)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
