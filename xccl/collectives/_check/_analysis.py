"""Deciding from what the ranks published: pure functions, no store, no threads.

* :func:`compare_status`: a peer's published hashes against this rank's ring: agree up to a step, or differ.
* :func:`from_dumps`: every member's steps over a window in which two ranks' hashes diverged: the first step at
  which their calls differ, as a :class:`~._record.Verdict` naming each member's call.
* :func:`from_stalls`: the calls ranks have been waiting in: calls at the same step that differ, or ranks that
  wait for each other in different groups (a cycle of waits: nobody can ever complete).

Anything a peer sent that does not parse is ignored: a verdict is only ever drawn from two readable calls that
differ, never from a missing or late peer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, final

from . import _fingerprint as F
from ._record import Recorder, Verdict

__all__ = ["Cycle", "DumpRequest", "call_at", "compare_status", "from_dumps", "from_stalls", "parse_digest"]


def parse_digest(value: Any) -> int | None:
    """A digest sent as hex text, or None for anything else (a peer's record is untrusted input)."""
    try:
        return int(value, 16) if isinstance(value, str) and len(value) <= 16 else None
    except ValueError:
        return None


def call_at(text: Any, seq: int) -> F.Call | None:
    """The call at step ``seq`` of an encoded fingerprint window, or None where it does not decode."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return F.decode(text).at(seq)
    except (ValueError, UnicodeDecodeError):
        return None


def compare_status(rec: Recorder, status: Mapping[str, Any]) -> tuple[bool, int] | None:
    """(whether the hashes agree, at which step) for the latest step both know, or None if none is comparable."""
    candidates = []
    for pairs in (status.get("r"), status.get("c")):
        if isinstance(pairs, list):
            candidates += [p for p in pairs if isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)]
    for seq, value in sorted(candidates, key=lambda p: -p[0]):
        theirs, mine = parse_digest(value), rec.hash_at(seq)
        if theirs is not None and mine is not None:
            return theirs == mine, seq
    return None


# ----------------------------------------------------------------------------------------------------- dumps


def _steps(dump: Any) -> dict[int, tuple[int, str]] | None:
    """step -> (digest, text) of one member's dump, or None if unreadable."""
    if not isinstance(dump, dict) or not isinstance(dump.get("e"), list) or not isinstance(dump.get("t"), list):
        return None
    texts, out = dump["t"], {}
    for row in dump["e"]:
        if (isinstance(row, list) and len(row) == 3 and isinstance(row[0], int) and isinstance(row[2], int)
                and 0 <= row[2] < len(texts) and (d := parse_digest(row[1])) is not None):
            out[row[0]] = (d, texts[row[2]])
    return out


def reason_for(calls: Mapping[int, F.Call], members: tuple[int, ...], alias: dict[str, str]) -> str:
    """Why these members' calls at one step differ (``calls`` by global rank; some members may be missing)."""
    ordered = [calls[m] for m in members if m in calls]
    why = F.disagreement(ordered, alias, size=len(members)) if len(ordered) > 1 else None
    return why or "the ranks made different calls"


def from_dumps(name: str, members: tuple[int, ...], dumps: Mapping[int, Any], lo: int, hi: int,
               alias: dict[str, str]) -> Verdict | None:
    """The first step in ``lo..hi`` at which the members' recorded calls differ, as a verdict; None if none does."""
    steps = {m: s for m, d in dumps.items() if (s := _steps(d)) is not None}
    for seq in range(lo, hi + 1):
        here = {m: s[seq] for m, s in steps.items() if seq in s}
        if len({d for d, _ in here.values()}) < 2:
            continue
        calls = {m: c for m, (_, text) in here.items() if (c := call_at(text, seq)) is not None}
        described: dict[int, str] = {m: c.describe() for m, c in calls.items()}
        for m in members:
            if m not in described:
                last = dumps.get(m, {}).get("s") if isinstance(dumps.get(m), dict) else None
                described[m] = (f"no record of step #{seq} (its last step is #{last})" if isinstance(last, int)
                                else "did not answer")
        return Verdict((name,), f"{reason_for(calls, members, alias)} at step #{seq}", described)
    # No step in the window differs, yet the hashes at its end do: the first difference is older than the steps the
    # ranks still hold. Name what each rank called at the oldest step it does hold.
    ends = {parse_digest(d.get("h")) for d in dumps.values() if isinstance(d, dict) and d.get("h") is not None}
    if len(ends) > 1:
        oldest = {m: min(s) for m, s in steps.items() if s}
        described = {m: c.describe() for m, k in oldest.items() if (c := call_at(steps[m][k][1], k)) is not None}
        for m in members:
            described.setdefault(m, "did not answer")
        return Verdict((name,), f"the ranks' calls on this group differ before step #{lo} (further back than the "
                                "steps each rank keeps)", described)
    return None


# ----------------------------------------------------------------------------------------------------- stalls


@final
@dataclass(frozen=True, slots=True)
class DumpRequest:
    """Two stalled ranks' histories of a group differ before their stalled step: compare the steps in between."""

    group: str
    lo: int
    hi: int


@final
@dataclass(frozen=True, slots=True)
class Cycle:
    """Ranks waiting for each other: a verdict, once the same records are seen twice (none was stale)."""

    key: frozenset[tuple[int, int]]
    verdict: Verdict


def _waits(record: Any) -> list[dict[str, Any]]:
    """The well-formed waits of a stall record."""
    waits = record.get("w") if isinstance(record, dict) else None
    if not isinstance(waits, list):
        return []
    return [w for w in waits if isinstance(w, dict) and isinstance(w.get("g"), str) and isinstance(w.get("s"), int)
            and isinstance(w.get("m"), list) and all(isinstance(m, int) for m in w["m"])]


def _reached(record: Any, group: str) -> int:
    steps = record.get("q") if isinstance(record, dict) else None
    value = steps.get(group, -1) if isinstance(steps, dict) else -1
    return value if isinstance(value, int) else -1


def from_stalls(me: int, records: Mapping[int, Any], recs: Mapping[str, Recorder],
                agreed: Mapping[str, int]) -> Verdict | DumpRequest | Cycle | None:
    """What the stall records of ``me`` and the ranks it (transitively) waits for show.

    Args:
        me: this rank.
        records: global rank -> its stall record (``{"sid", "w": [{"g", "s", "m", "f", "h"}], "q": {group: step}}``).
        recs: this rank's recorders by group name (only groups this rank is in are compared step by step).
        agreed: group name -> the last step at which this rank's hash agreed with every stalled peer's.
    """
    # The same step of a group, stalled on several ranks: their calls and hashes must agree.
    for name, rec in recs.items():
        at: dict[int, dict[int, tuple[Any, Any]]] = {}
        for rank, record in records.items():
            for w in _waits(record):
                if w["g"] == name:
                    at.setdefault(w["s"], {})[rank] = (w.get("f"), parse_digest(w.get("h")))
        for seq, entries in sorted(at.items()):
            calls = {r: c for r, (text, _) in entries.items() if (c := call_at(text, seq)) is not None}
            if len(calls) > 1:
                forms = {F.digest(F.canonical(c, rec.alias)) for c in calls.values()}
                why = reason_for(calls, rec.members, rec.alias) if len(forms) > 1 else F.disagreement(
                    [calls[m] for m in rec.members if m in calls], rec.alias, size=rec.size)
                if why is not None:
                    return Verdict((name,), f"{why} at step #{seq}", {r: c.describe() for r, c in calls.items()})
            if len({h for _, h in entries.values() if h is not None}) > 1:
                return DumpRequest(name, agreed.get(name, -1) + 1, seq)
    return _cycle(me, records)


def _cycle(me: int, records: Mapping[int, Any]) -> Cycle | None:
    """A cycle of waits reachable from ``me``: r waits for q when q is a member of r's stalled group that has not
    reached r's step there, and q is itself stalled."""
    waits = {r: _waits(rec) for r, rec in records.items()}
    edges: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for r, ws in waits.items():
        edges[r] = [(q, w) for w in ws for q in w["m"] if q != r and q in waits and waits[q]
                    and _reached(records[q], w["g"]) < w["s"]]
    path: list[int] = []
    on_path: set[int] = set()
    done: set[int] = set()

    def visit(r: int) -> list[int] | None:
        path.append(r)
        on_path.add(r)
        for q, _ in edges.get(r, []):
            if q in on_path:
                return path[path.index(q):]
            if q not in done and (found := visit(q)) is not None:
                return found
        path.pop()
        on_path.discard(r)
        done.add(r)
        return None

    loop = visit(me) if waits.get(me) else None
    if loop is None:
        return None
    # Every rank that finds this cycle describes it alike (the first verdict published for its groups stands).
    start = loop.index(min(loop))
    loop = loop[start:] + loop[:start]
    steps = []
    for i, r in enumerate(loop):
        q = loop[(i + 1) % len(loop)]
        w = next(w for p, w in edges[r] if p == q)
        steps.append(f"rank {r} waits in group {w['g']!r} (step #{w['s']}) for rank {q}")
    calls: dict[int, str] = {}
    groups: list[str] = []
    for r, ws in waits.items():
        for w in ws:
            if w["g"] not in groups:
                groups.append(w["g"])
            if r not in calls and (c := call_at(w.get("f"), w["s"])) is not None:
                calls[r] = c.describe()
    reason = ", ".join(steps) + ": the ranks wait for each other in different groups (they issue collectives on " \
                                "different groups, or in a different order)"
    key = frozenset((r, int(records[r].get("sid", -1))) for r in loop)
    return Cycle(key, Verdict(tuple(sorted(groups)), reason, dict(sorted(calls.items()))))
