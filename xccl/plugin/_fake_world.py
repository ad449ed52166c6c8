"""What moves bytes and who waits for peers: a real world, or a fake one, chosen once (``XCCL_FAKE_WORLD=r/N``).

``xccl preflight --mode fake`` makes a process play rank ``r`` of a world of ``N`` that does not exist
(docs/preflight.md). Everything above the wire is the simulated run's own; only the :class:`Transport` differs: each
group's gloo backend is torch's ``FakeProcessGroup`` (``torch.testing._internal.distributed.fake_pg``: no
communication, outputs of the right shapes with garbage values), the store is a local ``HashStore`` (torch's ``FakeStore`` has no key-value methods; xccl keeps keys of its
own), and nobody waits for the other ranks (the world check, the liveness ports, the vendor's lazy-connect arrival
check, the store-based monitored barrier): nobody else will ever arrive.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from typing import Any, Final, final

from ..errors import InvalidArgument
from ..ops._parts import Part
from ..ops._torch import FAKE_PG_INTERNAL, GLOO_GROUP_OPTIONS, TORCH

__all__ = ["ENV", "FakeWorld", "Transport", "choose", "fake_backend", "transport"]

#: The variable that makes this process a rank of a fake world: ``RANK/N``.
ENV: Final = "XCCL_FAKE_WORLD"


@final
@dataclass(frozen=True, slots=True)
class FakeWorld:
    """The rank this process plays, and the size of the world it pretends to be part of."""

    rank: int
    size: int


@final
@dataclass(frozen=True, slots=True)
class Transport:
    """How this process's groups move bytes: gloo over the network, or a fake world's nothing.

    Attributes:
        fake: the fake world this process plays in (None: a real world).
    """

    fake: FakeWorld | None = None

    @property
    def waits(self) -> bool:
        """Whether waiting for the other ranks makes sense (not in a fake world: they never arrive)."""
        return self.fake is None

    def gloo(self, store: Any, rank: int, size: int, timeout: _dt.timedelta, ranks: list[int] | None = None,
             name: str = "") -> Any:
        """A gloo backend over ``store`` for one group (a fake world's: torch's fake backend, no communication),
        told the group's global ``ranks`` and ``name`` where given (torch's own groups are; its logs name them)."""
        if self.fake is not None:
            return fake_backend(rank, size)
        from torch._C._distributed_c10d import ProcessGroupGloo

        gloo: Any = ProcessGroupGloo(store, rank, size, timeout)
        if ranks is not None and TORCH.has(GLOO_GROUP_OPTIONS):
            gloo.options.global_ranks_in_group = ranks
            gloo.options.group_name = name
        return gloo


def fake_backend(rank: int, size: int) -> Any:
    """torch's ``FakeProcessGroup`` backend (no communication) as rank ``rank`` of ``size``."""
    from torch._C._distributed_c10d import FakeProcessGroup

    if TORCH.has(FAKE_PG_INTERNAL):
        return FakeProcessGroup._create_internal(rank, size)
    return FakeProcessGroup(rank, size)


_REAL: Final = Transport()


@dataclass
class _Chosen(Part):
    transport: Transport | None = None


_CHOSEN: Final = Part.register(_Chosen())


def _parse(value: str) -> FakeWorld | None:
    value = value.strip()
    if not value:
        return None
    rank, sep, size = value.partition("/")
    if not sep or not rank.strip().isdigit() or not size.strip().isdigit() or not 0 <= int(rank) < int(size):
        raise InvalidArgument(ENV, f"{ENV}={value!r}: expected RANK/N with 0 <= RANK < N, e.g. 0/64")
    return FakeWorld(int(rank), int(size))


def choose() -> Transport:
    """Choose this process's transport from the environment (``xccl.init`` does, before any group exists).

    Raises:
        InvalidArgument: ``XCCL_FAKE_WORLD`` is not ``RANK/N`` with ``0 <= RANK < N``.
    """
    fake = _parse(os.environ.get(ENV, ""))
    _CHOSEN.transport = _REAL if fake is None else Transport(fake)
    return _CHOSEN.transport


def transport() -> Transport:
    """The transport chosen for this process (chosen now, from the environment, if nothing chose yet)."""
    chosen = _CHOSEN.transport
    return chosen if chosen is not None else choose()

