"""What one rank of ``xccl doctor --world`` found (:class:`RankFacts`), and rank 0's comparison of every rank's.

Each rank condenses its node checks (:func:`~.doctor_checks.collect`) and what the launcher told it into a
:class:`RankFacts`; :func:`compare` turns the list rank 0 gathered into a :class:`WorldVerdict`. What each rank
reports and what is compared (:data:`COMPARED`) is in docs/cli.md (``xccl doctor --world``).

The facts travel as JSON, and a rank of another xccl version may send fields this one does not know or lack
some it expects: :meth:`RankFacts.from_dict` fills gaps with ``"?"`` so that the difference is reported, not fatal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import platform
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

import xccl
from xccl.errors import RankTableError
from xccl.ops._torch import TORCH
from xccl.plugin import load_rank_table
from xccl.plugin._registry import default_registry

from .doctor_model import Report, Status
from .ranktable import installed_formats

__all__ = ["COMPARED", "Difference", "RankFacts", "WorldVerdict", "compare", "gather", "rank_list"]

#: The host name a rank reports, instead of ``socket.gethostname()``. For the tests, which make one machine
#: look like several hosts, and for containers whose host names say nothing (every pod called ``localhost``).
HOST_ENV: Final = "XCCL_DOCTOR_HOST"

#: Variables each rank reports (the prefixes ``XCCL_`` and the socket-interface ones are added to these).
_ENV: Final = (
    "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "RANK_TABLE_FILE", "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
    "TPU_VISIBLE_DEVICES", "CHIP_MAP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME",
    "HCCL_IF_IP", "TORCH_DEVICE_BACKEND_AUTOLOAD",
)
#: Not reported: doctor's own plumbing.
_PRIVATE: Final = ("XCCL_DOCTOR_",)


@final
@dataclass(frozen=True, slots=True)
class RankFacts:
    """What one rank found about itself. Every value is a string or an int, so that it travels as JSON."""

    rank: int
    #: ``WORLD_SIZE`` as the launcher told this rank.
    world_size: int
    local_rank: int
    host: str
    pid: int
    python: str
    torch: str
    xccl: str
    #: The plugin ``xccl.init`` would select here, or ``"(none)"`` when it cannot select one.
    plugin: str
    #: The distribution that provides it, with its version (``"xccl-sophgo 0.1.0"``).
    plugin_dist: str
    vendor: str
    backend: str
    #: ``"native"``, or ``"simulated"`` (``XCCL_SIMULATE``: the vendor's rules, computed by gloo on CPU).
    mode: str
    #: The device this rank would drive (``"npu:1"``, ``"cpu"``), and the visible-devices variable behind it.
    device: str
    #: Vendor SDK packages (``torch_npu``, ``torch_tpu``: version or ``"-"``), and the selected plugin's probe facts.
    sdk: Mapping[str, str] = field(default_factory=dict)
    #: ``RANK_TABLE_FILE``: its digest, format, size, and this rank's entry (empty when unset).
    rank_table: Mapping[str, str] = field(default_factory=dict)
    #: The launcher's and xccl's variables, as this rank saw them.
    env: Mapping[str, str] = field(default_factory=dict)
    #: This rank's own failures (``section/name: summary``), as ``xccl doctor`` prints them.
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**out, "sdk": dict(self.sdk), "rank_table": dict(self.rank_table), "env": dict(self.env),
                "problems": list(self.problems), "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankFacts:
        """Read what a rank sent; a field it lacks is ``"?"`` (or -1 for a number), one it adds is ignored."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = data.get(f.name)
            if f.name in ("rank", "world_size", "local_rank", "pid"):
                values[f.name] = raw if isinstance(raw, int) and not isinstance(raw, bool) else -1
            elif f.name in ("sdk", "rank_table", "env"):
                values[f.name] = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            elif f.name in ("problems", "warnings"):
                values[f.name] = tuple(str(p) for p in raw) if isinstance(raw, list) else ()
            else:
                values[f.name] = str(raw) if raw is not None else "?"
        return cls(**values)


