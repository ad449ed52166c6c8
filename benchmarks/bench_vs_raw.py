"""xccl against raw torch.distributed for all_reduce, 4 B to 64 MiB: the ratio per size (goal: within 5%), beside
an A/A control that shows how far this machine's noise alone moves such a ratio.

The same measurement as ``xccl bench --op all_reduce --compare-raw --aa-control -b 4 -e 64M --passes 4
--time-per-size 2 --iters 5000 --min-iters 200``:

* per round, ``xccl.all_reduce``, ``dist.all_reduce`` and ``dist.all_reduce`` again (the A/A control), in an order
  that cycles through every permutation; all three on one communicator (the vendor's group, which xccl adopts), so
  that the only difference is the layer above it;
* a call's time is the slowest rank's; ``ratio`` is the median over rounds of raw's time over xccl's (xccl's busbw
  over raw's: 1.0 is parity, below 1 xccl is slower), with a distribution-free 95% confidence interval; ``A/A`` is
  the same ratio between the two raw calls;
* the sweep visits every size in 4 passes, and each size runs the rounds that fit in 2 s (thousands at 4 B), but
  at least 200 (the large sizes: their per-round ratios are as spread as the small sizes', and fewer rounds left
  the confidence intervals at 8 to 64 MiB wider than +-5%), so that bursts of load spread over the sizes.

``--layers`` instead shows where one small call's time goes, layer by layer, in a world of one (no peer to wait
for, so the differences are the CPU each layer adds): ``dist.all_reduce`` and ``xccl.all_reduce`` on the vendor's
group, ``xccl.all_reduce`` on its world, xccl's dispatch alone (the plan-cache entry pointed at a no-op), the c10d
kernel it caches, and the vendor's own call; blocks of calls of every variant interleaved in rotating order.

Usage::

    python benchmarks/bench_vs_raw.py                       # 2 ranks, cpu plugin (gloo)
    python benchmarks/bench_vs_raw.py --xccl-on-world       # xccl on its own world: two communicators
    python benchmarks/bench_vs_raw.py --nproc 4 --op all_gather_into_tensor --time-per-size 1
    python benchmarks/bench_vs_raw.py --layers              # per-call cost by layer -> results/bench_layers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xccl.tools._bench import BenchConfig, launch, parse_size, summarize

RESULTS = Path(__file__).resolve().parent / "results" / "bench_vs_raw.json"
LAYERS = RESULTS.with_name("bench_layers.json")


def layers(rounds: int, calls: int) -> dict[str, Any]:
    """Per-call time of each layer of a 1-element all_reduce in a world of one (this process)."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllreduceOptions

    import xccl
    from xccl.collectives._state import GROUPS
    from xccl.runtime import vendor_group
    from xccl.testing._pool import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    xccl.init("cpu")
    try:
        g, t, op = vendor_group(), torch.zeros(1), dist.ReduceOp.SUM
        xccl.all_reduce(t)
        st = GROUPS.default
        assert st is not None
        key = (xccl.Collective.ALL_REDUCE, t.dtype, op)
        kernel, native, opts = st.plans[key], st.native, AllreduceOptions()

        def noop(tensor: Any, reduce_op: Any, async_op: bool) -> None:
            return None

        def dispatch_only() -> None:
            st.plans[key] = noop
            try:
                for _ in range(calls):
                    xccl.all_reduce(t)
            finally:
                st.plans[key] = kernel

        variants: dict[str, Callable[[], Any]] = {
            "dist.all_reduce(t, group=vendor)": lambda: dist.all_reduce(t, group=g),
            "xccl.all_reduce(t, group=vendor)": lambda: xccl.all_reduce(t, group=g),
            "xccl.all_reduce(t) on its world": lambda: xccl.all_reduce(t),
            "  its c10d kernel (plan-cache entry)": lambda: kernel(t, op, False),
            "  the vendor backend: allreduce + wait": lambda: native.allreduce([t], opts).wait(),
            "vendor group: allreduce + wait": lambda: g.allreduce([t], opts).wait(),
        }
        blocks: dict[str, Callable[[], None]] = {}
        for name, fn in variants.items():
            def block(fn: Callable[[], Any] = fn) -> None:
                for _ in range(calls):
                    fn()

            blocks[name] = block
        blocks["xccl's dispatch alone (no-op kernel)"] = dispatch_only
        names = list(blocks)
        times: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # warm-up
            blocks[name]()
        for r in range(rounds):
            shift = r % len(names)
            order = names[shift:] + names[:shift]
            for name in order if r % 2 == 0 else reversed(order):
                start = time.perf_counter()
                blocks[name]()
                times[name].append((time.perf_counter() - start) / calls * 1e6)
    finally:
        xccl.shutdown()
    out = {name: {"median_us": statistics.median(v), "min_us": min(v), "samples_us": v} for name, v in times.items()}
    print(f"# one 1-element float32 all_reduce, world of one (gloo), {rounds} rounds of {calls} calls per variant")
    print(f"{'layer':<42} {'median us':>10} {'min us':>8}")
    for name, s in out.items():
        print(f"{name:<42} {s['median_us']:>10.2f} {s['min_us']:>8.2f}")
    return {"rounds": rounds, "calls": calls, "layers": out}


