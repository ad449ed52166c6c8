"""The process's state, in parts: each owned by the floor that uses it, each with its own reset.

A floor keeps what outlives a call in a :class:`Part` of its own (a dataclass registered with
:meth:`Part.register`); ``xccl.shutdown`` resets every part (:func:`reset`). The parts are listed in
docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, TypeVar

__all__ = ["Part", "reset"]

_P = TypeVar("_P", bound="Part")


class Part:
    """A piece of the process's state owned by one floor (a dataclass); :func:`reset` restores its defaults."""

    _parts: ClassVar[list[Part]] = []

    def reset(self) -> None:
        """Forget everything: every field back to its default."""
        fresh = type(self)()
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, getattr(fresh, f.name))

    @classmethod
    def register(cls, part: _P) -> _P:
        """Keep ``part`` so that :func:`reset` resets it; returns it (``PART = Part.register(MyPart())``)."""
        cls._parts.append(part)
        return part


def reset() -> None:
    """Reset every part of the process state (``xccl.shutdown``)."""
    for part in Part._parts:
        part.reset()
