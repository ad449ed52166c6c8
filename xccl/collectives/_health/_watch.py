"""The health watch: a lost rank named on every survivor within a second, whatever the backend reports.

A backend tells a waiting rank of a lost peer only when that rank was talking to it. gloo's other waiters (a ring's
far side) hear nothing until the collective timeout; HCCL tells the host nothing until ``HCCL_EXEC_TIMEOUT`` and
SCCL never (``../shared/vendor-api/RUNTIME-AUDIT-3.md``). xccl's liveness ports answer in milliseconds whether a
process lives, independent of the backend (``_liveness``), so this hook does not wait for the backend to speak:

* a call is issued asynchronously and waited for in slices of :data:`_SLICE`; a call done within one, the common
  case, costs that one wait;
* the group's liveness is looked at (:func:`~._liveness.watch_look`) as soon as the sentinel hears of a loss (its
  alarm count moved, ``._sentinel``: a lost rank's neighbours read its reset connections as it dies), and
  otherwise past the *deadline* (``XCCL_HEALTH_DEADLINE`` seconds, 1 by default; 0 turns the watch off), again
  every deadline or a quarter of the time waited, whichever is longer: a legitimately long wait costs a look now
  and then, not one per slice; a lost host, whose kernel resets nothing, is found there;
* a look that finds a member gone, or finds the verdict another survivor published, raises
  :class:`~xccl.PeerFailure` naming the same ranks on every survivor, those that were not talking to the lost rank
  included; ``dist.shrink_group(err.ranks)`` can follow at once (docs/elastic.md). With it the vendor's abort of the
  device's tasks runs, where it has one (``Runtime.stop_device``): what else waits on the stuck collective returns;
  where the vendor's stuck collectives never return, the process ends itself a few seconds later unless it shut
  xccl down first (``._ending``).
  A look that finds every member alive marks nothing and keeps nothing: the call waits on, and a silent peer stays
  the backend's timeout;
* an asynchronous call's handle waits the same way (FSDP2's waits, DDP's end-of-backward wait through the typed
  faults' final callback); a wait given its own timeout keeps it;
* a call on a group whose verdict this process already holds raises it at once, before it communicates.

The watch is a hook of the groups whose waits block the host, the groups that compute on it (cpu, and every
simulated vendor: gloo moves their bytes). A device vendor's ``wait()`` orders a stream and returns; a wait with a
timeout means something else there (NCCL's blocks the host, and marks the work failed when it runs out). Such a
group's calls only check for a loss already known (:class:`_Known`): the sentinel's own look finds it, and stops the
device or arms the end, with no call of xccl's waiting (``._sentinel``). A group of one rank, or of a fake world,
has no watch: nobody to lose.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from ...ops._settings import seconds
from ...plugin._fake_world import transport
from ...plugin._work import ForwardingWork
from .._faults import watched_loss
from ._ending import at_verdict
from ._liveness import alarms, known_loss, watch_look

__all__ = ["DEFAULT_DEADLINE", "ENV", "IN_THREAD", "Watched", "deadline", "hook"]

#: Seconds a call waits before its group's liveness is looked at, unless ``XCCL_HEALTH_DEADLINE`` says otherwise.
DEFAULT_DEADLINE: Final = 1.0
ENV: Final = "XCCL_HEALTH_DEADLINE"
#: How long each slice of a wait is, at most: between two, the sentinel's alarm count is read (``_sentinel``).
_SLICE: Final = 0.1
#: The calls whose gloo work cannot be waited for in slices, so a thread of its own waits for it without a timeout
#: and the call waits, in slices, for that thread (``tests/test_health.py`` checks both facts on the installed torch):
#: gloo's reduce-scatters ignore ``wait(timeout)`` (torch 2.13 runs the whole collective in the waiting thread, and
#: the work is not complete until someone waits); a point-to-point work's timeout that runs out closes the pair
#: ("Application timeout caused pair closure"), so the peer's send fails as if this rank had died.
IN_THREAD: Final = frozenset({"reduce_scatter", "reduce_scatter_tensor", "send", "recv", "isend", "irecv"})
#: What c10d's ``Work::wait(timeout)`` raises when the timeout passes first (``Work.cpp``; its text is the whole message).
_RAN_OUT: Final = "Operation timed out!"
_monotonic: Final = time.monotonic


def deadline() -> float:
    """The deadline in seconds (0: no watch), from ``XCCL_HEALTH_DEADLINE``.

    Raises:
        InitError: the variable is not a number of seconds >= 0 (``xccl.init`` asks first, so a bad value fails
            there).
    """
    return seconds(ENV, DEFAULT_DEADLINE, zero="turns the health watch off")


def _ran_out(exc: BaseException | None) -> bool:
    """Whether ``exc`` is c10d's ``Work::wait(timeout)`` giving up on a work still under way, or a simulated
    vendor's rewording of it (chained). Not asked of the work: ``Work.exception()`` is deprecated in torch 2.13 and
    warns, and SCCL's simulated ``is_completed()`` waits for a data op."""
    while exc is not None:
        if str(exc).startswith(_RAN_OUT):
            return True
        exc = exc.__cause__
    return False


def _raise_known(st: Any, key: tuple[int, ...], op: str, started: float) -> None:
    """Raise the loss this process already knows of in the group ``st`` (sorted global ranks ``key``), before the
    call communicates (it would never complete), running the vendor's abort or the end as a verdict does: the
    sentinel's look, on its thread, may have found it."""
    known = known_loss(key)
    if known is not None:
        at_verdict(st.runtime, st.ranks[st.rank], known.ranks)
        raise watched_loss(known, st, op, started)


