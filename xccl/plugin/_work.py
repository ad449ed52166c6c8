"""Work handles for composed collectives.

Native collectives return the backend's own ``Work``. An emulation may chain several collectives and a local step
(a divide, a copy back from a cast buffer); its handle waits for the inner works, then runs that step once.

:class:`Work` subclasses ``torch.distributed.Work``, so xccl's c10d process group can hand it to torch (whose
wrappers call ``wait()`` on it) and to C++ callers (DDP's reducer asks for ``get_future()``, functional
collectives ``wait()`` through ``wait_tensor``) through the pybind trampoline.

Its future (:meth:`Work.get_future`) holds what the native work's would, so a DDP communication hook's
``fut.value()[0]`` is the reduced bucket; the local step then runs in whichever thread completes the inner works
(the backend's, for gloo), exactly once whoever gets there first.

The simulated vendor's works are here too: what :func:`complete` makes of gloo's for a vendor whose works complete
at once.
"""

from __future__ import annotations

import datetime as _dt
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ._vendor_runtime import Completion

__all__ = ["ForwardingWork", "Work", "complete", "finish", "future_of"]


@final
class Work(dist.Work):
    """A ``torch.distributed.Work`` for emulated collectives.

    Args:
        works: inner handles to wait for (may be empty: the emulation already ran).
        then: a local step run once, after every inner handle completed.
        result: tensors returned by :meth:`result`.
    """

    __slots__ = ("_done", "_error", "_lock", "_result", "_then", "_works")

    def __init__(
        self, works: Sequence[Any] = (), then: Callable[[], object] | None = None, result: Sequence[torch.Tensor] = ()
    ) -> None:
        super().__init__()
        self._works = [w for w in works if w is not None]
        self._then = then
        self._done = False
        self._result = list(result)
        #: A failure seen while polling, raised again by wait().
        self._error: BaseException | None = None
        # Guards the local step, which the caller's thread (wait) and a future's callback may both reach.
        self._lock = threading.Lock()

    def set_result(self, tensors: Sequence[torch.Tensor]) -> Work:
        """Set the output tensors :meth:`result` and the future hold (dispatch does, for every composed op)."""
        self._result = list(tensors)
        return self

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for the inner works, then run the local step. Returns True."""
        if self._error is not None:
            raise self._error
        if not self._done:
            # Never wait while holding the lock: the backend may complete a future (whose callback runs the step
            # below, under the lock) before it marks its work complete, which is what this wait waits for.
            for w in self._works:
                if timeout is None:
                    w.wait()
                else:
                    w.wait(timeout)
            self._finish()
        return True

    def _finish(self) -> None:
        """Run the local step once (every inner work has completed)."""
        with self._lock:
            if self._done:
                return
            if self._then is not None:
                _below_autograd(self._then)
            self._done = True

    def synchronize(self) -> None:
        """``Work.synchronize``: the local step runs on the host, so this waits (see :meth:`wait`)."""
        self.wait()

    def is_completed(self) -> bool:
        """Whether the collective finished; polling alone completes it (once every inner handle has, the local step
        runs here), so that ``while not work.is_completed()`` does not spin forever."""
        if not self._done and self._error is None and all(w.is_completed() for w in self._works):
            try:
                self.wait()
            except Exception as exc:  # like torch's, is_completed reports a failure; wait() raises it
                self._error = exc
        return self._done or self._error is not None

    def is_success(self) -> bool:
        """Whether it finished without error."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The failure seen while polling :meth:`is_completed`, if any (:meth:`wait` raises it)."""
        return self._error

    def result(self) -> list[torch.Tensor]:
        """The output tensors (after :meth:`wait`)."""
        return self._result

    def source_rank(self) -> int:
        """The sender of a receive from any source (the group rank the inner receive reports)."""
        for w in self._works:
            return int(w._source_rank() if hasattr(w, "_source_rank") else w.source_rank())
        raise RuntimeError("this work is not a receive from any source")

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future of :meth:`result`, returned at once and completed, as a native work's, once the collective is
        (every inner work and the local step), or failed with its error."""
        if self._done or self._error is not None or not self._works:
            fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
            try:
                self.wait()
                fut.set_result(self._result)
            except Exception as exc:  # the future carries the failure, as a backend's does
                fut.set_exception(exc)  # type: ignore[arg-type]  # torch's stub types it as the result
            return fut
        inner = _futures(self._works)
        if inner is None:  # gloo's reduce_scatter: a thread waits for them (each bounded by its group's timeout)
            return _thread_future(self.wait, self.result)
        return torch.futures.collect_all(inner).then(self._completed)

    def _completed(self, inner: torch.futures.Future[Any]) -> list[torch.Tensor]:
        for f in inner.value():
            f.value()  # raises an inner failure, which fails the returned future
        self._finish()
        return self._result


def _futures(works: Sequence[Any]) -> list[torch.futures.Future[Any]] | None:
    """The inner works' futures, or None if one of them has none."""
    futures = []
    for w in works:
        try:
            futures.append(w.get_future())
        except RuntimeError:  # "Work::getFuture not implemented" (gloo's reduce_scatter, some vendors' works)
            return None
    return futures


