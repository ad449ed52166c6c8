"""The simulated device's stream: where a collective stuck on a lost peer waits, as it does on the vendor's device.

gloo tells a rank of a lost peer at once ("Connection closed by peer"); a device vendor does not. HCCL's
``WorkHCCL::wait`` only orders the current stream (Ascend/pytorch@462f4e1 ``ProcessGroupHCCL.cpp:996-1007``), so a
collective stuck on a dead peer reaches the host as EI0002 after ``HCCL_EXEC_TIMEOUT``, at a synchronisation; SCCL's
``wait()`` returns at once and nothing ever fails the collective (sophgo/torch-tpu@fe9b478
``ProcessGroupSCCL.cpp:168-191``; ``sccl.h`` has no timeout and no abort). So, for a vendor whose works complete on
a stream, a gloo failure that is not a timeout does not reach the host here either: the stream is stuck from that
collective on (``tests/test_sim_stream.py``). Whatever needs a value from it, or from any collective queued behind
it, waits until the vendor's execution timeout (then raises its error), forever where it has none, or until the
device's tasks are stopped (the vendor's abort: :meth:`SimStream.stop`, then its error). A collective issued behind a
stuck one never reaches the wire. A synchronisation (:meth:`SimStream.synchronize`) also waits for a collective that
a bounded wait gave up on while gloo still ran it (a far survivor's, which gloo has not failed: on the device it
waits for its peers like the others). A teardown that synchronises the stream (``ProcessGroupHCCL::shutdown``,
``:1386-1457``) waits the same way (:meth:`SimStream.synchronize`).

Where the simulation differs: it computes on the host, so the host waits where it needs a value (the work's
``wait``, its future) where the device's host would wait at its next synchronisation (``.item()``); one stream per
process stands for the device's streams (a stuck collective on any group holds the compute stream that every later
wait orders behind); a far rank's gloo wait is not released by :meth:`SimStream.stop` until its slice or gloo's
timeout (the vendor's execution timeout) ends it; ``xccl.shutdown`` resets the stream (a part of the process state)
before it destroys the groups, so its teardown does not wait for a stuck collective where the hardware's would
(``dist.destroy_process_group`` does).
"""

from __future__ import annotations

import datetime as _dt
import math
import threading
import time
from typing import Any, Final

import torch

from ..ops._parts import Part
from ._work import ForwardingWork, _thread_future

__all__ = ["STREAM", "SimStream", "StreamWork", "VendorWork", "simulated_stream"]

#: What c10d's ``Work::wait(timeout)`` raises when the timeout passes first (its whole text).
RAN_OUT: Final = "Operation timed out!"
_POLL: Final = 0.05


def _timed_out(exc: BaseException) -> bool:
    """Whether gloo's failure is a timeout (its own, or a wait's) rather than a lost peer."""
    low = str(exc).lower()
    return "timed out" in low or "timeout" in low


