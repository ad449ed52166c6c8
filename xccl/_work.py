"""Work handles for emulated collectives.

Native collectives return the backend's own ``Work``. An emulation may chain several collectives and a local
step (a divide, a copy back from a cast buffer); its handle waits for the inner works, then runs that step once.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any, final

import torch

__all__ = ["Work", "finish"]


@final
class Work:
    """A handle with ``torch.distributed``'s ``Work`` interface for emulated collectives.

    Args:
        works: inner handles to wait for (may be empty: the emulation already ran).
        then: a local step run once, after every inner handle completed.
        result: tensors returned by :meth:`result`.
    """

    __slots__ = ("_works", "_then", "_done", "_result")

    def __init__(
        self, works: Sequence[Any] = (), then: Callable[[], None] | None = None, result: Sequence[torch.Tensor] = ()
    ) -> None:
        self._works = [w for w in works if w is not None]
        self._then = then
        self._done = False
        self._result = list(result)

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for the inner works, then run the local step. Returns True."""
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

    def is_completed(self) -> bool:
        """Whether :meth:`wait` has finished."""
        return self._done

    def is_success(self) -> bool:
        """Whether :meth:`wait` has finished (failures raise from ``wait``)."""
        return self._done

    def result(self) -> list[torch.Tensor]:
        """The output tensors (after :meth:`wait`)."""
        return self._result

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future completed with :meth:`result` once :meth:`wait` has run (waits now)."""
        self.wait()
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def finish(work: Any, async_op: bool, then: Callable[[], None] | None = None) -> Any:
    """Complete an emulation: run ``then`` now (sync) or hand back a :class:`Work` that runs it on ``wait``."""
    if async_op:
        return Work([work] if work is not None else [], then)
    if work is not None:
        work.wait()
    if then is not None:
        then()
    return None
