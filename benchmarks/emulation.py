"""What emulation costs: xccl's compositions against gloo's native collectives, at 64 MiB.

Three questions, each at 2 and 4 ranks:

1. **reduce_scatter_tensor** (what SCCL lacks): the all_to_all-based emulation (``all_to_all_single`` + a local
   reduction, the bytes of a ring reduce_scatter) and the all_reduce + slice fallback (twice the bytes), against
   gloo's native ``reduce_scatter_tensor``. Goal: the all_to_all emulation reaches >= 0.8 of native busbw.
2. **list all_to_all** (SCCL has only ``all_to_all_single``): concatenate + ``all_to_all_single`` + copy out,
   against gloo's native list ``all_to_all`` (and its ``all_to_all_single`` on the same bytes, for reference).
3. **uneven all_gather** (HCCL has it natively, gloo does not): the padded emulation (pad to the largest split,
   even ``all_gather_into_tensor``, unpad), against the plain torch.distributed way without padding
   (``all_to_all_single`` sending this rank's rows to every peer) and, for reference, an even
   ``all_gather_into_tensor`` of the same total size. gloo's list ``all_gather`` refuses uneven sizes
   ("ProcessGroupGloo::allgather: invalid tensor size"), so it is no alternative.

The emulated variants go through xccl's dispatch on the ``gloo-emulated`` test plugin (``tests/plugins/
xccl-testplugins``, whose table marks these ops emulated over gloo) when it is installed; otherwise they call the
emulation kernels from ``xccl.collectives._emulate.EMULATIONS`` on the ``cpu`` plugin, which is the same code minus the
dispatch. The native variants call ``torch.distributed`` directly on the same gloo process group.

Method: every variant runs once and is checked against the native result, then ``--iters`` rounds each time one
call of every variant, in an order that rotates per round so that the noise of a shared machine spreads evenly;
a call's time is the slowest rank's, and the table gives the median over rounds. ``size`` follows nccl-tests (the
full input of reduce_scatter, one rank's send buffer of all_to_all, the gathered output of all_gather) and
``busbw = size / time * (n-1)/n``.

Usage::

    python benchmarks/emulation.py                    # 2 and 4 ranks, 64 MiB, 10 rounds
    python benchmarks/emulation.py --ranks 2 --mib 16 --iters 5
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
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.spawn import start_processes

RESULTS = Path(__file__).resolve().parent / "results" / "emulation.json"

#: scenario -> (variant names, the one the ratios are taken against).
SCENARIOS: dict[str, tuple[tuple[str, ...], str]] = {
    "reduce_scatter_tensor": (("native gloo", "emulated: all_to_all", "emulated: all_reduce+slice"), "native gloo"),
    "all_to_all (list)": (
        ("native gloo", "emulated: all_to_all_single", "native all_to_all_single (ref)"),
        "native gloo",
    ),
    "all_gather uneven": (
        ("emulated: padding", "native all_to_all_single", "native even all_gather (ref)"),
        "native all_to_all_single",
    ),
}


def _route() -> str:
    import xccl

    ok = any(i.name == "gloo-emulated" and i.available for i in xccl.plugins())
    return "gloo-emulated" if ok else "cpu"


def _variants(
    scenario: str, nbytes: int, n: int, rank: int, plugin: str
) -> tuple[int, dict[str, Callable[[], Any]], Callable[[], list[torch.Tensor]]]:
    """(size in bytes, {variant: call}, outputs to compare after each variant ran once)."""
    import torch.distributed as dist

    import xccl
    from xccl.collectives._emulate import EMULATIONS
    from xccl.collectives._state import state_of as context
    from xccl.plugin._capabilities import Collective as C

    ctx = context(None)
    g = torch.Generator().manual_seed(1234 + rank)
    elems = nbytes // 4
    sum_ = dist.ReduceOp.SUM
    via_xccl = plugin == "gloo-emulated"

    if scenario == "reduce_scatter_tensor":
        per = elems // n
        inp = torch.randn(per * n, generator=g)
        outs = {v: torch.empty(per) for v in SCENARIOS[scenario][0]}
        native, a2a, ar = (outs[v] for v in SCENARIOS[scenario][0])
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        a2a_kernel = EMULATIONS[C.REDUCE_SCATTER_TENSOR]["all_to_all"][0]
        ar_kernel = EMULATIONS[C.REDUCE_SCATTER_TENSOR]["all_reduce"][0]
        calls = {
            "native gloo": lambda: rs(native, inp),
            "emulated: all_to_all": (lambda: xccl.reduce_scatter_tensor(a2a, inp))
            if via_xccl
            else (lambda: a2a_kernel(ctx, a2a, inp, sum_, None, False)),
            "emulated: all_reduce+slice": lambda: ar_kernel(ctx, ar, inp, sum_, None, False),
        }
        return per * n * 4, calls, lambda: [native, a2a, ar]

    if scenario == "all_to_all (list)":
        per = elems // n
        ins = [torch.randn(per, generator=g) for _ in range(n)]
        got = {v: [torch.empty(per) for _ in range(n)] for v in SCENARIOS[scenario][0]}
        flat_in, flat_out = torch.cat(ins), torch.empty(per * n)
        kernel = EMULATIONS[C.ALL_TO_ALL]["all_to_all_single"][0]
        emu = got["emulated: all_to_all_single"]
        calls = {
            "native gloo": lambda: dist.all_to_all(got["native gloo"], ins),
            "emulated: all_to_all_single": (lambda: xccl.all_to_all(emu, ins))
            if via_xccl
            else (lambda: kernel(ctx, emu, ins, None, False)),
            "native all_to_all_single (ref)": lambda: dist.all_to_all_single(flat_out, flat_in),
        }
        return per * n * 4, calls, lambda: [torch.cat(got["native gloo"]), torch.cat(emu), flat_out]

    if scenario == "all_gather uneven":
        unit = elems // (n * (n + 1) // 2)
        sizes = [unit * (j + 1) for j in range(n)]
        inp = torch.randn(sizes[rank], generator=g)
        pad, a2a = torch.empty(sum(sizes)), torch.empty(sum(sizes))
        even = sum(sizes) // n
        even_in, even_out = torch.randn(even, generator=g), torch.empty(even * n)
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        kernel = EMULATIONS[C.ALL_GATHER_INTO_TENSOR_UNEVEN]["padding"][0]
        calls = {
            "emulated: padding": (lambda: xccl.all_gather_into_tensor_uneven(pad, inp, sizes))
            if via_xccl
            else (lambda: kernel(ctx, pad, inp, sizes, None, False)),
            # the input repeated for every peer is built per call, as an emulation would have to
            "native all_to_all_single": lambda: dist.all_to_all_single(a2a, inp.repeat(n), sizes, [sizes[rank]] * n),
            "native even all_gather (ref)": lambda: ag(even_out, even_in),
        }
        return sum(sizes) * 4, calls, lambda: [pad, a2a]

    raise ValueError(scenario)


def _rank(rank: int, n: int, port: int, args: argparse.Namespace, plugin: str, path: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    import xccl
    from xccl.tools._bench import _slowest

    xccl.init(plugin, fallback="emulate", timeout=300)
    device = torch.device("cpu")
    out: dict[str, Any] = {}
    for scenario, (names, base) in SCENARIOS.items():
        size, calls, results = _variants(scenario, args.mib << 20, n, rank, plugin)
        for name in names:
            calls[name]()
        got = results()
        # Check the emulations against the native result before timing anything.
        for other in got[1:]:
            if other.numel() == got[0].numel() and not torch.allclose(other, got[0], rtol=1e-4, atol=1e-4):
                raise AssertionError(f"{scenario}: a variant disagrees with {names[0]} on rank {rank}")
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
        slow = _slowest(samples, device)
        med = {name: statistics.median(s) for name, s in zip(names, slow, strict=True)}
        factor = (n - 1) / n
        rows = {
            name: {
                "time_ms": med[name] * 1e3,
                "busbw_gbps": size / med[name] / 1e9 * factor,
                "ratio": med[base] / med[name],
            }
            for name in names
        }
        out[scenario] = {"size": size, "baseline": base, "variants": rows}
        if rank == 0:
            print(f"  [{n} ranks] {scenario} done", file=sys.stderr, flush=True)
    if rank == 0:
        Path(path).write_text(json.dumps(out))
    xccl.barrier()
    xccl.shutdown()
    sys.stdout.flush()
    os._exit(0)  # see xccl.tools._bench._rank_main: skip C++ teardown after a clean shutdown


def main() -> int:
    """Run every scenario at each world size, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    parser.add_argument("--mib", type=int, default=64, help="message size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=10, help="timed rounds (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
    parser.add_argument("--json", type=Path, help=f"output (default {RESULTS}, or emulation_reuse_memory.json)")
    parser.add_argument(
        "--reuse-memory",
        action="store_true",
        help="keep freed memory in the ranks' heap (glibc: MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge), as a "
        "caching allocator would, so fresh temporaries cost no page faults; shows how much of a variant's time is "
        "first-touching new buffers",
    )
    args = parser.parse_args()
    if args.json is None:
        args.json = RESULTS.with_name("emulation_reuse_memory.json") if args.reuse_memory else RESULTS
    if args.reuse_memory:
        # Read by glibc when each spawned rank starts.
        os.environ.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))

    from xccl.testing._pool import free_port

    plugin = _route()
    doc: dict[str, Any] = {
        "torch": torch.__version__,
        "plugin": plugin,
        "mib": args.mib,
        "iters": args.iters,
        "warmup": args.warmup,
        "cpus": os.cpu_count(),
        "reuse_memory": args.reuse_memory,
        "timing": "median over rounds of the slowest rank's time per call",
        "runs": {},
    }
    print(
        f"# emulation vs native, {args.mib} MiB float32, emulated variants via plugin {plugin!r}, "
        f"median of {args.iters} rounds{', freed memory kept in the heap' if args.reuse_memory else ''}"
    )
    print(f"# {'ranks':>5}  {'collective':<22} {'variant':<32} {'time(ms)':>9} {'busbw GB/s':>10} {'ratio':>6}")
    for n in args.ranks:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            start_processes(_rank, args=(n, free_port(), args, plugin, path), nprocs=n, start_method="spawn")  # type: ignore[no-untyped-call]
            res = json.loads(Path(path).read_text())
        finally:
            os.unlink(path)
        doc["runs"][str(n)] = res
        for scenario, data in res.items():
            for name, row in data["variants"].items():
                print(
                    f"  {n:>5}  {scenario:<22} {name:<32} {row['time_ms']:>9.2f} {row['busbw_gbps']:>10.3f} "
                    f"{row['ratio']:>6.2f}"
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"# ratio: the variant's busbw over the scenario's baseline ({', '.join(b for _, b in SCENARIOS.values())})")
    print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
