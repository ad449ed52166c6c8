"""A fake world: this process plays rank ``r`` of a world of ``N`` that does not exist (``XCCL_FAKE_WORLD=r/N``).

``xccl preflight --mode fake`` sets it to check a world far larger than this machine can run as processes. Every
vendor rule still applies as in a simulated run (capability table, constraints, fallback policy: native, emulated
by its parts, or the same typed error), because the simulated vendor group and xccl's dispatch above it are the
same objects; only what moves bytes changes: each group's inner gloo backend is torch's ``FakeProcessGroup``
(``torch.testing._internal.distributed.fake_pg``), which issues no communication and returns outputs of the right
shapes with garbage values, and the store is a local ``HashStore`` (torch's ``FakeStore`` has no key-value
methods; xccl keeps keys of its own). The places that wait for the other ranks (the world check, the liveness
ports, the vendor's lazy-connect arrival check, the store-based monitored barrier) ask :func:`fake_world` and skip
the wait: nobody else will ever arrive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final, final

from ..errors import InvalidArgument

__all__ = ["ENV", "FakeWorld", "fake_backend", "fake_world"]

#: The variable that makes this process a rank of a fake world: ``RANK/N``.
ENV: Final = "XCCL_FAKE_WORLD"


@final
@dataclass(frozen=True, slots=True)
class FakeWorld:
    """The rank this process plays, and the size of the world it pretends to be part of."""

    rank: int
    size: int


def fake_world() -> FakeWorld | None:
    """The fake world ``XCCL_FAKE_WORLD`` names (None: a real world).

    Raises:
        InvalidArgument: the variable is not ``RANK/N`` with ``0 <= RANK < N``.
    """
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    rank, sep, size = value.partition("/")
    if not sep or not rank.strip().isdigit() or not size.strip().isdigit() or not 0 <= int(rank) < int(size):
        raise InvalidArgument(ENV, f"{ENV}={value!r}: expected RANK/N with 0 <= RANK < N, e.g. 0/64")
    return FakeWorld(int(rank), int(size))


def fake_backend(rank: int, size: int) -> Any:
    """torch's fake c10d backend for one group: no communication, outputs of the right shapes."""
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(rank, size)
