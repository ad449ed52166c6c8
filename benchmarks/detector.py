"""The mismatch detector's cost per collective, against torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, and how fast it
reports a mismatch.

2 ranks, gloo on loopback, ``all_reduce`` of 1 element, 64 KiB and 1 MiB (float32). Two kinds of launch, run as
alternating rounds of separate 2-rank process sets (``--launches`` of each, A B B A A B ...):

* **A** (no debug variable): ``torch.distributed.all_reduce`` on a plain gloo group, ``xccl.all_reduce`` with the
  detector off, with it on, and off again (an A/A control: the noise floor), alternating *call by call* in the
  same processes, each call timed on its own; a round's figure per variant is the median of its calls, and the
  detector's overhead is the median over rounds of on/off in the same round. The detector is switched per call
  (every rank at the same call), so its background thread, once started, runs through the "off" calls too: its
  cost (a few store operations every 0.5 s) is in both.
* **B** (``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in the environment before the ranks start: torch reads it when it is
  imported, and wraps every gloo group created afterwards): the same ``torch.distributed.all_reduce`` on a gloo
  group. torch's per-call check cannot be switched in a running process, so its overhead is the ratio of the
  B launch's median to the neighbouring A launch's plain-torch median: a cross-process comparison, whose noise the
  spread of A's plain-torch medians across launches shows.

Then, time from a mismatched call to the error on every rank: with the detector (default stall threshold 2 s,
interval 0.5 s), for a call new on its group (compared before it is issued), a repeated call that stalls, a
repeated call that does not stall (SUM on one rank, MAX on the other; calls continue every 10 ms), and ranks
waiting for each other in different groups; with DETAIL, for a new call of another op and of another shape.

Usage: ``python benchmarks/detector.py [--launches 3] [--rounds 20] [--calls 200] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZES = {"1 element": 1, "64 KiB": 16_384, "1 MiB": 262_144}
VARIANTS_A = ("torch", "xccl", "xccl_check", "xccl_again")
TIMEOUT = 60.0
KINDS_A = ("new call, other op", "new call, other shape", "repeated call, other op (stalls)",
           "repeated call, other reduce op (no stall)", "call order across groups (deadlock)")
KINDS_B = ("new call, other op", "new call, other shape", "repeated call, other op (stalls)",
           "repeated call, other reduce op (no stall)")


# ------------------------------------------------------------------------------------------------- rank bodies


def body_rounds(variants: tuple[str, ...], rounds: int, calls: int) -> dict[str, dict[str, list[float]]]:
    """Per size, per variant: the median per-call time of each round (seconds).

    Within a round the variants alternate call by call, in a random order per block of one call each, every call
    timed on its own, so that load on the machine falls on all of them alike; the round's figure for a variant is
    the median of its calls. ``xccl_again`` is the plain xccl call a second time: an A/A control, the noise floor.
    """
    import torch.distributed as dist

    import xccl
    from xccl.collectives import _check, _hooks
    from xccl.collectives._groups import state_of

    gloo = dist.new_group(backend="gloo")
    st = state_of(None)
    # The world's pipeline with the detector's hook (innermost, as check=True installs it) and without it.
    checked = _hooks.chains([*st.hooks, _check.hook(st)])
    plain = _hooks.chains(st.hooks)
    clock = time.perf_counter

    def variant(name: str, t: torch.Tensor) -> Callable[[], Any]:
        if name == "torch":
            return lambda: dist.all_reduce(t, group=gloo)
        on = checked if name == "xccl_check" else plain

        def run() -> None:
            st.issue, st.issue_inner = on  # every rank switches at the same call: the detector's steps stay aligned
            xccl.all_reduce(t)

        return run

    out: dict[str, dict[str, list[float]]] = {}
    for label, numel in SIZES.items():
        t = torch.ones(numel)
        n = max(12, calls if numel == 1 else calls // 4 if numel < 100_000 else calls // 20)
        fns = [variant(v, t) for v in variants]
        for fn in fns:  # warm up every path (and start the detector)
            for _ in range(5):
                fn()
        per_round: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(rounds):
            # Every block of calls runs the variants in a fresh random order, the same on every rank (one seed):
            # no variant always follows the same one (a call on another group after torch's finds its threads
            # asleep, say).
            rng = random.Random(r)
            dist.barrier(group=gloo)
            got: list[list[float]] = [[] for _ in variants]
            for _ in range(n):
                for k in rng.sample(range(len(variants)), len(variants)):
                    t0 = clock()
                    fns[k]()
                    got[k].append(clock() - t0)
            for v, xs in zip(variants, got, strict=True):
                per_round[v].append(statistics.median(xs))
        out[label] = per_round
    st.issue, st.issue_inner = plain
    return out


def body_mismatch_xccl(kind: str) -> float:
    """Seconds from this rank's mismatched call to its CollectiveMismatch."""
    import xccl
    from xccl.collectives import _check, _hooks
    from xccl.collectives._groups import state_of

    w = xccl.get_world()
    odd = w.rank == w.world_size - 1
    g = xccl.new_group(list(range(w.world_size)))
    pair = xccl.new_group([0, 1])
    t = torch.ones(4)
    SUM, MAX = xccl.ReduceOp.SUM, xccl.ReduceOp.MAX
    for group in (g, pair, None):
        st = state_of(group)
        _hooks.add_hook(st, _check.hook(st))
    xccl.barrier()  # the detector is running (it starts at a process's first checked call)
    if kind.startswith("repeated"):
        xccl.all_reduce(t, group=g)
        xccl.broadcast(t, src=0, group=g)
        xccl.all_reduce(t, op=MAX, group=g)
    elif kind.startswith("call order"):
        xccl.all_reduce(t, group=g)
        xccl.all_reduce(t, group=pair)
    t0 = time.monotonic()
    try:
        if kind == "new call, other op" or kind.startswith("repeated call, other op"):
            xccl.broadcast(t, src=0, group=g) if odd else xccl.all_reduce(t, group=g)
        elif kind == "new call, other shape":
            xccl.all_reduce(torch.ones(8 if odd else 4), group=g)
        elif kind.startswith("repeated call, other reduce op"):
            xccl.all_reduce(t, op=MAX if odd else SUM, group=g)
        elif kind.startswith("call order"):
            xccl.all_reduce(t, group=pair) if w.rank == 0 else xccl.all_reduce(t, group=g)
        for _ in range(int(TIMEOUT / 0.01)):
            xccl.all_reduce(t, group=g)
            time.sleep(0.01)
    except xccl.CollectiveMismatch:
        return time.monotonic() - t0
    raise AssertionError(f"{kind}: no CollectiveMismatch")


