"""The compiled regions of a preflight: per ``torch.compile`` region, the graphs Dynamo made of it, the graph breaks
(at the user's line, with Dynamo's reason, and the collective that caused each where one did) and, where the
vendor's graph compiler saw its graphs (TorchAir on Ascend), whether it converts every node.

Read from what each rank dumped at exit (``rank_<r>.compiled.json``, :mod:`xccl.runtime._compiled`, asked for by
``XCCL_COMPILED_DUMP_AT_EXIT``, which the launcher sets).
"""

from __future__ import annotations

import json
import os
import re
import runpy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch

__all__ = ["CompiledRegion", "GraphBreak", "load_compiled", "regions", "render_compiled"]

_XCCL: Final = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_INTERNAL: Final = (os.path.join(_XCCL, "xccl") + os.sep, os.path.dirname(str(torch.__file__)) + os.sep,
                    os.path.dirname(runpy.__file__) + os.sep)
_AT: Final = re.compile(r"in user code at (.+):(\d+)\n")
_FRAME: Final = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$', re.MULTILINE)
_RESUME: Final = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
#: torch.distributed's wrappers around every collective (``_exception_logger``, ``_time_logger``): not the op.
_WRAPPERS: Final = ("c10d_logger.py",)


@final
@dataclass(frozen=True, slots=True)
class GraphBreak:
    """A graph break Dynamo made in a compiled region.

    Attributes:
        site: the user's line where the break happened, ``file:line function`` (the innermost frame outside torch
            and xccl of Dynamo's user code traceback).
        collective: the collective whose call broke the graph (``torch.distributed.broadcast``), or None when the
            break is not inside a collective's call.
        reason: Dynamo's reason (its graph break type and explanation).
        count: how often Dynamo logged it (one rank, the most any rank did); ranks: the ranks that logged it.
    """

    site: str
    collective: str | None
    reason: str
    count: int
    ranks: int


@final
@dataclass(frozen=True, slots=True)
class CompiledRegion:
    """One ``torch.compile`` region: a function Dynamo compiled, with the resume functions of its breaks.

    Attributes:
        region: the compiled function, ``file:line function`` (its first line).
        graphs: the graphs Dynamo compiled for it on one rank (the most any rank did; recompilations count).
        breaks: its graph breaks.
        compiler: the vendor's graph compiler that checked its graphs (``TorchAir (simulated)``), or None when
            none did (compiled with Inductor, or a plugin without a checking compiler).
        converts: whether that compiler converts every node of every graph (None: not checked).
        collectives: the communication ops of its checked graphs, by the compiler's names, each once.
        problems: each node it cannot convert, ``<phase> graph: <the compiler's error, naming the node>``.
    """

    region: str
    graphs: int
    breaks: tuple[GraphBreak, ...]
    compiler: str | None
    converts: bool | None
    collectives: tuple[str, ...]
    problems: tuple[str, ...]


def load_compiled(directory: str, ranks: Sequence[int]) -> dict[int, dict[str, Any]]:
    """What each rank dumped of its compiled regions (a rank that dumped nothing has no entry)."""
    out = {}
    for rank in ranks:
        try:
            with open(os.path.join(directory, f"rank_{rank}.compiled.json"), encoding="utf-8") as f:
                out[rank] = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return out


def _internal(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_INTERNAL)


def where(filename: str, line: int | str, name: str, cwd: str) -> str:
    """``file:line function``, the file relative to ``cwd`` when it is under it."""
    rel = os.path.relpath(filename, cwd) if os.path.isabs(filename) else filename
    return f"{filename if rel.startswith('..') else rel}:{line} {name}"


def _reason(text: str) -> str:
    """Dynamo's reason, short: its graph break type and explanation (not its hints)."""
    body = text.split("Graph Break Reason:", 1)[-1].split("User code traceback:", 1)[0]
    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
    if lines and lines[0].startswith("Encountered graph break when"):
        lines = lines[1:] or lines
    kept = [ln.removeprefix("Explanation: ").split(". ")[0] for ln in lines
            if not ln.startswith(("Hint:", "Developer debug context:", "For more details"))]
    return ": ".join(kept[:2])[:400]


def _collective(frames: Sequence[tuple[str, str, str]], user: int) -> str | None:
    """The collective the user's frame ``user`` was calling when the graph broke: the first frame below it in
    torch.distributed or xccl (past torch's logging wrappers)."""
    for filename, _, name in frames[user + 1:]:
        path = os.path.abspath(filename)
        if path.endswith(_WRAPPERS):
            continue
        if os.sep + os.path.join("torch", "distributed") + os.sep in path:
            module = path.split(os.sep + "torch" + os.sep, 1)[1].removesuffix(".py").replace(os.sep, ".")
            return "torch." + module.replace("distributed.distributed_c10d", "distributed") + f".{name}"
        if path.startswith(_INTERNAL[0]):
            return f"xccl.{name}"
        return None
    return None


_Break = tuple[str, str | None, str, tuple[tuple[str, str], ...]]