# ------------------------------------------------------------------------------------------------------ gather


def gather(
    report: Report, env: Mapping[str, str], rank: int, world_size: int, local_rank: int, registry: Any = None
) -> RankFacts:
    """Condense this rank's doctor report and environment into its :class:`RankFacts`.

    Args:
        report: what :func:`~.doctor_checks.collect` found on this rank.
        env: the environment it judged.
        rank: this rank, as the launcher numbered it; ``world_size`` and ``local_rank`` likewise.
        registry: the plugins ``report`` was collected over (default: the installed ones).
    """
    info = (registry or default_registry()).infos().get(report.selected or "")
    plugin = info.plugin if info is not None else None
    sim = env.get("XCCL_SIMULATE", "").strip()
    simulated = plugin is not None and sim not in ("", "0", "false") and sim == plugin.name
    sdk = {f.name: f.facts.get("version", "-") for f in report.findings if f.section == "packages"}
    if info is not None:
        sdk.update({f"{info.name}.{k}": v for k, v in info.facts.items()})
    return RankFacts(
        rank=rank, world_size=world_size, local_rank=local_rank,
        host=env.get(HOST_ENV) or socket.gethostname(), pid=os.getpid(),
        python=platform.python_version(), torch=TORCH.version, xccl=xccl.__version__,
        plugin=report.selected or "(none)",
        plugin_dist=(info.distribution or "?") if info is not None else "-",
        vendor=(plugin.vendor or "-") if plugin is not None else "-",
        backend=plugin.backend if plugin is not None else "-",
        mode="simulated" if simulated else "native",
        device=_device(plugin, simulated, local_rank, env),
        sdk=sdk, rank_table=_rank_table_entry(env.get("RANK_TABLE_FILE"), rank),
        env={k: v for k, v in sorted(env.items()) if _reported(k)},
        problems=tuple(f"{f.section}/{f.name}: {f.summary}" for f in report.findings if f.status == "fail"),
        warnings=tuple(f"{f.section}/{f.name}: {f.summary}" for f in report.findings if f.status == "warn"),
    )


def _reported(name: str) -> bool:
    if name.startswith(_PRIVATE):
        return False
    return name in _ENV or name.startswith("XCCL_") or name.endswith("_SOCKET_IFNAME")


def _device(plugin: Any, simulated: bool, local_rank: int, env: Mapping[str, str]) -> str:
    """The device ``xccl.init`` would give this rank: ``<device_type>:<local rank>`` (``Runtime.setup_device``)."""
    if plugin is None:
        return "-"
    if simulated or plugin.device_type == "cpu":
        return "cpu" + (f" (simulated {plugin.device_type})" if simulated and plugin.device_type != "cpu" else "")
    device = f"{plugin.device_type}:{local_rank}"
    var = getattr(plugin, "visible_devices_env", None)
    if var and env.get(var):
        ids = [s.strip() for s in env[var].split(",")]
        physical = ids[local_rank] if 0 <= local_rank < len(ids) else "none"
        device += f" ({var}[{local_rank}]={physical})"
    return device


def _rank_table_entry(path: str | None, rank: int) -> dict[str, str]:
    """``RANK_TABLE_FILE``'s digest and format, and the entry whose ``rank`` (or ``rank_id``) is ``rank``.

    The formats are the plugins' own dataclasses; the entry is found by walking them, so a third-party format
    is covered as long as its per-device entries carry a ``rank`` or ``rank_id`` field.
    """
    if not path:
        return {}
    out = {"file": path}
    try:
        with open(path, "rb") as fh:
            out["sha256"] = hashlib.sha256(fh.read()).hexdigest()[:16]
        fmt, table = load_rank_table(path, installed_formats())
    except (OSError, RankTableError) as exc:
        return {**out, "error": str(exc)[:200]}
    out.update(format=fmt.name, world_size=str(table.world_size()))
    hit = _find_rank(table, rank, "", {})
    if hit is None:
        out["entry"] = f"no entry for rank {rank}"
    else:
        where, fields = hit
        out["entry"] = f"{where}: " + " ".join(f"{k}={v}" for k, v in fields.items())
    return out


