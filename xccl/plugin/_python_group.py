"""The base of xccl's process groups written in Python: xccl's own (``collectives/_process_group.py``) and a
simulated vendor's (``plugin/_sim.py``)."""

from __future__ import annotations

from typing import Final

import torch.distributed as dist

__all__ = ["PythonProcessGroup"]


class PythonProcessGroup(dist.ProcessGroup):
    """A ``torch.distributed.ProcessGroup`` subclassed in Python, whose rank and size Python reads without C++.

    On a Python subclass, ``rank()`` and ``size()`` go through pybind's trampoline (torch's ``PyProcessGroup``: a
    virtual call that looks for a Python override of ``getRank``), about 0.8 µs each against 0.1 µs on torch's own
    group, and torch's Python asks often: ``dist.get_rank()``, ``dist.get_world_size()``, FSDP2 (24 times a step
    on five sharded modules). Both are fixed for a group's life. C++ callers still take the trampoline.
    """

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the .pyi lists one overload
        self._group_rank: Final = rank
        self._group_size: Final = size

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._group_rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self._group_size
