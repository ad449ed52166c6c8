"""A preflight's report: every collective a script issued, by its call site, with what the vendor does with it and
its predicted cost.

Built from what the ranks left in the preflight's directory: each rank's flight-recorder record
(``rank_<r>``, torch's dump layout plus xccl's ``xccl_op``/``xccl_parts``/``xccl_parts_bytes``) and, for a rank
that died of an error, ``error_<r>.json`` (:mod:`._preflight_child`). Calls are grouped by (call site, op, group,
dtype, bytes, emulation); ``calls`` counts one rank's calls (the most any rank made). A call is priced with
:func:`~xccl.tools._cost_model.predict` over the vendor's cost model; an emulated call as the sum of its parts.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, final

from ..collectives._flight_dump import itemsize_of
from ..ops._vocab import Collective
from ..plugin._cost import CostModel
from ._cost_model import Prediction, predict
from ._preflight_charts import html, png
from ._preflight_charts import nbytes as _bytes
from ._preflight_charts import ranges as _ranges
from ._preflight_charts import seconds as _seconds
from ._preflight_charts import what as _what
from ._preflight_child import error_path
from ._preflight_compiled import CompiledRegion, render_compiled, where
from ._preflight_launch import RankExit

__all__ = ["CallSite", "Failure", "Report", "Setting", "build", "groups_of", "load_records", "render"]


@final
@dataclass(frozen=True, slots=True)
class CallSite:
    """The collectives one call site issued with one shape, and what the vendor does with them.

    Attributes:
        site: the user's frame, ``file:line function`` (the first frame outside torch and xccl).
        op: the op as the script called it (through torch.distributed, FSDP2, DTensor or xccl).
        group: the group's description (``default_pg``, ``mesh_tp``...), its size, and the mesh dimension that
            made it (None: not a DeviceMesh's, or a 1-D mesh over the world, which reuses the world's group).
        intra_node: every rank of the group is on one node (for ``--nodes``).
        dtype: the element type; nbytes: one call's message size, as nccl-tests counts it.
        calls: calls one rank made (the most any rank made); ranks: how many ranks made them.
        status: ``native`` or ``emulated`` (an unsupported call never runs: see :class:`Failure`).
        via: an emulation's parts, in issue order; extra_bytes: what its parts move beyond the call's message.
        seconds: the predicted time of one call (None: unknown, ``why`` says which figure is missing);
            total: of every call.
    """

    site: str
    op: str
    group: str
    group_size: int
    mesh_dim: str | None
    intra_node: bool
    dtype: str
    nbytes: int
    calls: int
    ranks: int
    status: str
    via: tuple[str, ...]
    extra_bytes: int | None
    seconds: float | None
    total: float | None
    why: str


@final
@dataclass(frozen=True, slots=True)
class Failure:
    """What a rank died of: the typed error a run on the vendor would raise, and where the script called it.

    Attributes:
        ranks: the ranks that raised it.
        error: the error's type (``UnsupportedCollective``); module: where it is defined.
        message: its message, which names the fix; fix: its ``fix`` attribute where it has one.
        op: the op it names, where it names one; site: the user's frame, ``file:line function``.
        kind: ``unsupported`` (the vendor refuses the call: :class:`~xccl.UnsupportedCollective`,
            :class:`~xccl.ConstraintViolation`), ``peer`` (a consequence: another rank failed first, or hung) or
            ``script`` (anything else the script raised).
    """

    ranks: tuple[int, ...]
    error: str
    module: str
    message: str
    fix: str
    op: str
    site: str
    kind: str


@final
@dataclass(frozen=True, slots=True)
class Setting:
    """One vendor setting that would bite the script, as ``xccl doctor``'s vendor-runtime checks judge it.

    Attributes:
        name: what was checked (``watchdog``, ``communicators``, ``communicator memory``).
        status: ``ok``, ``info``, ``warn`` or ``fail``.
        summary: what was found; fix: what to do (empty: nothing).
    """

    name: str
    status: str
    summary: str
    fix: str = ""


@final
@dataclass(frozen=True, slots=True)
class Report:
    """A preflight's answer.

    Attributes:
        vendor, world, nodes: what was asked; mode: ``real`` (every rank a process) or ``fake`` (a few
            representative ranks, each a process playing its rank of a world that does not exist).
        ranks_run: the ranks that ran (all of them in mode ``real``; the representatives in mode ``fake``).
        calls: per call site, largest predicted total first (unknown costs last, by bytes moved).
        failures: the errors ranks died of.
        exits: how every rank ended; cost_model: the model's hardware generation (None: the plugin has none).
        groups: the process groups one rank used (the most any rank did).
        settings: the vendor's settings that would bite (``xccl doctor``'s vendor-runtime checks).
        notes: what the report cannot show.
        compiled: the ``torch.compile`` regions the script ran: graphs, graph breaks and the vendor compiler's
            verdict (:mod:`._preflight_compiled`).
        nodes_derivation: how :attr:`nodes` was derived when it was not given (``"64 ranks / 8 TPUs per node"``);
            empty when it was given.
    """

    vendor: str
    world: int
    nodes: int
    mode: str
    ranks_run: tuple[int, ...]
    calls: tuple[CallSite, ...]
    failures: tuple[Failure, ...]
    exits: tuple[RankExit, ...]
    cost_model: str | None
    groups: int = 0
    settings: tuple[Setting, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())
    compiled: tuple[CompiledRegion, ...] = field(default=())
    nodes_derivation: str = ""

    @property
    def seen(self) -> bool:
        """Some rank created its world through xccl, so its collectives were seen (a script that creates a gloo or
        vendor world itself is run but not judged)."""
        return self.groups > 0

    @property
    def ok(self) -> bool:
        """Every rank finished, its collectives were seen, and no call would fail on the vendor."""
        return self.seen and not self.failures and all(e.returncode == 0 for e in self.exits)

    @property
    def exit_code(self) -> int:
        """0 when :attr:`ok`; 1 otherwise (``xccl preflight``'s exit status, for CI gates)."""
        return 0 if self.ok else 1

    @property
    def total_seconds(self) -> float | None:
        """The predicted communication time of every call one rank made (None when any is unknown)."""
        totals = [c.total for c in self.calls]
        return None if any(t is None for t in totals) else sum(t for t in totals if t is not None)

    @property
    def by_group(self) -> dict[str, dict[str, Any]]:
        """Per group (a mesh dimension's, where a DeviceMesh made it): calls, bytes and predicted seconds of one
        rank (seconds None when any of its calls is unknown)."""
        out: dict[str, dict[str, Any]] = {}
        for c in self.calls:
            name = f"dim {c.mesh_dim}" if c.mesh_dim else c.group
            row = out.setdefault(name, {"group_size": c.group_size, "calls": 0, "bytes": 0, "seconds": 0.0})
            row["calls"] += c.calls
            row["bytes"] += c.nbytes * c.calls
            row["seconds"] = None if row["seconds"] is None or c.total is None else row["seconds"] + c.total
        return out

    def table(self) -> str:
        """The terminal report (what ``xccl preflight`` prints)."""
        return render(self)

    def html(self) -> str:
        """The report as one self-contained HTML page, with its charts (``--html``; :mod:`._preflight_charts`)."""
        return html(self)

    def png(self, path: str) -> None:
        """Write the per-rank breakdown by op and by group to ``path`` as a PNG (``--png``; needs matplotlib, the
        ``plot`` extra, else :class:`~xccl.MissingExtra`)."""
        png(self, path)

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``--json``)."""
        out = asdict(self)
        out.update(ok=self.ok, seen=self.seen, exit_code=self.exit_code, total_seconds=self.total_seconds, by_group=self.by_group)
        return out


def _site(frames: Sequence[Mapping[str, Any]] | None, cwd: str) -> str:
    if not frames:
        return "<no Python caller>"
    return where(str(frames[0]["filename"]), frames[0]["line"], frames[0]["name"], cwd)


def _nbytes(sizes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> int:
    itemsizes = [itemsize_of(dtype) for dtype in dtypes]
    return sum(math.prod(int(dim) for dim in shape) * (4 if size is None else size)
               for shape, size in zip(sizes, itemsizes, strict=False))


def _price(model: CostModel | None, op: str, nbytes: int, n: int, intra: bool) -> Prediction:
    try:
        collective = Collective(op)
    except ValueError:
        return Prediction(None, f"unknown: {op} is not a collective the cost model knows")
    return predict(model, collective, nbytes, n, intra_node=intra)


def _priced(model: CostModel | None, op: str, nbytes: int, parts: Sequence[str], part_bytes: Sequence[int], n: int,
            intra: bool) -> Prediction:
    """One call's prediction: its own op's, or the sum of its parts' for an emulation."""
    if not parts:
        return _price(model, op, nbytes, n, intra)
    seconds = 0.0
    whys = []
    for part, size in zip(parts, part_bytes or [nbytes] * len(parts), strict=False):
        p = _price(model, part, size, n, intra)
        if p.seconds is None:
            return Prediction(None, f"{p.why} (a part of the emulation)", p.source)
        seconds += p.seconds
        whys.append(f"{part}: {p.why}")
    return Prediction(seconds, "; ".join(whys))


