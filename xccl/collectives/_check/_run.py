"""Check mode's path through dispatch: record the call, check the first call of its kind, watch the wait.

:func:`checked` replaces the kernel call of ``_dispatch.run`` when the detector is on:

1. raise a mismatch already found (on this group, or pending from another);
2. record the call (:mod:`._record`): a dict lookup, a ring slot, the step counter (nothing else: the rolling
   hash is computed later, by whoever reads the ring);
3. the *first* call of its kind on the group (a canonical fingerprint not seen there before) is compared with
   every member's before it is issued (:func:`~._preflight.preflight`): so a new shape or op, where most
   mismatches come from, is caught before any data moves (gloo kills a process that receives more bytes than
   it expects); every rank with the same history sees the same calls as new, so all of them take this path
   together;
4. issue the kernel asynchronously and wait in slices of 50 ms (:func:`watch`; a call that completes within the
   first slice, the common case, costs one ``wait`` as without the detector): a verdict reached by the background
   thread is raised from the wait, and a wait longer than the stall threshold is published for comparison;
5. a backend fault is first held against what the members published (:func:`explain`): a mismatch found
   within a second wins over the fault it caused.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Final, final

import torch.distributed as dist

from ...errors import CollectiveTimeout
from ...ops import _specs as S
from ...plugin._work import ForwardingWork
from .._faults import TYPED, classify, translate
from .._health._liveness import lost_peers
from .._state import DEFAULT_TIMEOUT, PROCESS, _bare
from . import _fingerprint as F
from ._detector import Detector
from ._preflight import behind, preflight, silent, store_fault
from ._record import CPMASK, DETECTOR, RMASK, Recorder, Stall, config

__all__ = ["CheckedWork", "checked", "hook", "watch"]

_monotonic: Final = time.monotonic
_PLANS: Final = F.PLANS
#: Seconds past the collective timeout after which a wait the backend never ends is given up.
_GRACE: Final = 5.0


def _start() -> Detector:
    world = PROCESS.world
    timeout = (world.timeout if world is not None else DEFAULT_TIMEOUT).total_seconds()
    rank = world.rank if world is not None else dist.get_rank()
    det = DETECTOR.channel = Detector(world, rank, config(timeout))
    return det


def checked(st: Any, inner: Any, spec: S.Spec, kargs: Sequence[Any], kernel: Any, async_op: bool) -> Any:
    """Run a call of ``spec`` on ``st`` with the detector on: the detector's stage of the group's pipeline, which
    issues the call through ``inner`` (the rest of the pipeline, ending in ``kernel``).

    Raises:
        CollectiveMismatch: this call, or an earlier one on a group of this rank, differs from a peer's.
        PeerFailure, CollectiveTimeout: as without the detector (a dead or silent peer is never a mismatch).
    """
    det = DETECTOR.channel
    if det is None:  # the first checked call of this world (shutdown resets the channel)
        if PROCESS.world is None or st.size == 1:  # nobody to compare with: no thread, no store traffic
            return inner(spec, kargs, kernel, async_op)
        try:
            det = _start()
        except RuntimeError as exc:  # the store (InitError, for bad settings, is not a RuntimeError)
            raise store_fault(exc, st.ranks[st.rank], str(st.name), spec.name, _monotonic()) from exc
    rec = det.recs.get(st)
    if rec is None:
        rec = det.recorder(st)
    if det.alarm and (rec.verdict is not None or det.pending is not None):
        raise det.error_for(rec)
    plan = _PLANS.get(id(spec))
    if plan is None or plan.spec is not spec:
        plan = F.plan_of(spec)
    if plan.p2p or rec.size == 1:
        return inner(spec, kargs, kernel, async_op)
    key = plan.key(kargs)
    fp = rec.fps.get(key)
    if fp is None:
        fp, novel = rec.intern(key, F.call_of(plan, rec.name, rec.size, kargs))
        seq = rec.record(fp)
        if novel:
            preflight(det, rec, seq, fp, spec.name, _monotonic())
    else:
        seq = rec.seq
        rec.ring[seq & RMASK] = fp
        rec.seq = seq + 1
        if not seq & CPMASK:
            det.wake.set()  # let the thread hash long before the ring laps
    return _issue(det, rec, spec, kargs, inner, kernel, seq, fp, async_op)


def _issue(det: Detector, rec: Recorder, spec: S.Spec, kargs: Sequence[Any], inner: Any, kernel: Any, seq: int,
           fp: F.Fp, async_op: bool) -> Any:
    """Issue the recorded call (always asynchronously) and, unless ``async_op``, wait for it, watched."""
    op = spec.name
    try:
        # Innermost (as it is, the last of OBSERVERS), the detector calls the kernel itself: a frame less.
        work = kernel(*kargs, True) if inner is _bare else inner(spec, kargs, kernel, True)
    except RuntimeError as exc:
        typed = explain(det, rec, seq, exc, op, _monotonic())
        if typed is exc:
            raise
        raise typed from exc
    if work is None or spec.fused:
        return work
    if async_op:
        return CheckedWork(det, rec, work, seq, fp, op, _monotonic())
    try:
        work.wait(det.piece)  # the common case: done within one slice, nothing else to do
        return None
    except RuntimeError:
        pass
    except TypeError:  # a handle whose wait() takes no timeout
        _finish(det, rec, work, seq, op, _monotonic())
        return None
    watch(det, rec, work, seq, fp, op, _monotonic() - det.cfg.slice)
    return None


class _Check:
    """The mismatch detector's hook of one group (innermost: it issues the call and watches the wait)."""

    __slots__ = ("st",)

    def __init__(self, st: Any) -> None:
        self.st = st

    def stage(self, inner: Any) -> Any:
        """Record, compare when new, issue, watch (:func:`checked` bound to the group: a Python frame less)."""
        return partial(checked, self.st, inner)