def body_mismatch_detail(kind: str) -> float | None:
    """Seconds from this rank's mismatched call to torch's error (TORCH_DISTRIBUTED_DEBUG=DETAIL); None if torch
    raised nothing within 100 calls after it."""
    import torch.distributed as dist

    g = dist.new_group(backend="gloo")
    odd = dist.get_rank() == dist.get_world_size() - 1
    t = torch.ones(4)
    SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    if kind.startswith("repeated"):
        dist.all_reduce(t, group=g)
        dist.broadcast(t, src=0, group=g)
        dist.all_reduce(t, op=MAX, group=g)
    t0 = time.monotonic()
    try:
        if kind == "new call, other shape":
            dist.all_reduce(torch.ones(8 if odd else 4), group=g)
        elif kind.startswith("repeated call, other reduce op"):
            dist.all_reduce(t, op=MAX if odd else SUM, group=g)
        else:
            dist.broadcast(t, src=0, group=g) if odd else dist.all_reduce(t, group=g)
        for _ in range(100):
            dist.all_reduce(t, group=g)
            time.sleep(0.01)
    except RuntimeError as exc:
        if "mismatch" in str(exc).lower():
            return time.monotonic() - t0
        raise
    return None


# ------------------------------------------------------------------------------------------------- launches


def _launch(detail: bool, args: argparse.Namespace) -> dict[str, Any]:
    from xccl.testing import RankPool

    saved = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    if detail:
        # In the environment before the ranks start: torch reads it when it is imported.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    else:
        os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    try:
        # spawn, not forkserver: a forkserver imports torch once, before the variable is set or unset here.
        with RankPool(2, {"vendor": "cpu", "timeout": TIMEOUT}, start_method="spawn") as pool:
            variants = ("torch",) if detail else VARIANTS_A
            rounds = pool.run_ok(body_rounds, variants, args.rounds, args.calls, timeout=1800)[0]
        mismatch: dict[str, list[float]] = {}
        if args.mismatch:
            # A fresh pair of processes per kind: the first mismatch of a job, with the detector in its normal
            # rhythm (after one, its thread runs faster for a while).
            body, kinds = (body_mismatch_detail, KINDS_B) if detail else (body_mismatch_xccl, KINDS_A)
            for kind in kinds:
                with RankPool(2, {"vendor": "cpu", "timeout": TIMEOUT}, start_method="spawn") as pool:
                    mismatch[kind] = pool.run_ok(body, kind, timeout=TIMEOUT + 60)
    finally:
        if saved is None:
            os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = saved
    return {"detail": detail, "rounds": rounds, "mismatch": mismatch}


