"""Rendering capability tables as text, Markdown and JSON.

``xccl caps``, ``docs/capabilities.md`` (``scripts/gen_docs.py``) and the vendor pages under ``docs/vendors/``
all render :class:`~xccl.CapabilityTable` objects through this module, so what the command prints, what the docs
say and what dispatch does come from one set of objects.

A cell is ``native`` (the backend's own kernel), ``emul(<via>)`` (a composition of other collectives, see
``xccl.collectives._emulate``), ``prefer(<via>)`` (native, but composed where the composition measured faster:
``Prefer``) or ``—`` (unsupported). Footnotes carry each entry's note, its gates (oldest torch, world sizes) and its
preferences with their reasons. Dtypes and reduce ops per op are in the JSON and in the Markdown detail tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

import torch

from ..plugin._capabilities import REAL_DTYPES, CapabilityTable, Collective, Level, Mode, Support

__all__ = [
    "DASH",
    "About",
    "Tables",
    "cell",
    "emulated_reductions",
    "footnote",
    "modes_from",
    "named",
    "render_json",
    "render_markdown",
    "render_markdown_matrix",
    "render_text",
]

#: The unsupported cell (and its ASCII fallback for terminals that cannot encode it).
DASH: Final = "—"
ASCII_DASH: Final = "-"

_LEGEND: Final = "native: the backend's own kernel; emul(via): composed of other collectives; {dash}: unsupported"
_LEGEND_PREFER: Final = ("prefer(via): native, but composed via `via` on the call shapes where that measured faster "
                         "(sizes and reasons in the notes)")


@final
@dataclass(frozen=True, slots=True)
class About:
    """What a table's plugin is, for headings and JSON (the table itself knows only its name)."""

    vendor: str = ""
    #: torch.distributed backend name.
    backend: str = ""
    device_type: str = ""

    @classmethod
    def of(cls, plugin: Any) -> About:
        """The identity of an :class:`~xccl.Plugin` object."""
        return cls(str(plugin.vendor), str(plugin.backend), str(plugin.device_type))

    def line(self) -> str:
        """One human line: ``PyTorch (gloo); torch.distributed backend gloo; cpu tensors``."""
        parts = [self.vendor] if self.vendor else []
        if self.backend:
            parts.append(f"torch.distributed backend `{self.backend}`")
        if self.device_type:
            parts.append(f"`{self.device_type}` tensors")
        return "; ".join(parts)


def modes_from(name: str) -> tuple[Mode, ...]:
    """``"eager"``, ``"graph"`` or ``"both"`` as a tuple of :class:`~xccl.Mode`."""
    return tuple(Mode) if name == "both" else (Mode(name),)


def cell(sup: Support, dash: str = DASH) -> str:
    """The matrix cell for one entry: ``native``, ``emul(via)`` or the dash."""
    if sup.level is Level.NATIVE:
        return f"prefer({', '.join(dict.fromkeys(p.via for p in sup.prefer))})" if sup.prefer else "native"
    if sup.level is Level.EMULATED:
        return f"emul({sup.via})" if sup.via else "emul"
    return dash


def _cost(op: Collective, sup: Support) -> str:
    """The emulation's traffic note, from its record (what using it costs)."""
    if sup.level is not Level.EMULATED or not sup.via:
        return ""
    from ..ops._emulations import BY_KEY

    record = BY_KEY.get((op, sup.via))
    return "" if record is None else record.note


def emulated_reductions(op: Collective, sup: Support, mode: Mode = Mode.EAGER) -> str:
    """The reductions the entry runs as an emulation although the op itself is there: what
    :meth:`~xccl.CapabilityTable.resolve` derives from the entry (avg and premul_sum as sum where the kernel lacks
    them, ``dtype_via``); ``""`` if none."""
    if not op.reduces or sup.level is Level.UNSUPPORTED:
        return ""
    sets = [ops for ops in (sup.reduce_ops, *sup.dtype_reduce_ops.values()) if ops is not None]
    parts = []
    if any("avg" not in ops and "sum" in ops for ops in sets):
        parts.append("avg (sum + divide)")
    if mode is Mode.EAGER and any("premul_sum" not in ops and "sum" in ops for ops in sets):
        parts.append("premul_sum over floats (local scale + sum)")
    parts += [f"{_dtype_name(d)} (via {via} + local reduction in rank order, exact)" for d, via in sup.dtype_via.items()]
    parts += [f"{r} (via {via})" for r, via in sup.reduce_op_via.items()]
    return f"emulated reductions: {', '.join(parts)}" if parts else ""


