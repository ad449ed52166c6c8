"""xccl.all_reduce against torch.distributed.all_reduce on the same gloo group, and xccl's pure dispatch cost.

2 ranks, a 1-element float32 tensor. The two variants alternate in rounds (``--rounds`` of ``--calls`` calls
each) so both see the same machine noise; we report the median per-call time of each and their ratio. The
dispatch cost is measured by running ``xccl.all_reduce`` with the plan cache entry for this call shape pointed
at a no-op kernel: everything xccl does per call (group lookup, plan lookup, validation), minus the collective.

Usage: ``python benchmarks/overhead.py [--rounds 40] [--calls 200] [--json benchmarks/results/overhead.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    import xccl
    from xccl.collectives._state import state_of as context
    from xccl.plugin._capabilities import Collective

    xccl.init("cpu")
    t = torch.ones(1)
    ar_x, ar_d = xccl.all_reduce, dist.all_reduce

    def timed(fn: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(t)
        return (time.perf_counter() - t0) / args.calls

    for _ in range(5):  # warm up both paths and the plan cache
        ar_x(t)
        ar_d(t)
    xs, ds = [], []
    for i in range(args.rounds):
        # Alternate which goes first so neither always follows the barrier.
        if i % 2:
            xs.append(timed(ar_x))
            ds.append(timed(ar_d))
        else:
            ds.append(timed(ar_d))
            xs.append(timed(ar_x))
    # Pure dispatch: the same call, with the cached kernel replaced by a no-op (collective-free, local only).
    ctx = context(None)
    key = (Collective.ALL_REDUCE, torch.float32, xccl.ReduceOp.SUM)
    real = ctx.plans[key]
    ctx.plans[key] = lambda *a: None
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        ar_x(t)
    dispatch = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    loop = (time.perf_counter() - t0) / n
    ctx.plans[key] = real
    dist.barrier()
    if rank == 0:
        queue.put({"xccl_s": xs, "torch_s": ds, "dispatch_s": dispatch - loop})
    xccl.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default="benchmarks/results/overhead.json")
    args = p.parse_args()
    from xccl.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    res = queue.get(timeout=600)
    for proc in procs:
        proc.join(timeout=60)
    mx, md = statistics.median(res["xccl_s"]), statistics.median(res["torch_s"])
    ratios = [x / d for x, d in zip(res["xccl_s"], res["torch_s"], strict=True)]
    out = {
        "world_size": 2,
        "tensor": "1 x float32",
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "torch_median_us": md * 1e6,
        "xccl_median_us": mx * 1e6,
        "ratio_of_medians": mx / md,
        "median_of_paired_ratios": statistics.median(ratios),
        "dispatch_us": res["dispatch_s"] * 1e6,
        "torch": torch.__version__,
    }
    print(f"{'variant':<28}{'median per call':>18}")
    print(f"{'torch.distributed.all_reduce':<28}{md * 1e6:>15.1f} us")
    print(f"{'xccl.all_reduce':<28}{mx * 1e6:>15.1f} us")
    print(f"ratio xccl/torch (medians): {mx / md:.3f}   median of paired round ratios: {statistics.median(ratios):.3f}")
    print(f"xccl dispatch cost (no-op kernel): {res['dispatch_s'] * 1e6:.2f} us per call")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
