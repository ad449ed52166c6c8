"""``xccl trace DIR``: read a directory of flight-recorder dumps (xccl's, in torch's layout) and say, per group,
where the ranks stand, who is missing or ahead, where they called it, and who makes the others wait.

Pure Python over the pickled dicts (``xccl.collectives._flight_dump`` writes them); no torch.distributed, no
process group. Like torch's own analyzer, it unpickles the files: read only dumps you trust.

Straggler attribution uses the time each rank *entered* a call (``time_created_ns``): in a collective every rank
waits for the last to arrive, so per-rank durations cannot name it (they even out), but arrival times can. The
timestamps are each host's clock; ranks on one host share it. Across hosts, each rank's offset is estimated from
completion times (every rank of a synchronous collective leaves it at about the same moment) and subtracted.
"""

from __future__ import annotations

import os
import pickle
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, final

__all__ = ["GroupReport", "Lateness", "analyse", "load", "render"]

_RANK_SUFFIX: Final = re.compile(r"^(.*?)(\d+)$")


def load(directory: str | os.PathLike[str], prefix: str | None = None) -> dict[int, dict[str, Any]]:
    """Rank -> its dump, for the files of ``directory`` named ``<prefix><rank>``.

    Without ``prefix``, the one prefix every file shares (as torch's analyzer infers it).

    Raises:
        ValueError: no dump there, or files with several prefixes and none given.
    """
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and not p.name.endswith(".tmp"))
    if prefix is None:
        prefixes = {m.group(1) for p in files if (m := _RANK_SUFFIX.match(p.name))}
        if len(prefixes) != 1:
            raise ValueError(f"{directory}: cannot tell the dumps' prefix among {sorted(prefixes)}; pass -p PREFIX")
        prefix = prefixes.pop()
    dumps: dict[int, dict[str, Any]] = {}
    for p in files:
        if p.name.startswith(prefix) and p.name[len(prefix):].isdigit():
            with p.open("rb") as f:
                dumps[int(p.name[len(prefix):])] = pickle.load(f)
    if not dumps:
        raise ValueError(f"{directory}: no dump named {prefix}<rank>")
    return dumps


@final
@dataclass(frozen=True, slots=True)
class Lateness:
    """How often one rank entered a group's calls last, and by how much."""

    rank: int
    #: Calls it entered last, of the calls every member recorded (the last ``window``).
    last_in: int
    window: int
    #: Median, over those calls, of how much later than the next-to-last rank it entered (ms).
    by_ms: float