def footnote(op: Collective, sup: Support, mode: Mode = Mode.EAGER) -> str:
    """The entry's note with its gates (oldest torch and vendor SDK, world sizes), the reductions it emulates and, when emulated,
    the cost; ``""`` if none."""
    parts = []
    if sup.min_torch is not None:
        parts.append(f"torch >= {'.'.join(map(str, sup.min_torch))}")
    if sup.min_sdk is not None:
        parts.append(f"{sup.min_sdk[0]} >= {sup.min_sdk[1]}")
    if sup.world_sizes is not None:
        parts.append(f"world sizes {', '.join(map(str, sorted(sup.world_sizes)))} only")
    if sup.note:
        parts.append(sup.note)
    parts += [p.describe() for p in sup.prefer]
    reductions = emulated_reductions(op, sup, mode)
    if reductions:
        parts.append(reductions)
    cost = _cost(op, sup)
    if cost and not sup.note:
        parts.append(f"cost: {cost}")
    return "; ".join(parts)


@dataclass
class _Footnotes:
    """Numbers distinct footnote texts in order of first appearance."""

    texts: dict[str, int] = field(default_factory=dict)

    def mark(self, text: str) -> str:
        if not text:
            return ""
        number = self.texts.setdefault(text, len(self.texts) + 1)
        return f" [{number}]"


#: Tables to render: one table, several (named by ``table.backend``), or a mapping from plugin name to table
#: (a plugin may reuse another's table, so the plugin's name is the better label).
Tables = CapabilityTable | Sequence[CapabilityTable] | Mapping[str, CapabilityTable]


def named(tables: Tables) -> list[tuple[str, CapabilityTable]]:
    """``(name, table)`` pairs for any accepted form of ``tables``."""
    if isinstance(tables, CapabilityTable):
        return [(tables.backend, tables)]
    if isinstance(tables, Mapping):
        return list(tables.items())
    return [(t.backend, t) for t in tables]


def render_text(
    tables: Tables, modes: Sequence[Mode] = tuple(Mode), *, ascii_only: bool = False, width: int | None = None
) -> str:
    """The matrix as aligned text: rows are collectives, columns plugin x mode, footnotes underneath.

    Args:
        tables: the tables, one column group each.
        modes: which modes to show.
        ascii_only: use ``-`` for unsupported cells (for terminals that cannot print an em dash).
        width: wrap to this many characters: plugins that do not fit go to a further block of the same rows
            (a plugin's modes stay together). ``None``: one block, however wide.
    """
    dash = ASCII_DASH if ascii_only else DASH
    notes = _Footnotes()
    pairs = named(tables)
    # Cells per plugin; footnotes are numbered plugin by plugin, so the numbers grow from block to block.
    columns = [[[name, m.value, *(cell(sup, dash) + notes.mark(footnote(op, sup, m))
                                  for op in Collective for sup in (t.entry(op, m),))]
                for m in modes] for name, t in pairs]
    first = ["collective", "", *(op.value for op in Collective)]
    out: list[str] = []
    for block in _blocks(first, columns, width):
        if out:
            out.append("")
        widths = [max(map(len, col)) for col in block]
        rows = list(zip(*block, strict=True))
        out.append(_join(rows[0], widths))
        if len(modes) > 1 or len(block) == 2:
            out.append(_join(rows[1], widths))
        out.append(_join(["-" * w for w in widths], widths))
        out.extend(_join(r, widths) for r in rows[2:])
    out += ["", _LEGEND.format(dash=dash)]
    if any(sup.prefer for _, t in pairs for m in modes for op in Collective for sup in (t.entry(op, m),)):
        out.append(_LEGEND_PREFER)
    if notes.texts:
        out += ["", "Notes:", *(f"  [{n}] {text}" for text, n in notes.texts.items())]
    for name, t in pairs:
        out += [f"  {name}: {n}" for n in t.notes]
    out.append("Dtypes, reduce ops and dtype casts per op: xccl caps --json.")
    return "\n".join(out) + "\n"


def _blocks(first: list[str], plugins: list[list[list[str]]], width: int | None) -> list[list[list[str]]]:
    """Pack plugins' column groups into blocks no wider than ``width``, each led by the collective column."""

    def span(cols: list[list[str]]) -> int:
        return sum(2 + max(map(len, c)) for c in cols)

    blocks: list[list[list[str]]] = []
    current: list[list[str]] = [first]
    for cols in plugins:
        if width is not None and len(current) > 1 and span(current) + span(cols) - 2 > width:
            blocks.append(current)
            current = [first]
        current = current + cols
    blocks.append(current)
    return blocks


