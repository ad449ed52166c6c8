"""Work handles for composed collectives.

Native collectives return the backend's own ``Work``. An emulation may chain several collectives and a local step
(a divide, a copy back from a cast buffer); its handle waits for the inner works, then runs that step once.

:class:`Work` subclasses ``torch.distributed.Work``, so xccl's c10d process group can hand it to torch (whose
wrappers call ``wait()`` on it) and to C++ callers (DDP's reducer asks for ``get_future()``, functional
collectives ``wait()`` through ``wait_tensor``) through the pybind trampoline.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any, final

import torch
import torch.distributed as dist

__all__ = ["Work", "finish"]


@final
class Work(dist.Work):
    """A ``torch.distributed.Work`` for emulated collectives.

    Args:
        works: inner handles to wait for (may be empty: the emulation already ran).
        then: a local step run once, after every inner handle completed.
        result: tensors returned by :meth:`result`.
    """

    __slots__ = ("_done", "_error", "_result", "_then", "_works")

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

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for the inner works, then run the local step. Returns True."""
        if self._error is not None:
            raise self._error
        if not self._done:
            for w in self._works:
                if timeout is None:
                    w.wait()
                else:
                    w.wait(timeout)
            if self._then is not None:
                self._then()
            self._done = True
        return True

    def synchronize(self) -> None:
        """``Work.synchronize``: the local step runs on the host, so this waits (see :meth:`wait`)."""
        self.wait()

    def is_completed(self) -> bool:
        """Whether the collective finished; polling alone completes it (no :meth:`wait` needed).

        Code that polls ``while not work.is_completed()`` must not spin forever: once every inner handle has
        completed, the local step runs here.
        """
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

    def _source_rank(self) -> int:  # the name torch.distributed.recv calls
        return self.source_rank()

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future completed with :meth:`result` once :meth:`wait` has run (waits now)."""
        self.wait()
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def finish(work: Any, async_op: bool, then: Callable[[], object] | None = None) -> Any:
    """Complete a composed collective: run ``then`` now (sync) or hand back a :class:`Work` that runs it on
    ``wait`` (async). ``work`` is the inner collective's handle, or None when it already completed."""
    if async_op:
        return Work([work] if work is not None else [], then)
    if work is not None:
        work.wait()
    if then is not None:
        then()
    return None
