"""How a preflight's report writes its figures and draws them, for the terminal table (:mod:`._preflight_report`),
the HTML page and the PNG, so that the same figure reads the same everywhere: one set of spellings (seconds, bytes,
rank lists, what the vendor does with a call); the per-step breakdowns the charts draw: one rank's calls, bytes and
predicted communication time, summed by op and by group (a DeviceMesh's groups by their dimension; the group rows
are :attr:`~xccl.tools._preflight_report.Report.by_group` itself); and the two renderings of the report:

* :func:`html` (``xccl preflight --html FILE``, ``report.html()``): one self-contained page that needs nothing but a
  browser (no script, no stylesheet or font to fetch, the charts inline SVG). It shows what the terminal table
  shows, in the same order: the verdict, the predicted communication per rank, bar charts of that time and of the
  bytes moved by op and by group, every call site, the calls the vendor refuses, the vendor settings and the notes.
* :func:`png` (``xccl preflight --png FILE``, ``report.png(FILE)``): the breakdowns by op and by group side by side,
  drawn with matplotlib. matplotlib is optional (the ``plot`` extra): :func:`require_matplotlib` says so with a
  typed error, which the CLI asks before it runs the script, so a missing extra costs seconds, not a preflight.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Final, final

from ..errors import MissingExtra

if TYPE_CHECKING:
    from ._preflight_report import CallSite, Report

__all__ = ["Bar", "by_group", "by_op", "html", "nbytes", "png", "ranges", "require_matplotlib", "seconds", "what"]


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
    labels = [seconds(b.seconds) if timed else nbytes(b.nbytes) for b in bars]
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
                     f"{seconds(report.total_seconds)} per rank")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------------- html


_STYLE: Final = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; } th, td { padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #17663a; } .fail { color: #b3261e; } .warn { color: #8a5a00; }
.charts { display: flex; flex-wrap: wrap; gap: 2em; } figure { margin: 0; }
svg text { font: 12px system-ui, sans-serif; }
"""
#: Chart geometry, in pixels: label column, bar column, value column, row height.
_LABEL, _BAR, _VALUE, _ROW = 230, 260, 90, 22


def _chart(title: str, bars: Sequence[Bar], value: Callable[[Bar], float | None],
           text: Callable[[Bar], str]) -> str:
    """A horizontal bar chart; a bar whose value is unknown is drawn as an empty outline labelled ``unknown``."""
    top = max((v for b in bars if (v := value(b)) is not None), default=0.0)
    height = _ROW * len(bars) + 8
    parts = [f'<figure><figcaption>{escape(title)}</figcaption>'
             f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LABEL + _BAR + _VALUE}" height="{height}" '
             f'role="img" aria-label="{escape(title)}">']
    for i, b in enumerate(bars):
        y = 4 + i * _ROW
        v = value(b)
        parts.append(f'<text x="{_LABEL - 6}" y="{y + 14}" text-anchor="end">{escape(b.label)}</text>')
        if v is None:
            parts.append(f'<rect x="{_LABEL}" y="{y + 3}" width="{_BAR}" height="{_ROW - 6}" fill="none" '
                         'stroke="#999" stroke-dasharray="4 3"/>')
        else:
            width = 0.0 if top <= 0 else max(1.0, _BAR * v / top)
            parts.append(f'<rect x="{_LABEL}" y="{y + 3}" width="{width:.1f}" height="{_ROW - 6}" fill="#3b6ea5">'
                         f'<title>{escape(b.label)}: {escape(text(b))}</title></rect>')
        parts.append(f'<text x="{_LABEL + _BAR + 6}" y="{y + 14}">{escape(text(b))}</text>')
    parts.append("</svg></figure>")
    return "".join(parts)