def hook(st: Any) -> _Check:
    """The detector's hook for a group with ``check`` on (``_hooks.OBSERVERS``)."""
    return _Check(st)


# ------------------------------------------------------------------------------------------------------ waiting


def watch(det: Detector, rec: Recorder, work: Any, seq: int, fp: F.Fp, op: str, started: float) -> None:
    """Wait for ``work`` in slices: raise a verdict as soon as one is reached, publish a stall, translate faults."""
    stall: Stall | None = None
    give_up = 0.0
    hurried = False
    try:
        while True:
            try:
                work.wait(det.piece)
                return
            except TypeError:  # a handle whose wait() takes no timeout: wait for it unwatched
                _finish(det, rec, work, seq, op, started)
                return
            except RuntimeError as exc:
                if work.is_completed() or classify(str(exc)) is not CollectiveTimeout:
                    _finish(det, rec, work, seq, op, started)
                    return
            # The slice ran out and the collective is still under way.
            if rec.verdict is not None or det.pending is not None:
                raise det.error_for(rec)
            cfg = det.cfg
            now = _monotonic()
            give_up = give_up or now + cfg.timeout + _GRACE
            if not hurried and now - started > cfg.stall / 4:
                hurried = True  # slow already: compare hashes now and often, before the stall threshold
                det.hurry(cfg.stall)
            if stall is None and now - started > cfg.stall:
                stall = Stall(seq, fp, det.next_sid())
                det.mark_stall(rec, stall)
            if now > give_up:
                raise silent(rec, seq, op, started, "the backend never gave up on it")
    finally:
        if stall is not None:
            det.clear_stall(rec)


def _finish(det: Detector, rec: Recorder, work: Any, seq: int, op: str, started: float) -> None:
    """The work completed (or failed) as a slice ran out: its own outcome, with faults explained."""
    try:
        work.wait()
    except RuntimeError as exc:
        typed = explain(det, rec, seq, exc, op, started)
        if typed is exc:
            raise
        raise typed from exc


def explain(det: Detector, rec: Recorder, seq: int, exc: RuntimeError, op: str, started: float) -> BaseException:
    """The error to raise for a backend fault in step ``seq``: a mismatch if one is found in time, else the
    typed fault (``exc`` itself when it is not one xccl knows)."""
    if rec.verdict is not None or det.pending is not None:
        return det.error_for(rec)
    kind = classify(str(exc))
    if kind is None:
        return exc
    # Let the background thread compare every member at this step now. A peer that called something else has
    # published it within an interval; a dead one never will, and then the fault stands as it is.
    rec.urgent = max(rec.urgent, seq)
    det.wake.set()
    deadline = _monotonic() + min(1.0, det.cfg.stall)
    while _monotonic() < deadline and rec.settled < seq and det.broken is None:
        if rec.verdict is not None or det.pending is not None:
            return det.error_for(rec)
        time.sleep(det.cfg.fast / 2)
    if rec.verdict is not None or det.pending is not None:
        return det.error_for(rec)
    rec.settled = max(rec.settled, seq)
    late = behind(rec, seq)
    if late and (kind is CollectiveTimeout or not _someone_gone(rec)):
        # A closed connection with no member gone is a peer that gave up on the same silent ranks a little sooner
        # (its timeout tore its connections down): the step's verdict, not a peer failure.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return silent(rec, seq, op, started, first, late)
    return translate(exc, rec.st, op, started)


def _someone_gone(rec: Recorder) -> bool:
    """Whether the liveness look finds a member of ``rec``'s group gone (True when xccl cannot look)."""
    verdict = lost_peers(list(rec.st.ranks))
    return verdict is None or bool(verdict.ranks)


# ---------------------------------------------------------------------------------------------- async handles


@final
class CheckedWork(ForwardingWork):
    """An asynchronous call's handle in check mode: ``wait()`` is watched like a synchronous call's wait (a
    verdict is raised from it, a stall is published) and raises typed faults."""

    __slots__ = ("_det", "_fp", "_op", "_rec", "_seq", "_started")

    def __init__(self, det: Detector, rec: Recorder, work: Any, seq: int, fp: F.Fp, op: str, started: float) -> None:
        super().__init__(work)
        self._det, self._rec, self._seq, self._fp, self._op, self._started = det, rec, seq, fp, op, started

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for completion; raises :class:`~xccl.CollectiveMismatch`, :class:`~xccl.PeerFailure` or
        :class:`~xccl.CollectiveTimeout`."""
        if timeout is None or timeout == _dt.timedelta(0):
            watch(self._det, self._rec, self.work, self._seq, self._fp, self._op, self._started)
            return True
        try:
            return bool(self.work.wait(timeout))
        except RuntimeError as exc:
            typed = explain(self._det, self._rec, self._seq, exc, self._op, self._started)
            if typed is exc:
                raise
            raise typed from exc

    def __repr__(self) -> str:
        return f"<xccl CheckedWork {self._op} #{self._seq} on group {self._rec.name!r}: {self.work!r}>"


TYPED.add(CheckedWork)  # its wait() is typed: the typed-faults hook hands it out as it is
