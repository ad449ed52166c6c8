"""xccl.all_reduce against torch.distributed.all_reduce on the same gloo group, and xccl's pure dispatch cost.

2 ranks, a 1-element float32 tensor. The two variants alternate in rounds (``--rounds`` of ``--calls`` calls
each) so both see the same machine noise; we report the median per-call time of each and their ratio. The
dispatch cost is measured by running ``xccl.all_reduce`` with the plan cache entry for this call shape pointed
at a no-op kernel: everything xccl does per call (group lookup, plan lookup, validation), minus the collective.

Usage: ``python benchmarks/overhead.py [--rounds 40] [--calls 200] [--json benchmarks/results/overhead.json]``

``--baseline REV`` compares this checkout with another commit side by side: it checks ``REV`` out into a temporary
git worktree and runs the same measurement ``--repeats`` times for each tree, alternating which goes first, each run
in a fresh interpreter whose ``PYTHONPATH`` puts that tree's ``xccl`` first. It reports the median of each tree's
figures and the ratios current/baseline (the dispatch cost before and after a refactoring, say).
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


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    import xccl

    # Decided from the tree, not by trying an import: the editable install's finder would serve this checkout's
    # modules to an older tree that lacks them.
    if (Path(xccl.__file__).parent / "collectives").is_dir():
        from xccl.collectives._groups import state_of as context
        from xccl.plugin._capabilities import Collective
    else:  # a tree from before the layer packages (--baseline); same plan-cache key
        from xccl._capabilities import Collective  # type: ignore[no-redef]
        from xccl._init import context  # type: ignore[no-redef]

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


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One 2-rank run of this checkout (whatever ``xccl`` this interpreter imports)."""
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
    return {
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
                    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--rounds", str(args.rounds),
                                    "--calls", str(args.calls), "--json", str(out), "--quiet"],
                                   check=True, env=env, cwd=tmp, timeout=900)
                    runs[name].append(json.loads(out.read_text()))
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(base)], timeout=120,
                           check=False)
    keys = ("dispatch_us", "xccl_median_us", "torch_median_us", "ratio_of_medians")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    return {
        "baseline": args.baseline,
        "repeats": args.repeats,
        "median": med,
        "current_over_baseline": {k: med["current"][k] / med["baseline"][k] for k in keys},
        "runs": runs,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default="benchmarks/results/overhead.json")
    p.add_argument("--baseline", help="a git revision to compare with, side by side")
    p.add_argument("--repeats", type=int, default=6, help="runs per tree with --baseline")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="2 rounds of 10 calls: a smoke run (tests)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.calls, args.repeats = 2, 10, 1
    if args.baseline:
        out = compare(args)
        print(f"{'median of ' + str(args.repeats) + ' runs':<34}{'baseline':>12}{'current':>12}{'current/base':>14}")
        for k, label in (("dispatch_us", "dispatch cost, us/call"), ("xccl_median_us", "xccl.all_reduce, us/call"),
                         ("torch_median_us", "dist.all_reduce, us/call"), ("ratio_of_medians", "xccl / torch")):
            b, c = out["median"]["baseline"][k], out["median"]["current"][k]
            print(f"{label:<34}{b:>12.3f}{c:>12.3f}{c / b:>14.3f}")
    else:
        out = measure(args)
        if not args.quiet:
            md, mx = out["torch_median_us"], out["xccl_median_us"]
            print(f"{'variant':<28}{'median per call':>18}")
            print(f"{'torch.distributed.all_reduce':<28}{md:>15.1f} us")
            print(f"{'xccl.all_reduce':<28}{mx:>15.1f} us")
            print(f"ratio xccl/torch (medians): {out['ratio_of_medians']:.3f}   median of paired round ratios: "
                  f"{out['median_of_paired_ratios']:.3f}")
            print(f"xccl dispatch cost (no-op kernel): {out['dispatch_us']:.2f} us per call")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
