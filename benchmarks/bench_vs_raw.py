"""xccl against raw torch.distributed for all_reduce, 4 B to 64 MiB: the ratio per size (goal: within 5%).

The same measurement as ``xccl bench --op all_reduce --compare-raw -b 4 -e 64M`` (xccl and raw calls interleaved
call by call, alternating which goes first; a call's time is the slowest rank's; medians), plus a summary of the
ratios. ``ratio`` is xccl's busbw over raw's: 1.0 is parity, below 1 xccl is slower.

Usage::

    python benchmarks/bench_vs_raw.py                       # 2 ranks, cpu plugin (gloo), 50 samples per size
    python benchmarks/bench_vs_raw.py --nproc 4 --iters 100 --op all_gather_into_tensor
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from xccl.tools._bench import BenchConfig, launch, parse_size

RESULTS = Path(__file__).resolve().parent / "results" / "bench_vs_raw.json"


def main() -> int:
    """Run the sweep, print the table (from the ranks) and the summary, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--plugin", default="cpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--min-bytes", default="4")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=0.05, help="goal: |ratio - 1| <= this (default 0.05)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()

    cfg = BenchConfig(
        ops=(args.op,),
        plugin=args.plugin,
        nproc=args.nproc,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        iters=args.iters,
        warmup=args.warmup,
        compare_raw=True,
        progress=sys.stderr.isatty(),
    )
    doc = launch(cfg)
    rows = doc["results"][0]["rows"]
    ratios = [r["ratio"] for r in rows]
    outside = [(r["size"], r["ratio"]) for r in rows if abs(r["ratio"] - 1) > args.tolerance]
    summary = {
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "tolerance": args.tolerance,
        "sizes_outside_tolerance": outside,
    }
    doc["summary"] = summary
    print(
        f"# ratio xccl/raw busbw: median {summary['median_ratio']:.3f}, min {summary['min_ratio']:.3f}, "
        f"max {summary['max_ratio']:.3f}; {len(rows) - len(outside)}/{len(rows)} sizes within "
        f"{args.tolerance:.0%}"
    )
    for size, ratio in outside:
        print(f"#   outside: {size} B: {ratio:.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