def future_of(work: Any, kargs: Sequence[Any] = ()) -> torch.futures.Future[Any]:
    """``work.get_future()``, or, for a backend's work that has none (gloo's reduce_scatter, and so what the
    simulation runs in place of torch_npu's WorkHCCL, which has one), a future completed by a thread that waits for
    the work (bounded by its group's timeout), with the work's result or else the call's tensors (``kargs``, the
    kernel's arguments: its tensors, as a native future's list holds the op's outputs first)."""
    try:
        return work.get_future()  # type: ignore[no-any-return]
    except RuntimeError as exc:
        if "not implemented" not in str(exc):
            raise

    def result() -> Any:
        try:
            value = work.result()
        except RuntimeError:  # "Work::result not implemented"
            value = None
        return value or [t for t in kargs if isinstance(t, torch.Tensor)]

    return _thread_future(work.wait, result)


def _thread_future(wait: Callable[[], object], result: Callable[[], Any]) -> torch.futures.Future[Any]:
    """A future of ``result()`` that a thread completes after ``wait()`` returns (or fails with what it raised)."""
    fut: torch.futures.Future[Any] = torch.futures.Future()

    def complete() -> None:
        try:
            wait()
            fut.set_result(result())
        except Exception as exc:  # the future carries the failure, as a backend's does
            fut.set_exception(exc)

    threading.Thread(target=complete, name="xccl-work-future", daemon=True).start()
    return fut


def finish(work: Any, async_op: bool, then: Callable[[], object] | None = None) -> Any:
    """Complete a composed collective: run ``then`` now (sync) or hand back a :class:`Work` that runs it on
    ``wait`` (async). ``work`` is the inner collective's handle, or None when it already completed."""
    if async_op:
        return Work([work], then)  # a None work is dropped
    if work is not None:
        work.wait()
    if then is not None:
        _below_autograd(then)
    return None


def _below_autograd(step: Callable[[], object]) -> None:
    """Run a composed collective's local step (a copy into the user's tensor, a local reduction) as a native
    kernel writes its output: below autograd. The user's tensor may be a leaf that requires grad (the receive
    buffers of torch.distributed.pipelining's stages are), which autograd refuses to see written in place; grad
    mode is per thread, and the step may run in the backend's."""
    with torch.no_grad():
        step()


