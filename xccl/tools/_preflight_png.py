"""A preflight's breakdown as a PNG (``xccl preflight --png FILE``, ``report.png(FILE)``): predicted communication
per rank by op and by group, side by side (:mod:`._preflight_charts`), drawn with matplotlib.

matplotlib is optional (the ``plot`` extra): :func:`require_matplotlib` says so with a typed error, which the CLI
asks before it runs the script, so a missing extra costs seconds, not a preflight.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import MissingExtra
from ._preflight_charts import Bar, by_group, by_op
from ._preflight_format import nbytes as _bytes
from ._preflight_format import seconds as _seconds

if TYPE_CHECKING:
    from ._preflight_report import Report

__all__ = ["png", "require_matplotlib"]

def require_matplotlib(feature: str = "a preflight PNG") -> Any:
    """matplotlib's pyplot, on a backend that needs no display.

    Raises:
        MissingExtra: matplotlib is not installed (its ``fix`` names the ``plot`` extra).
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise MissingExtra("matplotlib", "plot", feature) from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    return importlib.import_module("matplotlib.pyplot")


def _panel(ax: Any, title: str, bars: tuple[Bar, ...]) -> None:
    # Predicted time where the model prices any bar (a bar it cannot price is drawn empty, labelled "unknown");
    # bytes where it prices none, and the title says so.
    timed = any(b.seconds is not None for b in bars)
    values = [(b.seconds or 0.0) * 1e3 if timed else b.nbytes / (1 << 20) for b in bars]
    labels = [_seconds(b.seconds) if timed else _bytes(b.nbytes) for b in bars]
    ys = list(range(len(bars)))[::-1]  # the largest on top, as the report orders them
    ax.barh(ys, values, color="#3b6ea5")
    ax.set_yticks(ys, [b.label for b in bars])
    for y, value, text in zip(ys, values, labels, strict=True):
        ax.annotate(f" {text}", (value, y), va="center", fontsize=8)
    ax.set_xlim(0, max(values, default=0.0) * 1.3 or 1.0)  # room for the labels
    ax.set_title(title if timed else f"{title} (time unknown: bytes)")
    ax.set_xlabel("predicted ms per rank" if timed else "MiB per rank")


def png(report: Report, path: str) -> None:
    """Write the breakdown of ``report`` to ``path`` as a PNG.

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    plt = require_matplotlib()
    ops, groups = by_op(report), by_group(report)
    rows = max(len(ops), len(groups), 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 1.6 + 0.45 * rows))
    try:
        _panel(left, "by op", ops)
        _panel(right, "by group", groups)
        fig.suptitle(f"xccl preflight: {report.vendor}, world {report.world} on {report.nodes} node(s): "
                     f"{_seconds(report.total_seconds)} per rank")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
