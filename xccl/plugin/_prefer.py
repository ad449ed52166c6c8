"""Preferred compositions: a native op that a backend runs faster as a composition of its other ops.

"Native" names where a kernel comes from, not how fast it is: a capability entry may carry :class:`Prefer` records,
each naming a composition (an emulation xccl has for the op, its ``via``) and the call shapes on which it measured
faster, with the measurement that shows it (docs/capabilities.md). Every rank of a call must choose alike, or ranks
run different collectives and hang: a size range is therefore judged by the op's *agreed size*
(:data:`AGREED_SIZE`), and ops without one may carry only preferences without a size range.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final, final

from ..ops._specs import SPECS

if TYPE_CHECKING:
    from ._capabilities import Collective

__all__ = ["AGREED_SIZE", "Prefer", "edges", "problems", "size_text"]


@final
@dataclass(frozen=True, slots=True)
class Prefer:
    """Run the native op as the composition ``via`` on these call shapes, because it measured faster there.

    Applies when ``min_bytes <= size < max_bytes`` (``size``: the op's agreed size, :data:`AGREED_SIZE`) and the
    world size is in ``world_sizes``. A preference without a size range applies at every size.
    """

    #: The composition: the name of one of xccl's emulations of the op (``xccl.collectives._emulate``).
    via: str
    #: Smallest agreed size, in bytes, at which it applies.
    min_bytes: int = 0
    #: Agreed size, in bytes, from which it no longer applies; ``None``: no upper bound.
    max_bytes: int | None = None
    #: World sizes on which it applies (any iterable of ints; stored as a frozenset); ``None``: any.
    world_sizes: Collection[int] | None = None
    #: The measurement that shows it: a benchmark and its figure, for ``xccl caps`` and the docs.
    why: str = ""

    def __post_init__(self) -> None:
        if self.world_sizes is not None and not isinstance(self.world_sizes, frozenset):
            object.__setattr__(self, "world_sizes", frozenset(self.world_sizes))
        if not self.why.strip():
            raise ValueError(f"Prefer({self.via!r}) must say why (the benchmark and figure that show it)")
        if self.min_bytes < 0 or (self.max_bytes is not None and self.max_bytes <= self.min_bytes):
            raise ValueError(f"Prefer({self.via!r}): need 0 <= min_bytes < max_bytes, got {self.min_bytes}, "
                             f"{self.max_bytes}")

    @property
    def sized(self) -> bool:
        """Whether it applies to a range of sizes only (and so needs the op's agreed size)."""
        return self.min_bytes > 0 or self.max_bytes is not None

    def applies(self, nbytes: int | None, world_size: int | None) -> bool:
        """Whether it applies to a call of agreed size ``nbytes`` on ``world_size`` ranks (``None``: unknown,
        which a bounded preference does not match)."""
        if self.world_sizes is not None and world_size not in self.world_sizes:
            return False
        if not self.sized:
            return True
        return nbytes is not None and self.min_bytes <= nbytes and (self.max_bytes is None or nbytes < self.max_bytes)

    def where(self) -> str:
        """The shapes it applies to, in words: ``>= 1 MiB, 2 or 4 ranks``; ``""`` when it always applies."""
        parts = []
        if self.min_bytes and self.max_bytes is not None:
            parts.append(f"{size_text(self.min_bytes)} to < {size_text(self.max_bytes)}")
        elif self.min_bytes:
            parts.append(f">= {size_text(self.min_bytes)}")
        elif self.max_bytes is not None:
            parts.append(f"< {size_text(self.max_bytes)}")
        if self.world_sizes is not None:
            parts.append(" or ".join(map(str, sorted(self.world_sizes))) + " ranks")
        return ", ".join(parts)

    def describe(self) -> str:
        """One line for ``xccl caps`` and the docs: ``prefers all_to_all (>= 1 MiB, 2 or 4 ranks): why``."""
        where = self.where()
        return f"prefers {self.via}{f' ({where})' if where else ''}: {self.why}"

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (``xccl caps --json``)."""
        sizes = None if self.world_sizes is None else sorted(self.world_sizes)
        return {**asdict(self), "world_sizes": sizes}


def size_text(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that divides it: ``64 MiB``, ``1536 KiB``, ``100 B``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


#: Ops whose size every rank of a call agrees on, by name (a ``Collective`` is a ``str``), and what that size is:
#: the only ops a preference bounded by size may be given for (the specs' ``agreed_doc``).
AGREED_SIZE: Final[Mapping[str, str]] = {spec.name: spec.agreed_doc for spec in SPECS.values() if spec.agreed}


def problems(op: Collective, level: str, prefer: Iterable[Prefer], compositions: Iterable[str]) -> list[str]:
    """What is wrong with an entry's preferences: one sentence each (the table refuses to build with any)."""
    out = []
    known = set(compositions)
    for p in prefer:
        if level != "native":
            out.append(f"{op.value}: a preference on a {level} entry (only native ops choose between their kernel "
                       "and a composition)")
        if p.via not in known:
            out.append(f"{op.value}: prefers {p.via!r}, which xccl has no composition of (it has "
                       f"{', '.join(sorted(known)) or 'none'})")
        if p.sized and op not in AGREED_SIZE:
            out.append(f"{op.value}: a preference bounded by size, but ranks of this op do not agree on a size (its "
                       "tensors may differ from rank to rank), so they could choose differently and hang; drop "
                       "min_bytes/max_bytes")
    return out


def edges(prefer: Iterable[Prefer], world_size: int | None) -> tuple[int, ...]:
    """The sizes (bytes) at which the first preference that applies may change on ``world_size`` ranks, sorted."""
    out = set()
    for p in prefer:
        if p.sized and (p.world_sizes is None or world_size in p.world_sizes):
            out.add(p.min_bytes)
            if p.max_bytes is not None:
                out.add(p.max_bytes)
    out.discard(0)
    return tuple(sorted(out))
