"""Completion in simulation: a vendor whose ``Work.wait()`` returns at once (:attr:`Completion.AT_ONCE`, SCCL).

ProcessGroupSCCL's ``WorkSCCL::isCompleted()`` and ``wait()`` return true at once, for every op, barrier included
(sophgo/torch-tpu@fe9b478 ``ProcessGroupSCCL.cpp:183-191``; its barrier is an all_reduce of an uninitialised
float, ``:745-782``). On the device the op is queued on the current TPU stream, and what comes after it on the
device, or copies to the host (``TPUDeviceManager.cpp:413-431`` synchronises the stream first), is ordered after
it: data collectives give right values to whoever reads them. Nothing orders the *host* after a collective. What
that means for gloo computing on a CPU, where the simulated tensors live on the host:

* **barrier**: ``wait()`` returns before the peers arrived. The simulated barrier starts gloo's barrier and
  returns a work that is complete at once; gloo finishes it in the background, and the group's next collective
  is queued behind it, as on the device's stream. Code that orders host-side steps with a barrier (rank 0 writes a
  file, the others read it) fails in simulation as it would on the TPUs.
* **data collectives, point-to-point**: ``wait()`` still waits for gloo, so the values are right, as the device's
  stream makes them; ``is_completed()`` reports True, as SCCL does, once the values are there (it waits for them:
  polling code terminates, and a host read after it sees what the device would give).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, final

import torch
import torch.distributed as dist

from ._vendor_runtime import Completion

__all__ = ["complete"]


def complete(completion: Completion, key: str, work: Any) -> Any:
    """The work the simulated vendor returns for ``work``, gloo's work of c10d method ``key``.

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