def _find_rank(node: Any, rank: int, where: str, context: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return None
    values = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    scalars = {k: str(v) for k, v in values.items()
               if isinstance(v, str | int) and not isinstance(v, bool) and k not in ("path", "version", "status")}
    if any(values.get(k) == rank and not isinstance(values.get(k), bool) for k in ("rank", "rank_id")):
        return where, {**context, **scalars}
    inner = {**context, **scalars} if where else context  # the table's own fields say nothing about a rank
    for name, value in values.items():
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                hit = _find_rank(item, rank, f"{where}.{name}[{i}]" if where else f"{name}[{i}]", inner)
                if hit is not None:
                    return hit
    return None


# ----------------------------------------------------------------------------------------------------- compare


def _env_of(name: str) -> Callable[[RankFacts], str]:
    return lambda f: f.env.get(name, "(unset)")


def _sdk(facts: RankFacts) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(facts.sdk.items()) if "." not in k) or "-"


def _check_on(facts: RankFacts) -> str:
    raw = facts.env.get("XCCL_CHECK", "").strip()
    return "off" if raw in ("", "0", "false") else "on"


#: ``(label, getter, status when ranks differ)``: what must be the same on every rank of a job. ``fail`` where a
#: difference breaks the job (or makes its results differ), ``warn`` where it is probably a mistake.
COMPARED: Final[tuple[tuple[str, Callable[[RankFacts], str], Status], ...]] = (
    ("WORLD_SIZE", lambda f: str(f.world_size), "fail"),
    ("torch", lambda f: f.torch, "fail"),
    ("xccl", lambda f: f.xccl, "fail"),
    ("plugin", lambda f: f.plugin, "fail"),
    ("plugin version", lambda f: f.plugin_dist, "fail"),
    ("vendor", lambda f: f.vendor, "fail"),
    ("backend", lambda f: f"{f.backend} ({f.mode})", "fail"),
    ("vendor SDK", _sdk, "fail"),
    ("rank table", lambda f: f.rank_table.get("sha256", f.rank_table.get("error", "(unset)")), "fail"),
    ("mismatch detector (XCCL_CHECK)", _check_on, "fail"),
    ("python", lambda f: f.python, "warn"),
    ("XCCL_TIMEOUT", _env_of("XCCL_TIMEOUT"), "warn"),
    ("XCCL_HEALTH_DEADLINE", _env_of("XCCL_HEALTH_DEADLINE"), "warn"),
    ("XCCL_LOSS_EXIT_AFTER", _env_of("XCCL_LOSS_EXIT_AFTER"), "warn"),
    ("MASTER_ADDR", _env_of("MASTER_ADDR"), "warn"),
    ("MASTER_PORT", _env_of("MASTER_PORT"), "warn"),
)


@final
@dataclass(frozen=True, slots=True)
class Difference:
    """One thing the ranks disagree on, or one rank-level defect (missing, duplicated, a shared device)."""

    what: str
    status: Status
    #: value -> ``{host: ranks}`` holding it (empty for rank-level defects, which say it in ``summary``).
    values: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    summary: str = ""

    def __str__(self) -> str:
        if self.summary:
            return self.summary
        return "; ".join(
            f"{value!r} on " + ", ".join(f"host {h} ({rank_list(r)})" for h, r in hosts.items())
            for value, hosts in self.values.items()
        )