def _charts(report: Report) -> str:
    out = []
    for name, bars in (("op", by_op(report)), ("group", by_group(report))):
        if not bars:
            continue
        out.append(_chart(f"predicted communication per rank, by {name}", bars, lambda b: b.seconds,
                          lambda b: seconds(b.seconds)))
        out.append(_chart(f"bytes per rank, by {name}", bars, lambda b: float(b.nbytes), lambda b: nbytes(b.nbytes)))
    return f'<div class="charts">{"".join(out)}</div>' if out else "<p>No collective was recorded.</p>"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] = frozenset()) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _calls(report: Report) -> str:
    head = ("call site", "op", "group", "mesh dim", "node span", "dtype", "bytes", "calls", "ranks",
            f"on {report.vendor}", "per call", "total", "why")
    rows = [(c.site, c.op, f"{c.group}[{c.group_size}]", c.mesh_dim or "", "intra-node" if c.intra_node else
             "inter-node", c.dtype, nbytes(c.nbytes), str(c.calls), str(c.ranks), what(c), seconds(c.seconds),
             seconds(c.total), c.why) for c in report.calls]
    return _table(head, rows, frozenset({6, 7, 8, 10, 11})) if rows else "<p>No collective was recorded.</p>"


def _failures(report: Report) -> str:
    if not report.failures:
        return "<p>None: no call would be refused.</p>"
    rows = [(f.kind, f.site, f.error, f.op, f.message, f.fix, ranges(f.ranks))
            for f in sorted(report.failures, key=lambda f: f.kind == "peer")]
    return _table(("kind", "call site", "error", "op", "message", "fix", "ranks"), rows)


def _compiled(report: Report) -> str:
    """One row per compiled region and one per graph break in it (the terminal report's lines, as a table)."""
    rows = []
    for r in report.compiled:
        if r.converts is None:
            verdict = f"no graph compiler of {report.vendor}'s checked it"
        elif r.converts:
            verdict = f"{r.compiler}: converts every node ({', '.join(r.collectives) or 'no collectives'})"
        else:
            verdict = f"{r.compiler}: DOES NOT CONVERT {len(r.problems)} node(s): " + "; ".join(r.problems)
        rows.append((r.region, str(r.graphs), str(len(r.breaks)), verdict))
        rows += [(f"  break at {b.site}", "", "", f"{b.collective or 'graph break'}: {b.reason}") for b in r.breaks]
    return _table(("compiled region", "graphs", "breaks", "verdict"), rows, frozenset({1, 2}))


def _settings(report: Report) -> str:
    if not report.settings:
        return "<p>None judged.</p>"
    return _table(("setting", "status", "summary", "fix"), [(s.name, s.status, s.summary, s.fix)
                                                             for s in report.settings])


def html(report: Report) -> str:
    """The report as a self-contained HTML page (see the module's docstring)."""
    verdict = f"runs on {report.vendor}" if report.ok else f"WOULD FAIL on {report.vendor}"
    title = f"xccl preflight: {report.vendor}, world {report.world}"
    died = [e for e in report.exits if e.returncode != 0 and not report.failures]
    sections = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="{"ok" if report.ok else "fail"}"><strong>verdict: {escape(verdict)}</strong></p>',
        f"<p>world {report.world} on {report.nodes} node(s)"
        + (f" (derived: {escape(report.nodes_derivation)})" if report.nodes_derivation else "")
        + f", mode {escape(report.mode)} (ranks run: "
        f"{escape(ranges(report.ranks_run))}); cost model: {escape(report.cost_model or 'none (unknown)')}</p>",
        f"<p>predicted communication per rank: <strong>{escape(seconds(report.total_seconds))}</strong> "
        f"({sum(c.calls for c in report.calls)} calls, {escape(nbytes(sum(c.nbytes * c.calls for c in report.calls)))}"
        " for the steps the script ran)</p>",
        "<h2>Breakdown</h2>", _charts(report),
        "<h2>Call sites</h2>", _calls(report),
        f"<h2>Unsupported on {escape(report.vendor)} and other failures</h2>", _failures(report),
    ]
    if report.compiled:
        sections += ["<h2>Compiled regions</h2>", _compiled(report)]
    if died:
        sections.append(f"<p class=fail>rank {died[0].rank} exited with status {died[0].returncode}:</p>"
                        f"<pre>{escape(died[0].output.strip()[-2000:])}</pre>")
    if not report.seen:
        sections.append('<p class="fail">NOTHING SEEN: no rank created its world through xccl, so its collectives '
                        "were not recorded and the script cannot be judged.</p>")
    sections += ["<h2>Vendor settings</h2>", _settings(report), "<h2>What this report cannot show</h2>",
                 "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in report.notes) + "</ul>"]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")