class SimStream(Part):
    """The process's simulated device stream, a part of the process state (``xccl.shutdown`` resets it).

    A stuck collective holds the stream: its place (a ticket), when the vendor fails it (``until``) and with what.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tickets = 0
        #: Moved on by :meth:`stop` and :meth:`reset`: a work issued before raises the abort's error.
        self._epoch = 0
        self._stuck: tuple[int, float, str] | None = None  # (ticket, until, error)
        self._stopped = False  # the device is stopped (until restart)
        self._abort = ""  # the last abort's error, for the works issued before it
        #: Works a bounded wait gave up on while gloo still ran them: still on the device until they end.
        self._pending: dict[int, StreamWork] = {}

    def issue(self) -> tuple[int, int]:
        """A new collective's place on the stream: (ticket, epoch)."""
        with self._cond:
            self._tickets += 1
            return self._tickets, self._epoch

    def held(self) -> bool:
        """Whether a collective issued now is queued behind a stuck one the vendor has not failed yet (or the device
        is stopped)."""
        stuck = self._stuck
        return self._stopped or (stuck is not None and time.monotonic() < stuck[1])

    def behind(self, ticket: int, issued: float) -> bool:
        """Whether the collective of ``ticket``, issued at ``issued``, is the stuck one or queued behind it: once the
        vendor fails the stuck collective, what is issued afterwards runs."""
        stuck = self._stuck
        return stuck is not None and ticket >= stuck[0] and issued < stuck[1]

    def failed(self) -> bool:
        """Whether the vendor has failed the stuck collective (its execution timeout passed)."""
        stuck = self._stuck
        return stuck is not None and time.monotonic() >= stuck[1]

    def stopped(self, epoch: int) -> str:
        """The abort's error for a work issued in ``epoch`` if the device's tasks were stopped since, else ``""``."""
        return (self._abort or _STOPPED) if epoch != self._epoch or self._stopped else ""

    def hold(self, ticket: int, since: float, exec_timeout: float, error: str) -> None:
        """The collective of ``ticket``, issued at ``since``, is stuck on a lost peer: the vendor fails it with
        ``error`` after ``exec_timeout`` seconds (:data:`math.inf`: never)."""
        with self._cond:
            stuck = self._stuck
            if stuck is None or ticket < stuck[0] or time.monotonic() >= stuck[1]:
                self._stuck = (ticket, since + exec_timeout, error)
            self._cond.notify_all()

    def wait(self, epoch: int, end: float | None) -> None:
        """Wait as the host of a work of ``epoch`` behind a stuck collective does: until the vendor fails it (its
        error), the device is stopped (the abort's) or ``end`` (``time.monotonic()``) passes (c10d's text)."""
        with self._cond:
            while True:
                stopped = self.stopped(epoch)
                if stopped:
                    raise RuntimeError(stopped)
                if self._stuck is None:
                    return
                now = time.monotonic()
                _, until, error = self._stuck
                if now >= until:
                    raise RuntimeError(error)
                if end is not None and now >= end:
                    raise RuntimeError(RAN_OUT)
                self._cond.wait(min(_POLL, until - now, math.inf if end is None else end - now))

    def pending(self, work: StreamWork, running: bool) -> None:
        """``work`` is still running after a wait gave up on it (``running``), or has ended."""
        if not running and work.ticket not in self._pending:
            return  # nearly every wait: nothing to forget, no lock taken
        with self._cond:
            if running and work.epoch != self._epoch:
                return  # issued before a stop (another thread's: the sentinel's verdict): off the device already
            if running:
                self._pending[work.ticket] = work
            else:
                self._pending.pop(work.ticket, None)

    def synchronize(self) -> None:
        """The device's synchronisation (``.item()``, a teardown that synchronises the stream), without a timeout:
        it waits for what is still running (a far survivor's collective, which gloo has not failed: on the device
        it waits for its peers like the rest) and for a stuck collective, until the vendor fails it (its error)."""
        with self._cond:
            running = [work for _, work in sorted(self._pending.items())]
        for work in running:
            work.settle()
        if self.held():
            self.wait(self._epoch, None)

    def stop(self, error: str) -> None:
        """The vendor's abort of the device's tasks (torch_npu's ``stop_device``): every work issued so far, stuck
        or not, raises ``error``, and so does every new one until :meth:`restart`."""
        with self._cond:
            self._epoch += 1
            self._stuck = None
            self._stopped, self._abort = True, error
            self._pending.clear()  # off the device: nothing is left to synchronise with
            self._cond.notify_all()

    def restart(self) -> None:
        """The device takes work again (torch_npu's ``restart_device``)."""
        with self._cond:
            self._stopped = False
            self._cond.notify_all()

    def reset(self) -> None:
        """Forget the stuck collective (``xccl.shutdown``: the next world starts on a clean device)."""
        with self._cond:
            self._epoch += 1
            self._stuck = None
            self._stopped, self._abort = False, ""
            self._pending.clear()
            self._cond.notify_all()


#: A work's wait on a stopped device, where the vendor's abort gave no text of its own.
_STOPPED: Final = "the device's tasks were stopped"
#: The process's simulated device stream.
STREAM: Final = Part.register(SimStream())


def simulated_stream() -> SimStream:
    """The process's simulated device stream: a simulated SDK's abort (``stop_device``) and restart act on it."""
    return STREAM


class VendorWork(ForwardingWork):
    """A simulated collective's handle: gloo's, with the vendor's execution-timeout text on failure."""

    __slots__ = ("_exec_error",)

    def __init__(self, work: Any, exec_error: str) -> None:
        super().__init__(work)
        self._exec_error = exec_error

    def _fault(self, exc: RuntimeError) -> BaseException:
        """A timeout fails with the vendor's text (``wait`` and ``synchronize``: the simulation computes on the host)."""
        if self._exec_error and _timed_out(exc):
            return RuntimeError(self._exec_error)
        return exc


