"""How a preflight's report writes its figures (seconds, bytes, rank lists, what the vendor does with a call): one
set of spellings for the terminal table (:mod:`._preflight_report`), the HTML page and the PNG, so that the same
figure reads the same everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._preflight_report import CallSite

__all__ = ["nbytes", "ranges", "seconds", "what"]


def seconds(value: float | None) -> str:
    """``1.234 ms``, ``56.7 us``, or ``unknown``."""
    if value is None:
        return "unknown"
    return f"{value * 1e3:.3f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"


def nbytes(n: int) -> str:
    """``16.2 KiB``, ``3.0 GiB``, ``12 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def what(c: CallSite) -> str:
    """``native``, or ``emulated: PARTS, +EXTRA B``."""
    if c.status == "native":
        return "native"
    extra = "" if c.extra_bytes is None else f", {c.extra_bytes:+d} B"
    return f"emulated: {' + '.join(c.via)}{extra}"


def ranges(ranks: Sequence[int]) -> str:
    """``0-3`` for a run of ranks, ``0, 63`` otherwise, ``none`` for none."""
    if not ranks:
        return "none"
    ordered = sorted(ranks)
    return f"{ordered[0]}-{ordered[-1]}" if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(
        ordered) > 1 else ", ".join(map(str, ordered))