def _breaks(record: Mapping[str, Any], cwd: str) -> list[_Break]:
    """Each break one rank logged: (site, collective, reason, the user's frames of its traceback as (file,
    function), outermost first: the compiled function is one of them)."""
    seen: dict[str, _Break] = {}
    out = []
    for entry in record.get("breaks", ()):
        text = str(entry.get("text", ""))
        at = _AT.search(text)
        loc = f"{at.group(1)}:{at.group(2)}" if at else ""
        if "User code traceback:" not in text:  # Dynamo's repeat of a break it logged in full before
            if loc in seen:
                out.append(seen[loc])
            elif at:
                out.append((where(at.group(1), at.group(2), "?", cwd), None, _reason(text), ()))
            continue
        frames = [(m.group(1), m.group(2), m.group(3).strip())
                  for m in _FRAME.finditer(text.split("User code traceback:", 1)[1])]
        users = [i for i, f in enumerate(frames) if not _internal(f[0])]
        if not users:
            continue
        user = users[-1]
        callers = tuple((frames[i][0], frames[i][2]) for i in users)  # the compiled function is one of them
        row = (where(*frames[user], cwd), _collective(frames, user), _reason(text), callers)
        seen[loc] = row
        out.append(row)
    return out


def _region_of(frame: Mapping[str, Any]) -> tuple[str, str] | None:
    name, filename = str(frame.get("co_name") or ""), str(frame.get("co_filename") or "")
    if not filename or _internal(filename):
        return None
    resumed = _RESUME.match(name)
    return filename, resumed.group(1) if resumed else name


def _cid(value: Any) -> str:
    return str(value or "").strip("[] ")


def regions(records: Mapping[int, Mapping[str, Any]], cwd: str) -> list[CompiledRegion]:
    """The compiled regions of the ranks' ``records``, in the order they were first compiled."""
    graphs: dict[tuple[str, str], dict[int, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    checks: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    breaks: dict[tuple[str, str], dict[tuple[str, str | None, str], dict[int, int]]] = {}
    for rank, record in records.items():
        by_cid: dict[str, tuple[str, str]] = {}
        checked = {_cid(c.get("compile_id")) for c in record.get("checks", ())}
        for frame in record.get("frames", ()):
            key = _region_of(frame)
            if key is None:
                continue
            by_cid[_cid(frame.get("compile_id"))] = key
            if not _RESUME.match(str(frame.get("co_name"))):
                line = int(frame.get("co_firstlineno") or 0)
                first_line[key] = min(first_line.get(key, line), line)
            counts = graphs.setdefault(key, {})
            # A graph the vendor's compiler refused has no op count (the frame failed), but it was made.
            made = (frame.get("graph_op_count") or 0) > 0 or _cid(frame.get("compile_id")) in checked
            counts[rank] = counts.get(rank, 0) + int(made)
        for check in record.get("checks", ()):
            key = by_cid.get(_cid(check.get("compile_id")))
            if key is not None:
                checks.setdefault(key, []).append(check)
        for site, collective, reason, callers in _breaks(record, cwd):
            key = next((c for c in callers if c in graphs), next(iter(graphs), ("", "?")))
            per = breaks.setdefault(key, {}).setdefault((site, collective, reason), {})
            per[rank] = per.get(rank, 0) + 1
    out = []
    for key, counts in graphs.items():
        filename, name = key
        mine = checks.get(key, [])
        problems = tuple(dict.fromkeys(f"{c['phase']} graph: {p['message']}"
                                       for c in mine for p in c.get("problems", ())))
        out.append(CompiledRegion(
            region=where(filename, first_line.get(key, "?"), name, cwd), graphs=max(counts.values()),
            breaks=tuple(GraphBreak(site, coll, why, max(r.values()), len(r))
                         for (site, coll, why), r in breaks.get(key, {}).items()),
            compiler=str(mine[0]["compiler"]) if mine else None, converts=(not problems) if mine else None,
            collectives=tuple(dict.fromkeys(c for ch in mine for c in ch.get("collectives", ()))),
            problems=problems))
    return out


def render_compiled(compiled: Sequence[CompiledRegion], vendor: str) -> list[str]:
    """The report's lines for the compiled regions (none when the script compiled nothing)."""
    lines = []
    for r in compiled:
        lines.append(f"compiled region {r.region}: {r.graphs} graph(s), {len(r.breaks)} graph break(s)")
        for b in r.breaks:
            cause = f"{b.collective} breaks the graph" if b.collective else "graph break"
            lines.append(f"  {cause} at {b.site}: {b.reason}")
        if r.converts is None:
            lines.append(f"  no graph compiler of {vendor}'s checked it (compiled with another backend, or {vendor} "
                         "has none; xccl.compile hands a graph to the vendor's)")
        elif r.converts:
            lines.append(f"  {r.compiler}: converts every node ({', '.join(r.collectives) or 'no collectives'})")
        else:
            lines.append(f"  {r.compiler}: DOES NOT CONVERT {len(r.problems)} node(s):")
            lines += [f"    {p}" for p in r.problems]
    return lines
