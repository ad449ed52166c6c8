"""What xccl's compositions cost against gloo's native collectives, at 64 MiB, 2 and 4 ranks.

Four questions, each answered by variants interleaved in one run:

1. **reduce_scatter_tensor**: ``xccl.reduce_scatter_tensor`` on the cpu plugin (whose table prefers
   all_to_all_single + a local reduction from 1 MiB, with scratch buffers reused) against gloo's native op on a
   plain gloo group; also the same composition with fresh buffers every call, and all_reduce + slice. Goal: xccl
   >= 1.0x native.
2. **list all_to_all**: ``xccl.all_to_all`` (concatenate + one all_to_all_single with split sizes + copy out, the
   cpu table's choice) against gloo's native list all_to_all; also with fresh buffers, and gloo's all_to_all_single
   on the same bytes for reference. Goal: >= 0.9x native.
3. **uneven all_gather**: ``xccl.all_gather_into_tensor_uneven`` (all_to_all_single with split sizes, no padding)
   against the plain torch.distributed way (``all_to_all_single`` sending this rank's rows to every peer, the
   input repeated per call); also the padded composition it replaces, and an even ``all_gather_into_tensor`` of
   the same total for reference. gloo's list all_gather refuses uneven sizes, so it is no alternative. Goal:
   >= 0.9x the all_to_all_single way.
4. **uneven reduce_scatter**: ``xccl.reduce_scatter_tensor_uneven`` (all_to_all_single with split sizes + local
   reduction) against the padded composition it replaces.

Method: each rank builds its inputs; every variant runs once and its result is checked against the baseline's;
then ``--warmup`` untimed rounds and ``--iters`` timed rounds, each round calling every variant once in an order
that rotates per round, so the noise of a shared machine falls on every variant alike. A call's time is the
slowest rank's; the table gives the median over rounds and ``ratio`` = the baseline's median time over the
variant's (above 1: faster than the baseline). ``size`` follows nccl-tests (the whole input of reduce_scatter,
one rank's send buffer of all_to_all, the gathered output of all_gather); ``busbw = size / time * (n-1)/n``.
``--repeat R`` runs everything R times in fresh processes and reports each ratio's median and range over runs.

``--sweep`` times reduce_scatter_tensor from 1 KiB to 64 MiB, gloo's native op against the all_to_all
composition (called directly, whatever the table prefers): the figures behind the cpu table's size threshold.

Usage::

    python benchmarks/emulation.py                       # 2 and 4 ranks, 64 MiB, 10 rounds
    python benchmarks/emulation.py --repeat 3            # three runs, ratios with their spread
    python benchmarks/emulation.py --sweep               # reduce_scatter_tensor, 1 KiB .. 64 MiB
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.spawn import start_processes

RESULTS = Path(__file__).resolve().parent / "results" / "emulation.json"
XCCL = "xccl (table's choice)"

#: scenario -> (variant names, the baseline the ratios are taken against, the goal for XCCL's ratio).
SCENARIOS: dict[str, tuple[tuple[str, ...], str, float | None]] = {
    "reduce_scatter_tensor": (
        ("gloo native", XCCL, "all_to_all, fresh buffers", "all_reduce + slice"), "gloo native", 1.0,
    ),
    "all_to_all (list)": (
        ("gloo native", XCCL, "all_to_all_single, fresh buffers", "gloo all_to_all_single, same bytes (ref)"),
        "gloo native", 0.9,
    ),
    "all_gather uneven": (
        ("plain all_to_all_single", XCCL, "padding (before)", "even all_gather, same total (ref)"),
        "plain all_to_all_single", 0.9,
    ),
    "reduce_scatter uneven": (("padding (before)", XCCL), "padding (before)", None),
}
SWEEP_MIB = (1 / 1024, 1 / 256, 1 / 64, 1 / 16, 1 / 4, 1, 4, 16, 64)


class Fresh:
    """Runs a call with the group's scratch pool off: every temporary allocated afresh (as before the pool)."""

    def __init__(self, st: Any, fn: Callable[[], Any]) -> None:
        self.st, self.fn = st, fn

    def __call__(self) -> Any:
        limit, self.st.scratch.limit = self.st.scratch.limit, 0
        try:
            return self.fn()
        finally:
            self.st.scratch.limit = limit