class ForwardingWork(dist.Work):
    """A ``torch.distributed.Work`` that forwards its interface to the backend's handle ``work``.

    Subclasses decide how ``wait`` reports a fault (:meth:`_fault`: the typed faults' ``TypedWork``, a simulated
    vendor's text) or how it waits (the mismatch detector's handle, the health watch's); everything else is the
    backend's.
    """

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        super().__init__()
        #: The backend's own handle.
        self.work: Final = work

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """The backend's ``wait``; a failure is raised as :meth:`_fault` makes it."""
        try:
            return bool(self.work.wait() if timeout is None else self.work.wait(timeout))
        except RuntimeError as exc:
            error = self._fault(exc)
            if error is exc:
                raise
            raise error from exc

    def synchronize(self) -> None:
        """As :meth:`wait`: the host waits."""
        self.wait()

    def _fault(self, exc: RuntimeError) -> BaseException:
        """What a backend failure in :meth:`wait` is raised as (``exc`` itself: the backend's)."""
        return exc

    def is_completed(self) -> bool:
        """Whether the collective finished (successfully or not)."""
        return bool(self.work.is_completed())

    def is_success(self) -> bool:
        """Whether it finished without error."""
        return bool(self.work.is_success())

    def exception(self) -> Any:
        """The backend's exception, if it failed (untranslated, as ``Work.exception`` gives it)."""
        return self.work.exception()

    def result(self) -> Any:
        """The output tensors."""
        return self.work.result()

    def source_rank(self) -> int:
        """The group rank of the sender of a ``recv`` from any source."""
        work = self.work
        return int(work._source_rank() if hasattr(work, "_source_rank") else work.source_rank())

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def get_future(self) -> Any:
        """The backend's future (its errors are the backend's own: ``wait()`` is the typed path)."""
        return self.work.get_future()

    def __getattr__(self, name: str) -> Any:
        # Vendor extras are the backend handle's. What torch's Work defines itself (``boxed``...) applies to this
        # handle, so that a boxed handle still waits with typed faults.
        if name == "work":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.work, name)


def complete(completion: Completion, key: str, work: Any) -> Any:
    """The work the simulated vendor returns for ``work``, gloo's work of c10d method ``key``: itself, but for a
    vendor whose ``Work.wait()`` returns at once (:attr:`Completion.AT_ONCE`).

    ProcessGroupSCCL's ``WorkSCCL::isCompleted()`` and ``wait()`` return true at once, for every op, barrier
    included (sophgo/torch-tpu@fe9b478 ``ProcessGroupSCCL.cpp:183-191``; its barrier is an all_reduce of an
    uninitialised float, ``:745-782``); the device's stream orders what comes after, and a copy to the host
    synchronises it first (``TPUDeviceManager.cpp:413-431``), so data reads are right while nothing orders the
    *host* (docs/fidelity.md). In simulation a barrier's work is complete at once while gloo finishes it in the
    background (host code ordered by a barrier fails as on the TPUs); a data op's ``wait()`` and ``is_completed()``
    still wait for gloo's values.

    Args:
        completion: the vendor's :class:`Completion`.
        key: the c10d ``Backend`` method (``"barrier"``, ``"allreduce"``, ...).
        work: gloo's work.
    """
    if completion is not Completion.AT_ONCE or work is None:
        return work
    return _AtOnce(work, barrier=key == "barrier")


@final
class _AtOnce(dist.Work):
    """A work that reports itself complete at once; a barrier's also returns from ``wait()`` at once."""

    __slots__ = ("_barrier", "_error", "_inner")

    def __init__(self, inner: Any, *, barrier: bool) -> None:
        super().__init__()
        self._inner = inner
        self._barrier = barrier
        self._error: BaseException | None = None

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """A barrier's: True at once. Any other op's: gloo's wait (the values the device's stream would give)."""
        if self._error is not None:
            raise self._error
        if not self._barrier:
            if timeout is None:
                self._inner.wait()
            else:
                self._inner.wait(timeout)
        return True

    def is_completed(self) -> bool:
        """True, as SCCL reports; a data op's values are in place first, a failure kept for :meth:`wait`."""
        if not self._barrier and self._error is None:
            try:
                self._inner.wait()
            except Exception as exc:  # reported by wait(), like torch's works
                self._error = exc
        return True

    def is_success(self) -> bool:
        """Whether no failure was seen."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The failure :meth:`is_completed` saw, if any."""
        return self._error

    def synchronize(self) -> None:
        """As :meth:`wait`."""
        self.wait()

    def result(self) -> list[torch.Tensor]:
        """gloo's result."""
        return list(self._inner.result())

    def get_future(self) -> torch.futures.Future[Any]:
        """A barrier's future is complete at once (SCCL marks it so when the work is made); any other op's is
        gloo's."""
        if not self._barrier:
            return self._inner.get_future()  # type: ignore[no-any-return]
        fut: torch.futures.Future[Any] = torch.futures.Future()
        fut.set_result([])
        return fut