class _Slice(Exception):
    """A slice of a watched wait ran out with the work still under way."""


class Watched(ForwardingWork):
    """A call's handle whose waits are watched: the blocking path waits on it, an asynchronous call returns it.

    Args:
        work: the backend's handle.
        st: the group's state.
        op: the public collective's name.
        started: ``time.monotonic()`` at the call.
        limit: the deadline, seconds.
        heard: the sentinel's alarm count at the call (:func:`~._liveness.alarms`).
    """

    __slots__ = ("_alarms", "_done", "_error", "_limit", "_look_at", "_op", "_st", "_started", "_threaded")

    def __init__(self, work: Any, st: Any, op: str, started: float, limit: float, heard: int) -> None:
        super().__init__(work)
        self._st, self._op, self._started, self._limit, self._alarms = st, op, started, limit, heard
        self._look_at = started + limit
        self._threaded = op in IN_THREAD
        self._done: threading.Event | None = None
        self._error: BaseException | None = None

    def _until(self, seconds: float) -> bool:
        """The work's outcome if it ends within ``seconds``; else :class:`_Slice`."""
        work = self.work
        if not self._threaded:
            try:
                return bool(work.wait(_dt.timedelta(seconds=max(seconds, 0.001))))  # 0 would be "no timeout"
            except RuntimeError as exc:
                if _ran_out(exc):
                    raise _Slice from None
                raise  # the backend's outcome
        if self._done is None:
            self._done = threading.Event()
            threading.Thread(target=self._wait_in_thread, name="xccl-health-wait", daemon=True).start()
        if not self._done.wait(seconds):
            raise _Slice
        if self._error is not None:
            raise self._error
        return True

    def _wait_in_thread(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:  # the backend's outcome, raised by the caller's wait
            self._error = exc
        finally:
            assert self._done is not None
            self._done.set()

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """``Work.wait``, watched past the deadline or at an alarm; a ``timeout`` of the caller's fails as the
        backend's would.

        Raises:
            PeerFailure: a look found a member gone, or adopted the verdict another survivor published.
        """
        work = self.work
        end = None if not timeout else _monotonic() + timeout.total_seconds()
        while True:
            now, heard = _monotonic(), alarms()
            # First: the blocking path's first wait may have spent the deadline, or heard the alarm, already.
            if now >= self._look_at or heard != self._alarms:
                self._alarms = heard
                verdict = watch_look(self._st.ranks)
                if verdict is not None:
                    st = self._st  # the vendor's abort, where it has one, else the end where nothing ever returns
                    at_verdict(st.runtime, st.ranks[st.rank], verdict.ranks)
                    raise watched_loss(verdict, self._st, self._op, self._started)
                now = _monotonic()
                self._look_at = max(self._look_at, now + max(self._limit, (now - self._started) / 4))
            stop = min(self._look_at, now + _SLICE)
            if end is not None:
                stop = min(stop, end)
            try:
                return self._until(stop - now)
            except TypeError:  # a handle whose wait() takes no timeout: waited for as it is
                return bool(work.wait() if timeout is None else work.wait(timeout))
            except _Slice:
                if end is not None and _monotonic() >= end:
                    raise RuntimeError(_RAN_OUT) from None  # as the backend's own wait says it


class _Watch:
    """The health watch's hook of one group (innermost: it issues the call and waits for it), for its calls and for
    an emulation's building blocks alike (a block that waits unwatched would hide the loss it waits on)."""

    __slots__ = ("first", "limit", "st")

    def __init__(self, st: Any, limit: float) -> None:
        self.st, self.limit, self.first = st, limit, _dt.timedelta(seconds=min(limit, _SLICE))

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Issue asynchronously; a blocking call waits here, an asynchronous one hands out a watched handle. A call
        on a group already found to have lost ranks raises at once, before it communicates."""
        st, limit, first, key = self.st, self.limit, self.first, tuple(sorted(self.st.ranks))

        def watched(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            if spec.fused:  # a fused op returns its output, not a work to wait for
                return inner(spec, kargs, kernel, async_op)
            started, heard = _monotonic(), alarms()
            _raise_known(st, key, spec.name, started)
            work = inner(spec, kargs, kernel, True)
            if work is None:
                return None
            if not async_op and spec.name not in IN_THREAD:
                try:
                    work.wait(first)  # the common case: done within a slice
                    return None
                except (RuntimeError, TypeError):
                    pass  # still under way, failed, or a wait() without a timeout: the watched wait sorts it out
            handle = Watched(work, st, spec.name, started, limit, heard)
            if async_op:
                return handle
            handle.wait()
            return None

        return watched

    inner_stage = stage


class _Known:
    """The watch of a group whose waits do not block the host (a device vendor's on its hardware): nothing to wait
    on, but a call on a group whose lost ranks the sentinel's look already found raises it before it communicates
    (it would never complete) and runs the vendor's abort or the end, as a watched wait's verdict does."""

    __slots__ = ("st",)

    def __init__(self, st: Any) -> None:
        self.st = st

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        st, key = self.st, tuple(sorted(self.st.ranks))

        def checked(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            _raise_known(st, key, spec.name, _monotonic())
            return inner(spec, kargs, kernel, async_op)

        return checked

    inner_stage = stage


def hook(st: Any) -> _Watch | _Known | None:
    """The health watch of a group of more than one rank (``_hooks.OBSERVERS``): a watch of its waits where they
    block the host (cpu, the simulated vendors), else the check of a loss already known."""
    limit = deadline()
    if st.size == 1 or limit == 0 or not transport().waits:
        return None
    return _Watch(st, limit) if st.device_type == "cpu" else _Known(st)