@final
@dataclass(frozen=True, slots=True)
class WorldVerdict:
    """Rank 0's comparison of what every rank found."""

    ranks: tuple[RankFacts, ...]
    #: The world size: the largest ``WORLD_SIZE`` any rank was told.
    expected: int
    missing: tuple[int, ...]
    differences: tuple[Difference, ...]
    timeout: float

    @property
    def ok(self) -> bool:
        """Whether nothing was flagged (the exit status is 0)."""
        return not any(d.status == "fail" for d in self.differences)

    def hosts(self) -> dict[str, tuple[int, ...]]:
        """host -> its ranks, in rank order."""
        out: dict[str, list[int]] = {}
        for f in sorted(self.ranks, key=lambda f: (f.rank, f.pid)):
            out.setdefault(f.host, []).append(f.rank)
        return {h: tuple(r) for h, r in out.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok, "world_size": self.expected, "answered": len(self.ranks), "missing": list(self.missing),
            "timeout_s": self.timeout, "hosts": {h: list(r) for h, r in self.hosts().items()},
            "differences": [
                {"what": d.what, "status": d.status, "summary": str(d),
                 "values": {v: {h: list(r) for h, r in hosts.items()} for v, hosts in d.values.items()}}
                for d in self.differences
            ],
            "ranks": [f.to_dict() for f in sorted(self.ranks, key=lambda f: (f.rank, f.pid))],
        }


def rank_list(ranks: Sequence[int]) -> str:
    """``"rank 3"``, ``"ranks 0-2, 5"``."""
    items = sorted(set(ranks))
    runs = [[r for _, r in run] for _, run in itertools.groupby(enumerate(items), lambda p: p[1] - p[0])]
    spans = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(spans)


def compare(ranks: Sequence[RankFacts], timeout: float) -> WorldVerdict:
    """Every difference between ``ranks`` (what rank 0 gathered), and the ranks that are missing or doubled."""
    ordered = sorted(ranks, key=lambda f: (f.rank, f.pid))
    expected = max((f.world_size for f in ordered if f.world_size > 0), default=0)
    present = {f.rank for f in ordered}
    missing = tuple(r for r in range(expected) if r not in present)
    found: list[Difference] = []
    if missing:
        found.append(Difference("missing", "fail", summary=(
            f"missing: {rank_list(missing)} of {expected} never answered within {timeout:g} s (not started, "
            "crashed, an xccl without `doctor --world`, or pointed at another MASTER_ADDR/MASTER_PORT)")))
    for label, get, status in COMPARED:
        values: dict[str, dict[str, list[int]]] = {}
        for f in ordered:
            values.setdefault(get(f), {}).setdefault(f.host, []).append(f.rank)
        if len(values) > 1:
            found.append(Difference(label, status, {v: {h: tuple(r) for h, r in hs.items()} for v, hs in values.items()}))
    found += _rank_defects(ordered, expected)
    found += [Difference("problem", "fail", summary=f"rank {f.rank} (host {f.host}): {problem}")
              for f in ordered for problem in f.problems]
    return WorldVerdict(tuple(ordered), expected, missing, tuple(found), timeout)


def _rank_defects(ordered: Sequence[RankFacts], expected: int) -> list[Difference]:
    out: list[Difference] = []
    by_rank: dict[int, list[RankFacts]] = {}
    for f in ordered:
        by_rank.setdefault(f.rank, []).append(f)
    for rank, same in by_rank.items():
        if len(same) > 1:
            where = ", ".join(f"host {f.host} pid {f.pid}" for f in same)
            out.append(Difference("duplicate rank", "fail", summary=f"rank {rank} answered {len(same)} times ({where}): "
                                  "two processes were given the same RANK"))
        if not 0 <= rank < expected:
            out.append(Difference("rank out of range", "fail",
                                  summary=f"rank {rank} (host {same[0].host}) is outside [0, {expected})"))
    by_device: dict[tuple[str, str], list[int]] = {}
    for f in ordered:
        if f.device not in ("-", "?") and not f.device.startswith("cpu"):
            by_device.setdefault((f.host, f.device.split(" ")[0]), []).append(f.rank)
    for (host, device), ranks in by_device.items():
        if len(ranks) > 1:
            out.append(Difference("shared device", "fail", summary=f"{rank_list(ranks)} on host {host} would all "
                                  f"drive {device}: their LOCAL_RANKs repeat"))
    return out