def _med_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def _paired(runs: list[dict[str, Any]], label: str, a: str, b: str) -> list[float]:
    """a / b - 1 for every round of every run (both measured in the same round)."""
    return [x / y - 1 for r in runs for x, y in zip(r["rounds"][label][a], r["rounds"][label][b], strict=True)]


def _quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def report(launches: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    a = [r for r in launches if not r["detail"]]
    b = [r for r in launches if r["detail"]]
    out: dict[str, Any] = {"world_size": 2, "launches_each": args.launches, "rounds": args.rounds,
                           "calls_per_round": args.calls, "torch": torch.__version__, "sizes": {}, "mismatch": {}}
    print(f"2 ranks, gloo on loopback; {args.launches} launches of each kind, {args.rounds} rounds each; medians of "
          "per-call times, the variants alternating call by call")
    print(f"{'size':>9} {'torch':>9} {'xccl':>9} {'xccl+det':>9} {'detector':>9} {'(IQR)':>15} {'A/A':>7} "
          f"{'DETAIL':>9} {'DETAIL/torch':>12} {'(per launch)':>20}")
    for label in SIZES:
        det = _paired(a, label, "xccl_check", "xccl")
        control = _paired(a, label, "xccl_again", "xccl")
        med = {v: statistics.median(_med_us(r["rounds"][label][v]) for r in a) for v in VARIANTS_A}
        torch_a = [_med_us(r["rounds"][label]["torch"]) for r in a]
        detail = [_med_us(r["rounds"][label]["torch"]) for r in b]
        # Each B launch against the A launch next to it (same position in the alternation).
        ratios = [d / t for d, t in zip(detail, torch_a, strict=False)]
        lo, hi = _quartiles(det)
        out["sizes"][label] = {
            "elements": SIZES[label],
            "torch_median_us": med["torch"],
            "xccl_median_us": med["xccl"],
            "xccl_detector_median_us": med["xccl_check"],
            "detector_overhead_median": statistics.median(det),
            "detector_overhead_iqr": [lo, hi],
            "detector_overhead_per_launch": [statistics.median(_paired([r], label, "xccl_check", "xccl")) for r in a],
            "aa_control_median": statistics.median(control),
            "torch_detail_median_us": statistics.median(detail) if detail else None,
            "detail_over_torch_per_launch": ratios,
            "torch_median_us_per_a_launch": torch_a,
        }
        each = ", ".join(f"{x:.1f}" for x in ratios)
        print(f"{label:>9} {med['torch']:>6.1f} us {med['xccl']:>6.1f} us {med['xccl_check']:>6.1f} us "
              f"{statistics.median(det):>+9.1%} {f'{lo:+.1%}..{hi:+.1%}':>15} {statistics.median(control):>+7.1%} "
              f"{(statistics.median(detail) if detail else float('nan')):>6.0f} us "
              f"{(statistics.median(ratios) if ratios else float('nan')):>11.1f}x {each:>20}")
    if args.mismatch:
        print("\ntime from the mismatched call to the error, per rank (median of launches)")
        for name, runs, kinds in (("xccl detector", a, KINDS_A), ("torch DETAIL", b, KINDS_B)):
            for kind in kinds:
                found = [[x for x in (r["mismatch"][kind][i] for r in runs) if x is not None] for i in range(2)]
                per_rank = [statistics.median(xs) if xs else None for xs in found]
                out["mismatch"][f"{name}: {kind}"] = {"per_rank_s": per_rank,
                                                      "runs": [r["mismatch"][kind] for r in runs]}
                print(f"  {name:>13}  {kind:<42} "
                      + ", ".join("not detected" if s is None else f"{s:.3f} s" for s in per_rank))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=3, help="launches of each kind (A: plain, B: DETAIL)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=200, help="calls per round at 1 element (fewer at larger sizes)")
    p.add_argument("--no-mismatch", dest="mismatch", action="store_false", help="skip the time-to-error runs")
    p.add_argument("--json", default="benchmarks/results/detector.json")
    p.add_argument("--quick", action="store_true", help="one launch of each kind, 2 rounds, no time-to-error runs")
    args = p.parse_args()
    if args.quick:
        args.launches, args.rounds, args.calls, args.mismatch = 1, 2, 5, False
    launches = []
    for i in range(args.launches):
        for detail in ((False, True) if i % 2 == 0 else (True, False)):  # A B B A A B: neither always first
            launches.append(_launch(detail, args))
    out = report(launches, args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