def _calls(records: Mapping[int, dict[str, Any]], model: CostModel | None, per_node: int,
           cwd: str) -> list[CallSite]:
    per_rank: dict[tuple[Any, ...], Counter[int]] = {}
    for rank, record in records.items():
        groups = record.get("pg_config", {})
        for e in record.get("entries", ()):
            name, desc = e["process_group"]
            members = json.loads(groups.get(name, {}).get("ranks", "[]"))
            dtypes = [*e["input_dtypes"], *e["output_dtypes"]]
            nbytes = max(_nbytes(e["input_sizes"], e["input_dtypes"]), _nbytes(e["output_sizes"], e["output_dtypes"]))
            key = (_site(e["frames"], cwd), e.get("xccl_op", e["profiling_name"]), str(desc), len(members) or 1,
                   len({m // per_node for m in members}) <= 1, dtypes[0] if dtypes else "", nbytes,
                   tuple(e.get("xccl_parts") or ()), tuple(e.get("xccl_parts_bytes") or ()))
            per_rank.setdefault(key, Counter())[rank] += 1
    rows = []
    for (site, op, desc, n, intra, dtype, nbytes, parts, part_bytes), counts in per_rank.items():
        pred = _priced(model, op, nbytes, parts, part_bytes, n, intra)
        calls = max(counts.values())
        # torch's DeviceMesh names the groups it creates "mesh_<dim name>" (device_mesh.py, _init_process_groups).
        mesh_dim = desc.removeprefix("mesh_") if desc.startswith("mesh_") else None
        rows.append(CallSite(
            site=site, op=op, group=desc, group_size=n, mesh_dim=mesh_dim, intra_node=intra, dtype=dtype,
            nbytes=nbytes, calls=calls, ranks=len(counts), status="emulated" if parts else "native", via=parts,
            extra_bytes=(sum(part_bytes) - nbytes) if parts and part_bytes else None, seconds=pred.seconds,
            total=None if pred.seconds is None else pred.seconds * calls, why=pred.why))
    rows.sort(key=lambda c: (c.total is None, -(c.total or 0.0), -c.nbytes * c.calls, c.site))
    return rows


#: xccl's errors that say the vendor refuses a call, and those that follow from another rank's failure.
_REFUSALS: Final = frozenset({"UnsupportedCollective", "ConstraintViolation"})
_CONSEQUENCES: Final = frozenset({"PeerFailure", "CollectiveTimeout", "CollectiveMismatch"})


def _kind(module: str, error: str) -> str:
    if module != "xccl.errors":
        return "script"
    return "unsupported" if error in _REFUSALS else "peer" if error in _CONSEQUENCES else "script"


_ADDRESS: Final = re.compile(r"0x[0-9a-fA-F]{6,}")


def _failures(directory: str, ranks: Sequence[int], cwd: str) -> list[Failure]:
    by_error: dict[tuple[str, ...], list[int]] = {}
    facts: dict[tuple[str, ...], dict[str, Any]] = {}
    for rank in ranks:
        try:
            with open(error_path(directory, rank), encoding="utf-8") as f:
                raised = json.load(f)
        except FileNotFoundError:
            continue
        site = _site([raised["site"]] if raised.get("site") else None, cwd)
        # Object addresses differ by process (BackendCompilerFailed names its compiler function's): one row still.
        key = (raised["type"], _ADDRESS.sub("0x…", raised["message"]), site)
        by_error.setdefault(key, []).append(rank)
        facts[key] = {**raised, "site": site}
    return [Failure(ranks=tuple(r), error=k[0], module=facts[k]["module"], message=k[1], fix=facts[k]["fix"],
                    op=facts[k]["op"], site=k[2], kind=_kind(facts[k]["module"], k[0]))
            for k, r in by_error.items()]


def load_records(directory: str, ranks: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The records the ranks dumped in ``directory`` (a rank killed before it could dump has none)."""
    out = {}
    for rank in ranks:
        path = os.path.join(directory, f"rank_{rank}")
        if os.path.exists(path):
            with open(path, "rb") as f:
                out[rank] = pickle.load(f)  # written by this preflight's own ranks
    return out


def build(directory: str, records: Mapping[int, dict[str, Any]], *, vendor: str, world: int, nodes: int,
          exits: Sequence[RankExit], model: CostModel | None, cwd: str, settings: Sequence[Setting] = (),
          notes: Sequence[str] = (), mode: str = "real", compiled: Sequence[CompiledRegion] = (),
          nodes_derivation: str = "") -> Report:
    """The report of the ranks that left their ``records`` and errors in ``directory`` (``mode``: ``real``, or
    ``fake`` when the ranks that ran each played one rank of a world that did not exist)."""
    ranks = [e.rank for e in exits]
    return Report(vendor=vendor, world=world, nodes=nodes, mode=mode, ranks_run=tuple(ranks),
                  calls=tuple(_calls(records, model, max(1, world // nodes), cwd)),
                  failures=tuple(_failures(directory, ranks, cwd)), exits=tuple(exits),
                  cost_model=None if model is None else model.generation, groups=groups_of(records),
                  settings=tuple(settings), notes=tuple(notes), compiled=tuple(compiled),
                  nodes_derivation=nodes_derivation)


def groups_of(records: Mapping[int, dict[str, Any]]) -> int:
    """The process groups one rank used, the most any rank did."""
    return max((len(rec.get("pg_config", {})) for rec in records.values()), default=0)


def render(report: Report) -> str:
    """The terminal table, largest predicted cost first, then the failures and what the report cannot show."""
    head = ("call site", "op", "group", "dtype", "bytes", "calls", "on " + report.vendor, "per call", "total")
    rows = [head] + [(c.site, c.op, f"{c.group}[{c.group_size}]" + (f" dim {c.mesh_dim}" if c.mesh_dim else "")
                      + ("" if c.intra_node else " inter-node"), c.dtype, _bytes(c.nbytes), str(c.calls),
                      _what(c), _seconds(c.seconds), _seconds(c.total)) for c in report.calls]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    derived = f" (derived: {report.nodes_derivation})" if report.nodes_derivation else ""
    lines = [f"xccl preflight: {report.vendor}, world {report.world} on {report.nodes} node(s){derived}, mode "
             f"{report.mode} (ranks run: {_ranges(report.ranks_run)}); "
             f"cost model: {report.cost_model or 'none (unknown)'}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    groups = report.by_group
    if len(groups) > 1:
        lines.append("per group: " + "; ".join(f"{name}[{g['group_size']}] {g['calls']} calls, {_bytes(g['bytes'])}, "
                                               f"{_seconds(g['seconds'])}" for name, g in groups.items()))
    lines.append(f"predicted communication per rank: {_seconds(report.total_seconds)}")
    lines += render_compiled(report.compiled, report.vendor)
    for f in sorted(report.failures, key=lambda f: f.kind == "peer"):
        if f.kind == "peer":  # the first failure's consequence: one line, not its whole story
            lines.append(f"then on ranks {_ranges(f.ranks)}: {f.error} at {f.site} (another rank failed first)")
            continue
        kind = "UNSUPPORTED on " + report.vendor if f.kind == "unsupported" else "the script failed"
        lines.append(f"{kind}: {f.site}: {f.error}: {f.message}" + (f" Fix: {f.fix}" if f.fix else "")
                     + f" (ranks {_ranges(f.ranks)})")
    died = [e for e in report.exits if e.returncode != 0]
    if died and not report.failures:
        last = died[0].output.strip().splitlines()[-5:]
        lines.append(f"rank {died[0].rank} exited with status {died[0].returncode}" +
                     (" (stopped)" if died[0].stopped else "") + ":\n    " + "\n    ".join(last))
    lines += [f"vendor setting [{s.status}] {s.name}: {s.summary}" + (f" Fix: {s.fix}" if s.fix else "")
              for s in report.settings]
    if not report.seen:
        lines.append("NOTHING SEEN: no rank created its world through xccl (xccl.init(), or "
                     "dist.init_process_group(xccl.process_group_backend())), so its collectives were not recorded "
                     "and the script cannot be judged")
    lines += [f"note: {n}" for n in report.notes]
    lines.append("verdict: " + ("runs on " + report.vendor if report.ok else "WOULD FAIL on " + report.vendor))
    return "\n".join(lines)