def _variants(
    scenario: str, nbytes: int, n: int, rank: int, raw: Any
) -> tuple[int, dict[str, Callable[[], Any]], Callable[[], dict[str, torch.Tensor]]]:
    """(size in bytes, {variant: call}, the outputs to compare after each variant ran once)."""
    import torch.distributed as dist

    import xccl
    from xccl.collectives._dispatch import block
    from xccl.collectives._groups import state_of
    from xccl.ops._emulations import BY_KEY
    from xccl.plugin import Collective as C

    st = state_of(None)
    call = partial(block, st)
    # torch 2.13 renamed these (the old names warn on every call); older torch has only the old ones.
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    g = torch.Generator().manual_seed(1234 + rank)
    elems = nbytes // 4
    sum_ = dist.ReduceOp.SUM
    names = SCENARIOS[scenario][0] if scenario in SCENARIOS else ()

    if scenario == "reduce_scatter_tensor":
        per = elems // n
        inp = torch.randn(per * n, generator=g)
        outs = {v: torch.empty(per) for v in names}
        ar_kernel = BY_KEY[(C.REDUCE_SCATTER_TENSOR, "all_reduce")].fn
        a2a_kernel = BY_KEY[(C.REDUCE_SCATTER_TENSOR, "all_to_all")].fn
        calls = {
            "gloo native": lambda: rs(outs["gloo native"], inp, group=raw),
            XCCL: lambda: xccl.reduce_scatter_tensor(outs[XCCL], inp),
            "all_to_all, fresh buffers": Fresh(st, lambda: a2a_kernel(st, call, outs[names[2]], inp, sum_, False)),
            "all_reduce + slice": lambda: ar_kernel(st, call, outs["all_reduce + slice"], inp, sum_, False),
        }
        return per * n * 4, calls, lambda: outs

    if scenario == "all_to_all (list)":
        per = elems // n
        ins = [torch.randn(per, generator=g) for _ in range(n)]
        got = {v: [torch.empty(per) for _ in range(n)] for v in names}
        flat_in, flat_out = torch.cat(ins), torch.empty(per * n)
        calls = {
            "gloo native": lambda: dist.all_to_all(got["gloo native"], ins, group=raw),
            XCCL: lambda: xccl.all_to_all(got[XCCL], ins),
            names[2]: Fresh(st, lambda: xccl.all_to_all(got[names[2]], ins)),
            names[3]: lambda: dist.all_to_all_single(flat_out, flat_in, group=raw),
        }
        return per * n * 4, calls, lambda: {**{v: torch.cat(got[v]) for v in names[:3]}, names[3]: flat_out}

    if scenario == "all_gather uneven":
        unit = elems // (n * (n + 1) // 2)
        sizes = [unit * (j + 1) for j in range(n)]
        inp = torch.randn(sizes[rank], generator=g)
        outs = {v: torch.empty(sum(sizes)) for v in names}
        even = sum(sizes) // n
        even_in = torch.randn(even, generator=g)
        pad_kernel = BY_KEY[(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "padding")].fn
        calls = {
            # the input repeated for every peer is built per call, as plain torch.distributed code must
            names[0]: lambda: dist.all_to_all_single(outs[names[0]], inp.repeat(n), sizes, [sizes[rank]] * n,
                                                     group=raw),
            XCCL: lambda: xccl.all_gather_into_tensor_uneven(outs[XCCL], inp, sizes),
            names[2]: lambda: pad_kernel(st, call, outs[names[2]], inp, sizes, False),
            names[3]: lambda: ag(outs[names[3]][: even * n], even_in, group=raw),
        }
        return sum(sizes) * 4, calls, lambda: {v: outs[v] for v in names[:3]}

    if scenario == "reduce_scatter uneven":
        unit = elems // (n * (n + 1) // 2)
        sizes = [unit * (j + 1) for j in range(n)]
        inp = torch.randn(sum(sizes), generator=g)
        outs = {v: torch.empty(sizes[rank]) for v in names}
        pad_kernel = BY_KEY[(C.REDUCE_SCATTER_TENSOR_UNEVEN, "padding")].fn
        calls = {
            names[0]: lambda: pad_kernel(st, call, outs[names[0]], inp, sizes, sum_, False),
            XCCL: lambda: xccl.reduce_scatter_tensor_uneven(outs[XCCL], inp, sizes),
        }
        return sum(sizes) * 4, calls, lambda: outs

    if scenario.startswith("sweep "):
        per = elems // n
        inp = torch.randn(per * n, generator=g)
        outs = {v: torch.empty(per) for v in ("gloo native", "all_to_all composition")}
        a2a_kernel = BY_KEY[(C.REDUCE_SCATTER_TENSOR, "all_to_all")].fn
        calls = {
            "gloo native": lambda: rs(outs["gloo native"], inp, group=raw),
            "all_to_all composition": lambda: a2a_kernel(st, call, outs["all_to_all composition"], inp, sum_, False),
        }
        return per * n * 4, calls, lambda: outs

    raise ValueError(scenario)