def _join(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


# ---------------------------------------------------------------------------------------------------- markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown_matrix(tables: Tables, modes: Sequence[Mode] = tuple(Mode)) -> str:
    """The overview matrix as one Markdown table (no footnotes; the detail tables carry them)."""
    cols = [(name, t, m) for name, t in named(tables) for m in modes]
    head = ["collective", *(f"{name} {m.value}" for name, _, m in cols)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in Collective:
        cells = [f"`{op.value}`", *(cell(t.entry(op, m)) for _, t, m in cols)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _names(items: Iterable[str]) -> str:
    return ", ".join(sorted(items))


def _dtypes(dtypes: frozenset[torch.dtype] | None) -> str:
    if dtypes is None:
        return "all"
    if dtypes >= frozenset(REAL_DTYPES):
        extra = dtypes - frozenset(REAL_DTYPES)  # what a vendor moves beyond gloo's dtypes (HCCL's uint16, float8)
        return "all" + (f" + {_names(_dtype_name(d) for d in extra)}" if extra else "")
    return _names(_dtype_name(d) for d in dtypes)


#: Fused collectives: a native kernel takes only what its documented constraints allow (the plugin checks each call
#: and falls back to the portable version otherwise), so an entry that leaves dtypes or reduce ops open does not
#: mean "all": the constraints are in its note.
_FUSED: Final = frozenset({Collective.MM_REDUCE_SCATTER, Collective.ALL_GATHER_MM, Collective.MM_ALL_REDUCE})
_PER_CALL: Final = "per call (notes)"


def _open_fused(op: Collective, sup: Support) -> bool:
    return op in _FUSED and sup.level is Level.NATIVE


def _reduce_ops(op: Collective, sup: Support) -> str:
    if not op.reduces:
        return ""
    base = "all" if sup.reduce_ops is None else _names(sup.reduce_ops)
    # Group dtypes that share an override, so gloo's "floats: avg, ..." reads as one clause.
    groups: dict[frozenset[str], list[str]] = {}
    for dtype, ops in sup.dtype_reduce_ops.items():
        groups.setdefault(ops, []).append(_dtype_name(dtype))
    extra = [f"{_names(ds)}: {_names(ops)}" for ops, ds in groups.items()]
    return "; ".join([*extra, f"other dtypes: {base}"]) if extra else base


def _casts(sup: Support) -> str:
    casts = [f"{_dtype_name(a)} as {_dtype_name(b)}" for a, b in sup.cast_to.items()]
    return ", ".join(casts + [f"{_dtype_name(d)} via {via}" for d, via in sup.dtype_via.items()])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def render_markdown(
    tables: Tables,
    modes: Sequence[Mode] = tuple(Mode),
    *,
    about: Mapping[str, About] | None = None,
    heading: str = "###",
    matrix: bool = True,
) -> str:
    """Markdown for one or more tables: the matrix, then a detail table per plugin.

    This is what ``docs/capabilities.md`` and the vendor pages embed (``scripts/gen_docs.py`` regenerates both).

    Args:
        tables: one table (a vendor page) or several (the overview); see :data:`Tables`.
        modes: which modes to show.
        about: plugin identity by name, printed under each plugin's heading.
        heading: the Markdown heading marker for each plugin's section.
        matrix: include the overview matrix first.
    """
    parts = [render_markdown_matrix(tables, modes)] if matrix else []
    for name, t in named(tables):
        parts.append(_markdown_detail(name, t, modes, (about or {}).get(name), heading))
    return "\n".join(parts)


def _markdown_detail(
    name: str, table: CapabilityTable, modes: Sequence[Mode], about: About | None, heading: str
) -> str:
    lines = [f"{heading} {name}", ""]
    if about is not None and about.line():
        lines += [about.line(), ""]
    lines += [f"- {_md_escape(n)}" for n in table.notes]
    if table.notes:
        lines.append("")
    head = ["collective", "mode", "level", "dtypes", "reduce ops", "dtype casts", "notes"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    hidden = False
    for m in modes:
        for op in Collective:
            sup = table.entry(op, m)
            if m is Mode.GRAPH and sup.level is Level.UNSUPPORTED and not footnote(op, sup, m):
                hidden = True  # listed once below instead of a screenful of dashes
                continue
            unsupported = sup.level is Level.UNSUPPORTED
            cells = [
                f"`{op.value}`",
                m.value,
                cell(sup),
                "" if unsupported else _PER_CALL if _open_fused(op, sup) and sup.dtypes is None else _dtypes(sup.dtypes),
                "" if unsupported else _PER_CALL if _open_fused(op, sup) and sup.reduce_ops is None and op.reduces
                else _reduce_ops(op, sup),
                "" if unsupported else _casts(sup),
                footnote(op, sup, m),
            ]
            lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    if hidden:
        lines += ["", "Graph-mode entries not listed are unsupported."]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------- json


def render_json(
    tables: Tables,
    modes: Sequence[Mode] = tuple(Mode),
    *,
    about: Mapping[str, About] | None = None,
) -> dict[str, Any]:
    """JSON-able data: ``{"plugins": {name: {"vendor", "backend", "device_type", "notes", "collectives"}}}``.

    ``collectives`` is :meth:`CapabilityTable.to_dict` restricted to ``modes`` (equal to it for both modes).
    """
    keep = {m.value for m in modes}
    out: dict[str, Any] = {}
    for name, t in named(tables):
        who = (about or {}).get(name, About())
        full = t.to_dict()
        out[name] = {
            "vendor": who.vendor,
            "backend": who.backend,
            "device_type": who.device_type,
            "notes": list(t.notes),
            "collectives": {op: {m: e for m, e in per_mode.items() if m in keep} for op, per_mode in full.items()},  # type: ignore[attr-defined]
        }
    return {"modes": [m.value for m in modes], "plugins": out}