def main() -> int:
    """Run the sweep, print the table (from the ranks) and the verdict per size, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--plugin", default="cpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--min-bytes", default="4")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--iters", type=int, default=5000, help="most rounds per size (default 5000)")
    parser.add_argument("--time-per-size", type=float, default=2.0, help="seconds of rounds per size (default 2)")
    parser.add_argument("--passes", type=int, default=4, help="passes over the sizes (default 4)")
    parser.add_argument(
        "--min-iters", type=int, default=200, help="fewest rounds per size, for the large ones (default 200)"
    )
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--xccl-on-world", action="store_true", help="xccl on its own world (two communicators)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="goal: |ratio - 1| <= this (default 0.05)")
    parser.add_argument("--layers", action="store_true", help="per-call cost by layer in a world of one instead")
    parser.add_argument("--rounds", type=int, default=60, help="--layers: rounds (default 60)")
    parser.add_argument("--calls", type=int, default=500, help="--layers: calls per timed block (default 500)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="4 B to 64 B, a few rounds: a smoke run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.max_bytes, args.iters, args.time_per_size, args.passes, args.min_iters, args.warmup = "64", 20, 0.02, 1, 5, 2
        args.rounds, args.calls = 2, 20

    if args.layers:
        path = args.json or LAYERS
        doc = layers(args.rounds, args.calls)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"# wrote {path}")
        return 0

    cfg = BenchConfig(
        ops=(args.op,),
        plugin=args.plugin,
        nproc=args.nproc,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        iters=args.iters,
        warmup=args.warmup,
        compare_raw=True,
        control=True,
        same_group=not args.xccl_on_world,
        passes=args.passes,
        time_per_size=args.time_per_size,
        min_iters=args.min_iters,
        progress=sys.stderr.isatty(),
    )
    doc = launch(cfg)
    result = doc["results"][0]
    if result["raw_unavailable"] or result["error"]:
        print(f"# no comparison: {result['raw_unavailable'] or result['error']}")
        return 1
    summary = summarize(result["rows"], args.tolerance)
    doc["summary"] = summary
    print(f"#\n# {'size':>10} {'rounds':>6}  {'xccl/raw':>8} {'95% CI':>13}  {'A/A':>6} {'95% CI':>13}  verdict")
    for row in result["rows"]:
        lo, hi = row["ratio_ci"]
        aa = row["control"]
        verdict = "within" if abs(row["ratio"] - 1) <= args.tolerance else "OUTSIDE"
        if verdict == "within" and not (1 - args.tolerance <= lo and hi <= 1 + args.tolerance):
            verdict += " (CI wider)"
        print(
            f"# {row['size']:>10} {row['rounds']:>6}  {row['ratio']:>8.3f} {lo:>6.3f}-{hi:<6.3f}  {aa['ratio']:>6.3f} "
            f"{aa['ratio_ci'][0]:>6.3f}-{aa['ratio_ci'][1]:<6.3f}  {verdict}"
        )
    for name, key in (("xccl/raw", "xccl_vs_raw"), ("A/A", "aa_control")):
        s = summary[key]
        print(
            f"# {name}: median {s['median_ratio']:.3f}, min {s['min_ratio']:.3f}, max {s['max_ratio']:.3f}; "
            f"{s['within']}/{summary['sizes']} sizes within {args.tolerance:.0%}, {s['resolved_within']} with the "
            "whole 95% CI within"
        )
    path = args.json or RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
