"""``xccl bench``'s measurement, made to hold up on a noisy machine shared with other work.

* **Interleaved rounds.** Every round calls each variant once (xccl; with ``compare_raw`` the raw call; with
  ``control`` the raw call again), in an order that cycles through every permutation, so that each variant is as
  often first, last and after each other one: a burst of load from elsewhere falls on every variant alike.
* **The slowest rank's time.** Each rank times every call; per call the maximum over ranks is kept.
* **Paired ratios.** ``ratio`` is the median over rounds of raw's time over xccl's in the same round (xccl's busbw
  over raw's), with a distribution-free 95% confidence interval of that median and the interquartile range of the
  per-round ratios. Back-to-back calls share the machine's state, so their ratio cancels slow drifts better than
  a ratio of two medians.
* **An A/A control.** With ``control`` the raw call runs twice per round and the same ratio is taken between the
  two: it would be exactly 1 on a quiet machine, and how far it strays (and how wide its interval is) is the noise
  any other ratio of the run has to be read against.
* **Passes, calls as a step issues them, rounds by time** (``passes``, ``gap_us``, ``time_per_size``): as
  docs/cli.md (``xccl bench``) says. The rounds a size gets come from the lower quartile of the warm-up calls'
  times (a burst of load during the warm-up does not cut them short), the slowest rank's, so every rank runs the
  same.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

import torch

import xccl

from ..collectives._groups import state_of as context
from ._bench_config import COLLECTIVE, DTYPES, BenchConfig, busbw_factor, human_size, sweep_sizes
from ._bench_ops import Case, build_case
from ._bench_report import format_row, print_header, summarize, summary_lines

__all__ = ["median_ci", "paired", "plan_rounds", "run_op"]

#: Ops that move no data: one row, no size sweep.
_NO_DATA: Final = frozenset({"barrier", "monitored_barrier"})


@dataclass
class Progress:
    """A one-line counter on stderr, redrawn at most 5 times a second and cleared before table rows."""

    stream: TextIO | None
    last: float = 0.0
    width: int = 0

    def show(self, text: str) -> None:
        now = time.monotonic()
        if self.stream is None or now - self.last < 0.2:
            return
        self.last = now
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def clear(self) -> None:
        if self.stream is not None and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


def _time(fn: Callable[[], Any], batch: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / batch


def _pause(seconds: float, *, busy: bool) -> None:
    """Idle for ``seconds`` (the process sleeps), or with ``busy`` keep this core computing as a step's forward
    pass would (the communicator's threads then compete with it for the cores)."""
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def agree(ok: bool, device: torch.device) -> bool:
    """True only if ``ok`` on every rank (a MAX over 'failed' flags)."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    xccl.all_reduce(flag, xccl.ReduceOp.MAX)
    return flag.item() == 0.0


def slowest(samples: list[list[float]], device: torch.device) -> list[list[float]]:
    """Per call, the maximum over ranks of each rank's time."""
    # float32: every backend reduces it (float64 is not on every accelerator's list), and 7 digits are plenty.
    t = torch.tensor(samples, dtype=torch.float32, device=device)
    xccl.all_reduce(t, xccl.ReduceOp.MAX)
    return [[float(x) for x in row] for row in t.cpu().tolist()]


# ------------------------------------------------------------------------------------------------- statistics


def median_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free confidence interval of the median (95% for ``z=1.96``), from order statistics.

    The ranks ``n/2 -+ z*sqrt(n)/2`` of the sorted values (the normal approximation of the binomial): no
    assumption on the shape of the noise, which on a shared machine is anything but normal.
    """
    xs = sorted(values)
    n = len(xs)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return xs[lo], xs[hi]


def _quartiles(values: Sequence[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def paired(base: Sequence[float], other: Sequence[float]) -> dict[str, Any]:
    """The median over rounds of ``base / other`` (raw's time over xccl's: xccl's busbw over raw's), its 95%
    confidence interval and the interquartile range of the per-round ratios."""
    ratios = [b / o for b, o in zip(base, other, strict=True) if o > 0]
    if not ratios:
        return {"ratio": None, "ratio_ci": None, "ratio_iqr": None}
    return {"ratio": statistics.median(ratios), "ratio_ci": list(median_ci(ratios)), "ratio_iqr": _quartiles(ratios)}


def _variant(op: str, size: int, n: int, seconds: Sequence[float]) -> dict[str, Any]:
    t = statistics.median(seconds)
    algbw = size / t / 1e9 if t > 0 else 0.0
    return {
        "time_us": t * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * busbw_factor(op, n),
        "iqr_us": [x * 1e6 for x in _quartiles(seconds)],
        "samples_us": [x * 1e6 for x in seconds],
    }


def plan_rounds(cfg: BenchConfig, per_call_s: float, variants: int) -> int:
    """Rounds for one size: ``cfg.iters``, or with ``time_per_size`` what fits in it (``min_iters`` to ``iters``)."""
    if cfg.time_per_size <= 0:
        return cfg.iters
    fits = int(cfg.time_per_size / (variants * max(per_call_s, 1e-7)))
    return max(min(cfg.iters, cfg.min_iters), min(cfg.iters, fits))


# ------------------------------------------------------------------------------------------------ measuring


class _Sampler:
    """One size of one op: its variants, the rounds it will run, and the samples so far (this rank's times)."""

    def __init__(self, k: int, case: Case, variants: list[Callable[[], Any]], cfg: BenchConfig) -> None:
        self.k, self.case, self.variants, self.cfg = k, case, variants, cfg
        self.samples: list[list[float]] = [[] for _ in variants]
        self.rounds = cfg.iters
        self.done = 0
        # Every permutation in turn: each variant equally often first, last and after each other one.
        self.orders = list(itertools.permutations(range(len(variants))))

    def warm(self, device: torch.device) -> None:
        """The warm-up calls, and with ``time_per_size`` the rounds this size gets (agreed by every rank)."""
        cfg = self.cfg
        if cfg.time_per_size <= 0:
            for _ in range(cfg.warmup):
                for fn in self.variants:
                    fn()
            return
        times = [_time(fn, 1, device) for _ in range(max(1, cfg.warmup)) for fn in self.variants]
        # The lower quartile: a burst of load during the warm-up would otherwise cut this size's rounds short.
        est = torch.tensor([_quartiles(times)[0]], dtype=torch.float32, device=device)
        xccl.all_reduce(est, xccl.ReduceOp.MAX)
        self.rounds = plan_rounds(cfg, float(est.item()), len(self.variants))

    def advance(self, rounds: int, device: torch.device, tick: Callable[[int, int], None]) -> None:
        """Run up to ``rounds`` more rounds (fewer when this size has no more to run)."""
        gap = self.cfg.gap_us * 1e-6
        for _ in range(min(rounds, self.rounds - self.done)):
            for v in self.orders[self.done % len(self.orders)]:
                if gap > 0:  # as a step issues it: every rank together, after a gap (BenchConfig.gap_us)
                    xccl.barrier()
                    _pause(gap, busy=self.cfg.gap_busy)
                self.samples[v].append(_time(self.variants[v], self.cfg.batch, device))
            self.done += 1
            tick(self.done, self.rounds)

    def row(self, op: str, n: int, device: torch.device) -> dict[str, Any]:
        """The row of results: per variant the median of the slowest rank's times, the paired ratios."""
        case = self.case
        slow = slowest(self.samples, device)
        row: dict[str, Any] = {"size": case.size, "count": case.count, "rounds": self.done}
        row["xccl"] = _variant(op, case.size, n, slow[0])
        if len(slow) > 1:
            row["raw"] = _variant(op, case.size, n, slow[1])
            row.update(paired(slow[1], slow[0]))
        if len(slow) > 2:
            row["control"] = _variant(op, case.size, n, slow[2]) | paired(slow[1], slow[2])
        return row


def _try_raw(case: Case, device: torch.device) -> str:
    """Call the raw variant once; ``""`` when it ran on every rank, else why not (the same on every rank)."""
    why = ""
    try:
        if case.raw is None:
            why = "no torch.distributed equivalent"
        else:
            case.raw()
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not agree(not why, device):
        return why or "it failed on another rank"
    return ""


def run_op(
    op: str, cfg: BenchConfig, n: int, rank: int, device: torch.device, out: TextIO | None, progress: Progress,
    raw_group: Any = None,
) -> dict[str, Any]:
    """Run the sweep of one op on this rank; rank 0 prints rows as they complete (in the last pass)."""
    dtype = DTYPES[cfg.dtype]
    coll = COLLECTIVE[op]
    table = context(None).table
    shape: dict[str, Any] = {"dtype": dtype if op not in _NO_DATA else None,
                             "reduce_op": "sum" if coll.reduces else None, "world_size": n}
    res = table.resolve(coll, **shape)
    via = res.via
    bounds = table.size_bounds(coll, world_size=n)
    if bounds:
        # A composition preferred at some sizes only (cpu: reduce_scatter via all_to_all from 1 MiB): say which.
        parts = []
        for lo, hi in zip((0, *bounds), (*bounds, None), strict=True):
            how = table.resolve(coll, nbytes=lo, **shape).via
            if how:
                span = f"from {human_size(lo)}" if hi is None else f"{human_size(lo)} to {human_size(hi)}"
                parts.append(f"{how} {span}" if lo or hi is not None else how)
        via = ", ".join(parts) + (" (the native kernel elsewhere)" if parts else "")
    result: dict[str, Any] = {
        "op": op,
        "level": res.level.value,
        "via": via,
        "busbw_factor": busbw_factor(op, n),
        "raw": None,
        "raw_unavailable": None,
        # Which group xccl's calls run on: the raw calls' ("raw": one communicator for both) or its world.
        "xccl_group": "world",
        "error": None,
        "rows": [],
    }
    sizes = [0] if op in _NO_DATA else sweep_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)

    def finish(s: _Sampler) -> None:
        row = s.row(op, n, device)
        result["rows"].append(row)
        if out is not None:
            progress.clear()
            out.write(format_row(row, cfg.dtype) + "\n")
            out.flush()

    def ticker(s: _Sampler, p: int) -> Callable[[int, int], None]:
        where = f"pass {p + 1}/{cfg.passes}, " if cfg.passes > 1 else ""
        head = f"[xccl bench] {op}: {where}size {s.k + 1}/{len(sizes)} ({human_size(s.case.size)})"
        return lambda i, total: progress.show(f"{head}, round {i}/{total}")

    # p2p staged through host memory needs the host-side group that only xccl's own groups carry.
    if cfg.compare_raw and cfg.same_group and raw_group is not None and res.via != "host_gloo":
        result["xccl_group"] = "raw"
    xccl_group = raw_group if result["xccl_group"] == "raw" else None
    checked = _checked(op, sizes, dtype, cfg, n, rank, device, out, result, raw_group, xccl_group)
    if cfg.passes == 1:  # one size at a time: only its buffers are alive
        for s in checked:
            s.warm(device)
            s.advance(s.rounds, device, ticker(s, 0))
            finish(s)
    else:
        samplers = list(checked)
        for p in range(cfg.passes):
            for s in samplers:
                if p == 0:
                    s.warm(device)
                # This pass's share of the rounds: the passes split them as evenly as integers allow.
                share = (p + 1) * s.rounds // cfg.passes - p * s.rounds // cfg.passes
                s.advance(share, device, ticker(s, p))
        for s in samplers:
            finish(s)
    summary = summarize(result["rows"])
    if summary is not None:
        result["summary"] = summary
        if out is not None and len(result["rows"]) > 1:
            out.write("\n".join(summary_lines(summary)) + "\n")
    if out is not None and result["error"]:
        progress.clear()
        out.write(f"# {op}: {result['error']}\n")
    return result


def _checked(
    op: str, sizes: list[int], dtype: torch.dtype, cfg: BenchConfig, n: int, rank: int, device: torch.device,
    out: TextIO | None, result: dict[str, Any], raw_group: Any, xccl_group: Any,
) -> Iterator[_Sampler]:
    """Each size's case, after one call that checks it runs (and on the first, that the raw call runs too).

    Stops at the first size xccl refuses (recorded in ``result["error"]``); prints the header before the first.
    """
    use_raw, first = cfg.compare_raw, True
    seen: set[int] = set()
    for k, nbytes in enumerate(sizes):
        case = build_case(op, nbytes, dtype, n, rank, device, raw_group, xccl_group)
        if case.size in seen:
            continue  # small sizes that round to the same buffer
        seen.add(case.size)
        try:
            case.run()
        except xccl.XcclError as exc:
            # Dispatch refuses before communicating, identically on every rank.
            result["error"] = f"{type(exc).__name__}: {exc}"
            return
        if first:
            first = False
            if cfg.compare_raw:
                result["raw"] = case.raw_name
                why = _try_raw(case, device)
                if why:
                    result["raw_unavailable"], use_raw = why, False
            if out is not None:
                print_header(out, op, result, cfg)
        variants: list[Callable[[], Any]] = [case.run]
        if use_raw and case.raw is not None:
            # The A/A control is the very same raw call a second time.
            variants += [case.raw] * (2 if cfg.control else 1)
        yield _Sampler(k, case, variants, cfg)