class StreamWork(VendorWork):
    """A simulated collective's handle on the stream: gloo's outcome, unless the stream holds the collective.

    Args:
        work: gloo's work, or None for a collective queued behind a stuck one (it never reached the wire).
        exec_timeout: the vendor's execution timeout, seconds (:data:`math.inf`: none).
        exec_error: what the vendor fails a collective with when it runs out (``""``: gloo's own timeout text).
    """

    __slots__ = ("_epoch", "_exec_timeout", "_started", "_ticket")

    def __init__(self, work: Any, exec_timeout: float, exec_error: str) -> None:
        super().__init__(work, exec_error)
        self._exec_timeout = exec_timeout
        self._started = time.monotonic()
        self._ticket, self._epoch = STREAM.issue()

    @property
    def ticket(self) -> int:
        """Its place on the stream."""
        return self._ticket

    @property
    def epoch(self) -> int:
        """The stream's epoch when it was issued (a stop of the device's tasks begins a new one)."""
        return self._epoch

    def wait(self, timeout: Any = None) -> bool:
        """gloo's ``wait``; a lost peer holds the stream instead of reaching the host (see the module)."""
        end = None if not timeout else time.monotonic() + timeout.total_seconds()
        if self.work is not None and not STREAM.behind(self._ticket, self._started) and not STREAM.stopped(self._epoch):
            try:
                done = super().wait(timeout)
                STREAM.pending(self, False)
                return done
            except RuntimeError as exc:
                STREAM.pending(self, timeout is not None and _timed_out(exc))  # given up on, or gloo's timeout
                if _timed_out(exc) or STREAM.stopped(self._epoch):
                    raise
                self._hold()
        try:
            STREAM.wait(self._epoch, end)
        except RuntimeError as exc:
            error = self._fault(exc)
            if error is exc:
                raise
            raise error from exc
        return True

    def settle(self) -> None:
        """Wait for it as a device synchronisation does: until it ends, the vendor fails it at its execution timeout
        (its error), or the device is stopped."""
        left = self._started + self._exec_timeout - time.monotonic()
        try:
            self.wait(None if left == math.inf else _dt.timedelta(seconds=max(left, 0.001)))
        except RuntimeError as exc:
            if self._exec_error and str(exc).startswith(RAN_OUT):
                raise RuntimeError(self._exec_error) from exc
            raise

    def _hold(self) -> None:
        STREAM.hold(self._ticket, self._started, self._exec_timeout,
                    self._exec_error or f"{RAN_OUT} (the collective never completed: a peer was lost)")

    def is_completed(self) -> bool:
        """Whether the host would see it done: not while the stream holds it, until the vendor fails it."""
        if STREAM.stopped(self._epoch):
            return True
        if self.work is not None and not STREAM.behind(self._ticket, self._started):
            if not self.work.is_completed():
                return False
            try:
                self.work.wait()
                return True
            except RuntimeError as exc:
                if _timed_out(exc):
                    return True
                self._hold()
        return STREAM.failed()

    def is_success(self) -> bool:
        """Whether it finished without error."""
        return self.work is not None and not STREAM.behind(self._ticket, self._started) and super().is_success()

    def result(self) -> Any:
        """gloo's output tensors (none for a collective that never ran)."""
        return [] if self.work is None else self.work.result()

    def get_future(self) -> torch.futures.Future[Any]:
        """gloo's future while the stream runs; a lost peer's failure does not reach it: it fails with the vendor's
        error when the vendor fails the collective (never, without an execution timeout)."""
        if self.work is None:
            return _thread_future(self.wait, self.result)
        out: torch.futures.Future[Any] = torch.futures.Future()

        def done(fut: torch.futures.Future[Any]) -> None:
            try:
                value = fut.value()
                if not STREAM.behind(self._ticket, self._started):  # else queued behind a stuck one: held too
                    out.set_result(value)
                    return
            except RuntimeError as exc:
                if _timed_out(exc) or STREAM.stopped(self._epoch):
                    out.set_exception(self._fault(exc))
                    return
                self._hold()
            _thread_future(self.wait, self.result).add_done_callback(lambda f: _relay(f, out))

        self.work.get_future().add_done_callback(done)
        return out


def _relay(src: torch.futures.Future[Any], dst: torch.futures.Future[Any]) -> None:
    try:
        dst.set_result(src.value())
    except Exception as exc:  # the failure the held wait ended with
        dst.set_exception(exc)
