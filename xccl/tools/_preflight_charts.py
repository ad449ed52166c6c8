"""The per-step breakdowns a preflight's charts draw (``--html``, ``--png``): one rank's calls, bytes and predicted
communication time, summed by op and by group (a DeviceMesh's groups by their dimension).

Both renderers draw from these rows, so the HTML page, the PNG and the report's JSON agree on every figure: the
group rows are :attr:`~xccl.tools._preflight_report.Report.by_group` itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from ._preflight_report import Report

__all__ = ["Bar", "by_group", "by_op"]


@final
@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: what one rank issued under ``label``.

    Attributes:
        label: the op (``all_gather_into_tensor``) or the group (``default_pg``, ``dim tp``).
        calls: calls one rank made; nbytes: the bytes of those calls (each call's message, as nccl-tests counts).
        seconds: their predicted communication time (None: the cost model has no figure for one of them).
    """

    label: str
    calls: int
    nbytes: int
    seconds: float | None


def by_op(report: Report) -> tuple[Bar, ...]:
    """One bar per op as the script called it (an emulated op priced as its parts), largest predicted total first."""
    rows: dict[str, Bar] = {}
    for c in report.calls:
        old = rows.get(c.op, Bar(c.op, 0, 0, 0.0))
        seconds = None if old.seconds is None or c.total is None else old.seconds + c.total
        rows[c.op] = Bar(c.op, old.calls + c.calls, old.nbytes + c.nbytes * c.calls, seconds)
    return _ordered(rows.values())


def by_group(report: Report) -> tuple[Bar, ...]:
    """One bar per group (:attr:`Report.by_group`: a mesh dimension's group as ``dim NAME``), largest first."""
    return _ordered(Bar(f"{name}[{g['group_size']}]", g["calls"], g["bytes"], g["seconds"])
                    for name, g in report.by_group.items())


def _ordered(bars: Iterable[Bar]) -> tuple[Bar, ...]:
    # Known times first, largest first; unknown ones after, by bytes (as the report's own table orders call sites).
    return tuple(sorted(bars, key=lambda b: (b.seconds is None, -(b.seconds or 0.0), -b.nbytes, b.label)))
