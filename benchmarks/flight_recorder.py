"""The flight recorder's cost per collective, side by side with an A/A control.

2 ranks, gloo on loopback, ``xccl.all_reduce`` of 1 element and 1 MiB (float32), synchronous and asynchronous
(``async_op=True`` then ``wait()``: the recorder stamps its completion from a callback on the backend's future,
the path DDP takes). In the same processes, alternating *call by call* in a random order per block (the same on
every rank), each call timed on its own:

* ``torch``: ``torch.distributed.all_reduce`` on a plain gloo group (for scale);
* ``xccl``: the recorder off (the world's pipeline without its recorder hook, for that call);
* ``xccl+fr``: the recorder on (a ring of ``_flight.DEFAULT_ENTRIES`` entries);
* ``xccl again``: the recorder off a second time: the A/A control, the noise floor.

A round's figure per variant is the median of its calls; the recorder's overhead is the median over rounds of
``xccl+fr / xccl - 1`` in the same round, with its interquartile range, next to the control's ``xccl again / xccl
- 1``. The recorder is on by default only if this stays within the detector's budget (+5% at one element).

``--calibrate`` adds, at one element, variants whose outermost hook spins for a fixed wall time (1, 3 and 6 µs)
instead of recording: what that much time on the call path costs *in situ*, between the other rank and gloo's
threads. A line through the origin fitted to them turns the recorder's overhead into the microseconds it costs where
it runs, printed next to its cost in a hot loop (the same call with the kernel replaced by a no-op, recorder on and
off): a stage that takes a microsecond in a loop takes several between two processes, whose caches the other
threads have just used.

Usage: ``python benchmarks/flight_recorder.py [--launches 2] [--rounds 20] [--calls 200] [--calibrate]
[--json PATH] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZES = {"1 element": 1, "1 MiB": 262_144}
MODES = ("sync", "async")
VARIANTS = ("torch", "xccl", "xccl_fr", "xccl_again")
#: ``--calibrate``: the spinning hooks' wall times, in microseconds.
BURNS_US = (1, 3, 6)
TIMEOUT = 60.0


class _Spin:
    """A hook whose stage spins for ``us`` microseconds of wall time, then calls on (``--calibrate``)."""

    def __init__(self, us: int) -> None:
        self.ns = us * 1000

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        import time

        ns, clock = self.ns, time.perf_counter_ns

        def spun(spec: Any, kargs: Any, kernel: Any, async_op: bool) -> Any:
            end = clock() + ns
            while clock() < end:
                pass
            return inner(spec, kargs, kernel, async_op)

        return spun


def _hot_us(st: Any, t: torch.Tensor, chains: dict[str, Any], n: int = 20_000) -> dict[str, float]:
    """Per chain, one ``xccl.all_reduce`` with its planned kernel replaced by a no-op, in a hot loop (microseconds)."""
    import time

    import xccl

    key = next(k for k in st.plans if k[0] == xccl.Collective.ALL_REDUCE and k[1] == t.dtype)
    real, st.plans[key] = st.plans[key], lambda *a, **k: None
    out = {}
    try:
        for name, on in chains.items():
            st.issue, st.issue_inner = on
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    xccl.all_reduce(t)
                best = min(best, (time.perf_counter() - t0) / n * 1e6)
            out[name] = best
    finally:
        st.plans[key] = real
    return out


def body_rounds(rounds: int, calls: int, calibrate: bool = False) -> dict[str, dict[str, list[float]]]:
    """Per case (size, mode), per variant: the median per-call time of each round (seconds); with ``calibrate``,
    the spinning variants at one element too, and the hot-loop costs (case ``hot``, microseconds)."""
    import time

    import torch.distributed as dist

    import xccl
    from xccl.collectives import _flight, _hooks
    from xccl.collectives._groups import state_of

    gloo = dist.new_group(backend="gloo")
    st = state_of(None)
    # The world's pipeline with its recorder hook (on by default) and without it: switched per call.
    hooks = st.hooks if any(isinstance(h, _flight._Recorder) for h in st.hooks) else (
        st.hooks[0], _flight._Recorder(st, _flight.Flight(_flight.DEFAULT_ENTRIES)), *st.hooks[1:])
    recorded = _hooks.chains(hooks)
    rest = [h for h in hooks if not isinstance(h, _flight._Recorder)]
    plain = _hooks.chains(rest)
    spun = {f"spin_{us}us": _hooks.chains([_Spin(us), *rest]) for us in BURNS_US}
    clock = time.perf_counter

    def variant(name: str, t: torch.Tensor, async_op: bool) -> Callable[[], Any]:
        if name == "torch":
            if async_op:
                return lambda: dist.all_reduce(t, group=gloo, async_op=True).wait()
            return lambda: dist.all_reduce(t, group=gloo)
        on = recorded if name == "xccl_fr" else spun.get(name, plain)

        def run() -> None:
            st.issue, st.issue_inner = on  # every rank switches at the same call
            if async_op:
                xccl.all_reduce(t, async_op=True).wait()
            else:
                xccl.all_reduce(t)

        return run

    out: dict[str, dict[str, list[float]]] = {}
    for label, numel in SIZES.items():
        for mode in MODES:
            t = torch.ones(numel)
            n = max(12, calls if numel == 1 else calls // 20)
            names = VARIANTS + (tuple(spun) if calibrate and numel == 1 else ())
            fns = [variant(v, t, mode == "async") for v in names]
            for fn in fns:
                for _ in range(5):
                    fn()
            per_round: dict[str, list[float]] = {v: [] for v in names}
            for r in range(rounds):
                rng = random.Random(r)
                dist.barrier(group=gloo)
                got: list[list[float]] = [[] for _ in names]
                for _ in range(n):
                    for k in rng.sample(range(len(names)), len(names)):
                        t0 = clock()
                        fns[k]()
                        got[k].append(clock() - t0)
                for v, xs in zip(names, got, strict=True):
                    per_round[v].append(statistics.median(xs))
            out[f"{label}, {mode}"] = per_round
    if calibrate:
        hot = _hot_us(st, torch.ones(1), {"xccl": plain, "xccl_fr": recorded})
        out["hot"] = {k: [v] for k, v in hot.items()}
    st.issue, st.issue_inner = _hooks.chains(st.hooks)
    return out


def _paired(runs: list[dict[str, list[float]]], a: str, b: str) -> list[float]:
    return [x / y - 1 for r in runs for x, y in zip(r[a], r[b], strict=True)]


def report(launches: list[dict[str, dict[str, list[float]]]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"world_size": 2, "launches": args.launches, "rounds": args.rounds,
                           "calls_per_round": args.calls, "torch": torch.__version__, "cases": {}}
    print(f"2 ranks, gloo on loopback; {args.launches} launch(es), {args.rounds} rounds each; medians of per-call "
          "times, the variants alternating call by call")
    print(f"{'case':>17} {'torch':>9} {'xccl':>9} {'xccl+fr':>9} {'recorder':>9} {'(IQR)':>15} {'A/A':>7}")
    for case in (c for c in launches[0] if c != "hot"):
        runs = [launch[case] for launch in launches]
        med = {v: statistics.median(statistics.median(r[v]) for r in runs) * 1e6 for v in VARIANTS}
        fr = _paired(runs, "xccl_fr", "xccl")
        control = _paired(runs, "xccl_again", "xccl")
        q = statistics.quantiles(fr, n=4) if len(fr) > 1 else [fr[0]] * 3
        out["cases"][case] = {
            "median_us": med,
            "recorder_overhead_median": statistics.median(fr),
            "recorder_overhead_iqr": [q[0], q[2]],
            "aa_control_median": statistics.median(control),
        }
        print(f"{case:>17} {med['torch']:>6.1f} us {med['xccl']:>6.1f} us {med['xccl_fr']:>6.1f} us "
              f"{statistics.median(fr):>+9.1%} {f'{q[0]:+.1%}..{q[2]:+.1%}':>15} {statistics.median(control):>+7.1%}")
    if "hot" in launches[0]:
        out["calibration"] = _calibration(launches)
    return out


def _calibration(launches: list[dict[str, dict[str, list[float]]]]) -> dict[str, Any]:
    """The spinning variants' overheads, the line through the origin they fit (overhead per microsecond spun), and
    the recorder's cost in situ (its overhead over that slope) next to its cost in a hot loop."""
    out: dict[str, Any] = {}
    print("\nin situ (1 element): a hook that spins N us of wall time, against the recorder")
    print(f"{'case':>17} " + " ".join(f"{f'spin {us} us':>10}" for us in BURNS_US) + f" {'recorder':>10} {'= in situ':>10}")
    for case in (c for c in launches[0] if c.startswith("1 element")):
        runs = [launch[case] for launch in launches]
        spin = {us: statistics.median(_paired(runs, f"spin_{us}us", "xccl")) for us in BURNS_US}
        slope = sum(us * y for us, y in spin.items()) / sum(us * us for us in BURNS_US)
        fr = statistics.median(_paired(runs, "xccl_fr", "xccl"))
        in_situ = fr / slope if slope > 0 else float("nan")
        out[case] = {"spin_overhead": {str(us): y for us, y in spin.items()}, "overhead_per_us": slope,
                     "recorder_us_in_situ": in_situ}
        print(f"{case:>17} " + " ".join(f"{spin[us]:>+10.1%}" for us in BURNS_US) + f" {fr:>+10.1%} "
              f"{in_situ:>7.1f} us")
    hot = {k: statistics.median(launch["hot"][k][0] for launch in launches) for k in ("xccl", "xccl_fr")}
    out["hot_loop_us"] = hot
    out["recorder_us_hot"] = hot["xccl_fr"] - hot["xccl"]
    print(f"in a hot loop (kernel a no-op): xccl.all_reduce {hot['xccl']:.2f} us, with the recorder "
          f"{hot['xccl_fr']:.2f} us: the recorder {out['recorder_us_hot']:.2f} us")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=200, help="calls per round at 1 element (fewer at 1 MiB)")
    p.add_argument("--calibrate", action="store_true",
                   help="also spinning hooks of 1, 3, 6 us at 1 element: the recorder's cost in situ, in us")
    p.add_argument("--json", default="benchmarks/results/flight_recorder.json")
    p.add_argument("--quick", action="store_true", help="one launch, 2 rounds of a few calls, calibrated")
    args = p.parse_args()
    if args.quick:  # a smoke run: every path, the calibration's included
        args.launches, args.rounds, args.calls, args.calibrate = 1, 2, 5, True
    from xccl.testing import RankPool

    launches = []
    for _ in range(args.launches):
        # XCCL_TRACE=0: the ranks start with the recorder off; the body switches it per call.
        with RankPool(2, {"vendor": "cpu", "timeout": TIMEOUT}, env={"XCCL_TRACE": "0"}, start_method="spawn") as pool:
            launches.append(pool.run_ok(body_rounds, args.rounds, args.calls, args.calibrate, timeout=1800)[0])
    out = report(launches, args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