@final
@dataclass(frozen=True, slots=True)
class GroupReport:
    """One group, across the dumps."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    #: Members without a dump.
    no_dump: tuple[int, ...]
    #: Rank -> the last sequence number it completed, and the last it entered.
    completed: Mapping[int, int]
    entered: Mapping[int, int]
    #: The first call not completed everywhere (None: all done): its number, op, call sites (rank -> "file:line").
    stuck_seq: int | None = None
    stuck_op: str = ""
    stuck_sites: Mapping[int, str] = field(default_factory=dict)
    #: Members that never entered ``stuck_seq`` (missing), and members past it (ahead).
    missing: tuple[int, ...] = ()
    ahead: tuple[int, ...] = ()
    #: What each missing rank did last: rank -> "#seq op at file:line".
    missing_last: Mapping[int, str] = field(default_factory=dict)
    stragglers: tuple[Lateness, ...] = ()


def _site(entry: Mapping[str, Any]) -> str:
    frames = entry.get("frames") or []
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.get('filename', '?')}:{f.get('line', '?')}"


def _op(entry: Mapping[str, Any]) -> str:
    return str(entry.get("xccl_op") or str(entry.get("profiling_name", "?")).split(":", 1)[-1])


def _offsets(per_rank: Mapping[int, Mapping[int, Mapping[str, Any]]], hosts: Mapping[int, str]) -> dict[int, float]:
    """Rank -> its clock's offset (ns) from the first rank's, estimated from completion times (0 on one host)."""
    ranks = sorted(per_rank)
    ref = ranks[0]
    out = {}
    for r in ranks:
        if hosts.get(r) == hosts.get(ref):
            out[r] = 0.0
            continue
        diffs = [e["time_discovered_completed_ns"] - per_rank[ref][s]["time_discovered_completed_ns"]
                 for s, e in per_rank[r].items()
                 if s in per_rank[ref] and e.get("time_discovered_completed_ns")
                 and per_rank[ref][s].get("time_discovered_completed_ns")]
        out[r] = float(statistics.median(diffs)) if diffs else 0.0
    return out


def _stragglers(per_rank: Mapping[int, Mapping[int, Mapping[str, Any]]], members: Sequence[int],
                hosts: Mapping[int, str], window: int) -> tuple[Lateness, ...]:
    if len(members) < 2 or any(r not in per_rank for r in members):
        return ()
    common = sorted(set.intersection(*(set(per_rank[r]) for r in members)))[-window:]
    if not common:
        return ()
    offsets = _offsets({r: per_rank[r] for r in members}, hosts)
    lags: dict[int, list[float]] = {}
    for s in common:
        arrivals = sorted((per_rank[r][s]["time_created_ns"] - offsets[r], r) for r in members)
        (t2, _), (t1, last) = arrivals[-2], arrivals[-1]
        lags.setdefault(last, []).append((t1 - t2) / 1e6)
    out = [Lateness(r, len(x), len(common), statistics.median(x)) for r, x in lags.items()]
    return tuple(sorted(out, key=lambda x: (-x.last_in, -x.by_ms)))


def analyse(dumps: Mapping[int, Mapping[str, Any]], window: int = 100) -> list[GroupReport]:
    """Every group's report (:class:`GroupReport`), from rank -> dump."""
    configs: dict[str, Mapping[str, Any]] = {}
    for d in dumps.values():
        for name, cfg in d.get("pg_config", {}).items():
            configs.setdefault(str(name), cfg)
    hosts = {r: str(d.get("xccl", {}).get("host", "")) for r, d in dumps.items()}
    reports = []
    for name, cfg in sorted(configs.items()):
        members = tuple(int(x) for x in re.findall(r"-?\d+", str(cfg.get("ranks", ""))))
        per_rank: dict[int, dict[int, Mapping[str, Any]]] = {}
        for r in members:
            if r in dumps:
                per_rank[r] = {int(e["collective_seq_id"]): e for e in dumps[r].get("entries", [])
                               if str(e["process_group"][0]) == name and not e.get("is_p2p")}
        if not per_rank:
            continue
        completed = {r: max((s for s, e in es.items() if e.get("retired")), default=0) for r, es in per_rank.items()}
        entered = {r: max(es, default=0) for r, es in per_rank.items()}
        report = GroupReport(name, str(cfg.get("desc", "")), members, tuple(r for r in members if r not in dumps),
                             completed, entered, stragglers=_stragglers(per_rank, members, hosts, window))
        first_open = min(completed.values()) + 1
        if first_open <= max(entered.values()):
            at = {r: es[first_open] for r, es in per_rank.items() if first_open in es}
            missing = tuple(r for r in per_rank if first_open not in per_rank[r])
            some = next(iter(at.values()))
            report = replace(report, stuck_seq=first_open, stuck_op=_op(some),
                             stuck_sites={r: _site(e) for r, e in at.items()}, missing=missing,
                             ahead=tuple(r for r in per_rank if entered[r] > first_open),
                             missing_last={r: _last(per_rank[r]) for r in missing})
        reports.append(report)
    return reports


def _last(entries: Mapping[int, Mapping[str, Any]]) -> str:
    if not entries:
        return "no call on this group"
    s = max(entries)
    return f"#{s} {_op(entries[s])} at {_site(entries[s])}"


def render(reports: Sequence[GroupReport], min_share: float = 0.5) -> str:
    """The reports as text; a straggler is named when it entered last in at least ``min_share`` of the calls."""
    lines = []
    for g in reports:
        lines.append(f"group {g.name!r} ({g.desc or 'no description'}), ranks {list(g.ranks)}")
        if g.no_dump:
            lines.append(f"  no dump from ranks {list(g.no_dump)}")
        done = min(g.completed.values())
        lines.append(f"  every rank with a dump completed #{done}")
        if g.stuck_seq is not None:
            sites = sorted(set(g.stuck_sites.values()))
            lines.append(f"  #{g.stuck_seq} {g.stuck_op} not completed: entered by ranks {sorted(g.stuck_sites)} at "
                         f"{', '.join(sites)}")
            for r in g.missing:
                lines.append(f"  rank {r} never called #{g.stuck_seq} (its last call here: {g.missing_last[r]})")
            if g.ahead:
                lines.append(f"  ahead of it: ranks {list(g.ahead)} (last entered: "
                             f"{', '.join(f'{r}: #{g.entered[r]}' for r in g.ahead)})")
        for s in g.stragglers:
            if s.last_in >= min_share * s.window:
                lines.append(f"  straggler: rank {s.rank} entered last by {s.by_ms:.1f} ms on group {g.name!r} in "
                             f"{s.last_in} of the last {s.window} calls")
    return "\n".join(lines)
