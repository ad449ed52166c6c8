"""Cost of the collective-mismatch detector (``xccl.init(check=True)``) per collective.

Each rank runs ``xccl.all_reduce`` on the same gloo group with the detector off and on, and
``torch.distributed.all_reduce`` as the baseline, in alternating rounds (``--rounds`` of ``--calls`` calls each) so
that every variant sees the same machine noise; the table gives the median per-call time of each and the
detector's added time relative to the plain xccl call. Each size runs back to back and with 200 us of busy
"compute" before every call (see ``GAPS_US``: the gap row is what a training loop sees). ``detector alone`` times
the check by itself (fingerprint, one-way set, two store round trips, comparison) with no collective after it.

Usage: ``python benchmarks/check_overhead.py [--world 2] [--rounds 30] [--calls 200] [--json PATH]``
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

import torch
import torch.multiprocessing as mp

SIZES = (1, 262_144)  # elements of float32: 4 bytes and 1 MiB
#: Busy "compute" between calls, in microseconds. Back to back (0), gloo's threads are still awake from the
#: previous call; any gap of ~50 us or more lets them sleep, and every call then pays their wake-up. Training
#: loops compute between collectives, so the gap row is the realistic one; the tight row is the worst case.
GAPS_US = (0, 200)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    import xccl
    from xccl.collectives._check import verify
    from xccl.collectives._state import state_of as context
    from xccl.plugin._capabilities import Collective

    xccl.init("cpu", check=True, timeout=60)
    ctx = context(None)

    def timed(fn: Callable[[], Any], calls: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    def compute(gap: float) -> None:
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass

    def with_check(on: bool, t: torch.Tensor, gap: float) -> Callable[[], Any]:
        def run() -> None:
            compute(gap)
            # Every rank flips the flag at the same point, so the detector's clocks stay aligned.
            ctx.check = on
            xccl.all_reduce(t)

        return run

    def plain(t: torch.Tensor, gap: float) -> Callable[[], Any]:
        def run() -> None:
            compute(gap)
            dist.all_reduce(t)

        return run

    results: dict[str, Any] = {}
    for size, gap_us in [(size, gap) for size in SIZES for gap in GAPS_US]:
        t = torch.ones(size)
        gap = gap_us * 1e-6
        calls = args.calls if size == 1 else max(10, args.calls // 10)
        variants: dict[str, Callable[[], Any]] = {
            "torch": plain(t, gap),
            "xccl": with_check(False, t, gap),
            "xccl_check": with_check(True, t, gap),
        }
        for fn in variants.values():  # warm up every path
            for _ in range(5):
                fn()
        times: dict[str, list[float]] = {k: [] for k in variants}
        names = list(variants)
        for i in range(args.rounds):
            order = names[i % len(names):] + names[: i % len(names)]  # rotate who goes first
            for name in order:
                times[name].append(timed(variants[name], calls))
        results[f"{size}/{gap_us}"] = times
    ctx.check = True
    probe = torch.ones(1)
    only = timed(lambda: verify(ctx, Collective.ALL_REDUCE, (probe,), xccl.ReduceOp.SUM), args.calls * 5)
    dist.barrier()
    if rank == 0:
        queue.put({"sizes": results, "detector_only_s": only})
    xccl.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default="benchmarks/results/check_overhead.json")
    args = p.parse_args()
    from xccl.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, args.world, port, args, queue)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    res = queue.get(timeout=1200)
    for proc in procs:
        proc.join(timeout=60)
    out: dict[str, Any] = {
        "world_size": args.world,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "torch": torch.__version__,
        "detector_only_us": res["detector_only_s"] * 1e6,
        "sizes": {},
    }
    print(f"world size {args.world}, gloo on loopback, medians of {args.rounds} rounds")
    print("times include the gap of busy compute before each call; 'check adds' is xccl+check minus xccl")
    print(f"{'elements':>10} {'gap':>7} {'torch.dist':>12} {'xccl':>12} {'xccl+check':>12} {'check adds':>12} "
          f"{'overhead':>9}")
    for key, times in res["sizes"].items():
        size, gap_us = key.split("/")
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        paired = statistics.median(c / x - 1 for c, x in zip(times["xccl_check"], times["xccl"], strict=True))
        added = med["xccl_check"] - med["xccl"]
        out["sizes"][key] = {
            "elements": int(size),
            "gap_us": int(gap_us),
            "torch_median_us": med["torch"],
            "xccl_median_us": med["xccl"],
            "xccl_check_median_us": med["xccl_check"],
            "check_added_us": added,
            "overhead_vs_xccl": added / med["xccl"],
            "median_paired_overhead": paired,
        }
        print(
            f"{size:>10} {gap_us:>4} us {med['torch']:>9.1f} us {med['xccl']:>9.1f} us {med['xccl_check']:>9.1f} us "
            f"{added:>9.1f} us {added / med['xccl']:>8.0%}"
        )
    print(f"detector alone (no collective): {out['detector_only_us']:.1f} us per call")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