def _slowest(samples: list[list[float]], raw: Any) -> list[list[float]]:
    """Each sample as the slowest rank's (an all_reduce MAX over the plain gloo group)."""
    import torch.distributed as dist

    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=raw)
    return t.tolist()  # type: ignore[no-any-return]


def _measure(scenario: str, names: tuple[str, ...], base: str, nbytes: int, n: int, rank: int, raw: Any,
             args: argparse.Namespace) -> dict[str, Any]:
    size, calls, results = _variants(scenario, nbytes, n, rank, raw)
    for name in names:
        calls[name]()
    got = results()
    # Every variant's result against the baseline's (float sums in another order: a tolerance), before timing.
    ref = got[base] if base in got else next(iter(got.values()))
    for name, value in got.items():
        if not torch.allclose(value, ref, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{scenario}: {name!r} disagrees with {base!r} on rank {rank}")
    for _ in range(args.warmup):
        for name in names:
            calls[name]()
    samples: list[list[float]] = [[] for _ in names]
    for i in range(args.iters):
        for k in range(len(names)):
            v = (k + i) % len(names)  # rotate the order every round
            start = time.perf_counter()
            calls[names[v]]()
            samples[v].append(time.perf_counter() - start)
    slow = _slowest(samples, raw)
    med = {name: statistics.median(s) for name, s in zip(names, slow, strict=True)}
    factor = (n - 1) / n
    return {
        "size": size,
        "baseline": base,
        "variants": {
            name: {"time_ms": med[name] * 1e3, "busbw_gbps": size / med[name] / 1e9 * factor,
                   "ratio": med[base] / med[name]}
            for name in names
        },
    }


def _rank(rank: int, n: int, port: int, args: argparse.Namespace, path: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    import xccl
    from xccl.runtime import vendor_group

    xccl.init("cpu", fallback="emulate", timeout=600)
    raw = vendor_group()  # gloo itself, no xccl dispatch: the native baselines
    out: dict[str, Any] = {}
    if args.sweep:
        names = ("gloo native", "all_to_all composition")
        for mib in SWEEP_MIB:
            scenario = f"sweep {mib:g} MiB"
            out[scenario] = _measure(scenario, names, "gloo native", int(mib * (1 << 20)), n, rank, raw, args)
    else:
        for scenario, (names, base, _) in SCENARIOS.items():
            out[scenario] = _measure(scenario, names, base, args.mib << 20, n, rank, raw, args)
            if rank == 0:
                print(f"  [{n} ranks] {scenario} done", file=sys.stderr, flush=True)
    if rank == 0:
        Path(path).write_text(json.dumps(out))
    xccl.barrier()
    xccl.shutdown()
    sys.stdout.flush()
    os._exit(0)  # skip C++ static destructors after a clean shutdown (gloo threads at interpreter exit)


def _run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from xccl.testing import free_port

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        start_processes(_rank, args=(n, free_port(), args, path), nprocs=n, start_method="spawn")  # type: ignore[no-untyped-call]
        return json.loads(Path(path).read_text())  # type: ignore[no-any-return]
    finally:
        os.unlink(path)


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    """Run every scenario at each world size (``--repeat`` times), print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    parser.add_argument("--mib", type=int, default=64, help="message size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=10, help="timed rounds (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
    parser.add_argument("--repeat", type=int, default=1, help="whole runs in fresh processes (default 1)")
    parser.add_argument("--sweep", action="store_true", help="reduce_scatter_tensor at 1 KiB .. 64 MiB instead")
    parser.add_argument("--json", type=Path, help=f"output (default {RESULTS}, or emulation_sweep.json)")
    parser.add_argument(
        "--reuse-memory", action="store_true",
        help="keep freed memory in the ranks' heap (glibc: MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge), as a "
        "caching allocator would; the default allocator is what the goals are stated for",
    )
    parser.add_argument("--quick", action="store_true", help="2 ranks, 1 MiB, 1 round: a smoke run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.mib, args.iters, args.warmup, args.repeat = [2], 1, 1, 0, 1
    if args.json is None:
        args.json = RESULTS.with_name("emulation_sweep.json") if args.sweep else RESULTS
    if args.reuse_memory:
        os.environ.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))  # read by each spawned rank

    doc: dict[str, Any] = {
        "torch": torch.__version__, "mib": args.mib, "iters": args.iters, "warmup": args.warmup,
        "repeat": args.repeat, "cpus": os.cpu_count(), "reuse_memory": args.reuse_memory, "sweep": args.sweep,
        "timing": "median over rounds of the slowest rank's time per call; ratio = baseline time / variant time",
        "load_before": os.getloadavg(), "runs": {},
    }
    what = "reduce_scatter_tensor sweep" if args.sweep else f"{args.mib} MiB float32"
    print(f"# emulation vs native, {what}, cpu plugin over gloo, median of {args.iters} interleaved rounds"
          f"{', freed memory kept in the heap' if args.reuse_memory else ', default allocator'}")
    print(f"# {'ranks':>5}  {'collective':<22} {'variant':<42} {'time(ms)':>9} {'busbw GB/s':>10} {'ratio':>6}")
    for rep in range(args.repeat):
        for n in args.ranks:
            res = _run(n, args)
            doc["runs"].setdefault(str(n), []).append(res)
            for scenario, data in res.items():
                for name, row in data["variants"].items():
                    print(f"  {n:>5}  {scenario:<22} {name:<42} {row['time_ms']:>9.2f} {row['busbw_gbps']:>10.3f} "
                          f"{row['ratio']:>6.2f}{'  (base)' if name == data['baseline'] else ''}", flush=True)
        if args.repeat > 1:
            print(f"# run {rep + 1} of {args.repeat} done (load {os.getloadavg()[0]:.1f})", flush=True)
    doc["load_after"] = os.getloadavg()
    summary: dict[str, Any] = {}
    print(f"\n# ratios over {args.repeat} run(s): median (min-max)")
    for n, runs in doc["runs"].items():
        for scenario in runs[0]:
            goal = None if args.sweep else SCENARIOS[scenario][2]
            for name in runs[0][scenario]["variants"]:
                ratios = [r[scenario]["variants"][name]["ratio"] for r in runs]
                summary.setdefault(n, {}).setdefault(scenario, {})[name] = {
                    "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "all": ratios}
                mark = f"  goal >= {goal:g}: {'met' if min(ratios) >= goal else 'NOT met'}" if (
                    goal is not None and name == XCCL) else ""
                print(f"  {n:>5}  {scenario:<22} {name:<42} {_spread(ratios):>20}{mark}")
    doc["summary"] = summary
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
