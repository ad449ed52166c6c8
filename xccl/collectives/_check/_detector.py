"""The detector's background thread: publishes this rank's rolling hashes, compares its neighbours', and answers
peers, all off the collective's critical path.

Each round (every ``interval``, or every ``fast`` seconds while something is being compared or waited for):

1. for each group whose step moved, publish ``(step, hash)`` of the last few steps and the checkpoints (one-way
   sets);
2. read, in one round trip, the event counter and the published hashes of this rank's two ring neighbours in
   each group (of every member, for a group whose call failed or stalled here);
3. compare: hashes equal at a step both know mean the histories agree up to it; different hashes start an
   *event* asking every member for its steps since the last agreement (:func:`~._analysis.from_dumps` then
   names the first step whose calls differ);
4. handle new events: dump the asked-for steps, analyse, or adopt a verdict someone published;
5. while a call here has waited longer than the stall threshold, publish the stall record and look at the
   records of the ranks it waits for (:func:`~._analysis.from_stalls`).

A verdict is published once per group (compare_set: the first wins) and adopted by every rank, which raises it
at its next call or from the wait it is in. Store errors (the store's host died) make the round give up quietly:
a dead peer or store never becomes a verdict.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import logging
import threading
import time
from typing import Any, Final, final

import torch.distributed as dist

from .._state import GROUPS
from . import _analysis as A
from ._channel import Channel
from ._record import DETECTOR, Config, Recorder, Stall, Verdict

__all__ = ["Detector"]

LOG = logging.getLogger("xccl")
#: Seconds the store's reads wait for a key the channel expects (a peer's dump, an event being written).
_STORE_WAIT: Final = 2.0
#: Stall records followed from one rank (a cap on the reads of one analysis).
_MAX_RECORDS: Final = 256


@final
class Detector:
    """The mismatch detector of this process (one per world): recorders, verdicts, and the background thread.

    Args:
        world: the world it serves (the thread stops when the process has another detector, or none).
        rank: this process's global rank.
        cfg: timing.
    """

    def __init__(self, world: Any, rank: int, cfg: Config) -> None:
        self.world: Final = world
        self.rank: Final = rank
        self.cfg: Final = cfg
        #: One slice of a watched wait, made once (a timedelta per call costs as much as the recording).
        self.piece: Final = _dt.timedelta(seconds=cfg.slice)
        self.chan: Final = Channel(rank, _STORE_WAIT)
        self.chan.announce()
        self.chan.add(self.chan.key("ev"), 0)
        self._main: Channel | None = None
        self.recs: Final[dict[Any, Recorder]] = {}
        self.by_name: Final[dict[str, Recorder]] = {}
        #: A verdict adopted and not yet raised on this rank (raised by the next call on any group).
        self.pending: Verdict | None = None
        #: Set once any verdict is adopted: the hot path then takes the slow one, which raises it.
        self.alarm = False
        self.stalls: Final[dict[Recorder, Stall]] = {}
        self.sid = 0
        self.wake: Final = threading.Event()
        self._lock: Final = threading.Lock()
        self._ev_seen = 0
        self._ev_missing_since = 0.0
        self._stall_published: tuple[Any, ...] = ()
        self._last_cycle: frozenset[tuple[int, int]] | None = None
        self._asked: dict[str, float] = {}
        #: (groups, reason) -> when a verdict naming only some members was first found (its conclusion waits).
        self._partial: dict[tuple[tuple[str, ...], str], float] = {}
        self._busy_until = 0.0
        #: Why the store cannot be used (then nothing is compared any more), or None.
        self.broken: str | None = None
        self._stopped = False
        self.thread: Final = threading.Thread(target=self._loop, name="xccl-check", daemon=True)
        self.thread.start()
        # Joined before the interpreter finalizes: a daemon thread frozen on its way back from a store call
        # (which releases the GIL in C++) aborts the process ("terminate called without an active exception").
        atexit.register(self.stop)

    def stop(self, timeout: float = _STORE_WAIT + 1.0) -> None:
        """Stop the background thread and wait for it (at most ``timeout`` seconds: a store call in progress)."""
        self._stopped = True
        self.wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    # ------------------------------------------------------------------------------------- main thread's side

    def recorder(self, st: Any) -> Recorder:
        """The recorder of group ``st`` (created on its first checked call)."""
        rec = self.recs.get(st)
        if rec is None:
            rec = Recorder(st)
            self.by_name[rec.name] = rec
            self.recs[st] = rec
        return rec

    def main_channel(self) -> Channel:
        """The main thread's own connection to the store."""
        if self._main is None:
            self._main = Channel(self.rank, _STORE_WAIT, epoch=self.chan.epoch)
        return self._main

    def error_for(self, rec: Recorder | None) -> Exception:
        """The mismatch to raise now: the group's own, else the one pending from another group."""
        v = rec.verdict if rec is not None and rec.verdict is not None else self.pending
        if v is self.pending:
            self.pending = None
        if v is None:  # raced with nothing: callers only ask when one is set
            return RuntimeError("xccl: no collective mismatch to report (internal error)")
        return v.error()

    def mark_stall(self, rec: Recorder, stall: Stall) -> None:
        """A call of ``rec`` has waited past the stall threshold: publish it and compare with every member."""
        self.stalls[rec] = stall
        rec.urgent = max(rec.urgent, stall.seq)
        self.wake.set()

    def clear_stall(self, rec: Recorder) -> None:
        """The stalled call completed: nothing about it is left to settle."""
        self.stalls.pop(rec, None)
        rec.settled = max(rec.settled, rec.urgent)
        self.wake.set()

    def hurry(self, seconds: float) -> None:
        """Run the background rounds at the fast pace for ``seconds`` (a call here is slow), starting now."""
        self._busy_until = max(self._busy_until, time.monotonic() + seconds)
        self.wake.set()

    def next_sid(self) -> int:
        """A new stall id."""
        self.sid += 1
        return self.sid

    def conclude(self, chan: Channel, verdict: Verdict) -> None:
        """Publish ``verdict`` unless one was published for its group already; adopt the one that stands."""
        stored = chan.first(chan.key("verdict", ",".join(sorted(verdict.groups))), verdict.payload())
        try:
            standing = Verdict.parse(stored)
        except ValueError:
            standing = verdict
        if stored == verdict.payload():
            gen = chan.add(chan.key("ev"), 1)
            chan.put(chan.key("ev", gen), stored)
        self.adopt(standing)

    def adopt(self, verdict: Verdict) -> None:
        """Make ``verdict`` this rank's for every group of it this rank is in."""
        with self._lock:
            touched = False
            for name in verdict.groups:
                rec = self.by_name.get(name)
                if rec is not None and rec.verdict is None:
                    rec.verdict = verdict
                    touched = True
                    self.alarm = True
            if touched and self.pending is None:
                self.pending = verdict
                LOG.error("xccl: collective mismatch on group %r: %s; %s", verdict.groups[0], verdict.reason,
                          "; ".join(f"rank {r}: {c}" for r, c in sorted(verdict.calls.items())))
        self.wake.set()

    def request_dump(self, chan: Channel, rec: Recorder, lo: int, hi: int) -> None:
        """Ask every member of ``rec``'s group for its steps ``lo..hi`` (at most once every few seconds)."""
        now = time.monotonic()
        if now - self._asked.get(rec.name, -1e9) < 5.0:
            return
        self._asked[rec.name] = now
        gen = chan.add(chan.key("ev"), 1)
        chan.put(chan.key("ev", gen), {"k": "d", "g": rec.name, "lo": max(lo, 0), "hi": hi})
        self._busy_until = now + 10.0
        self.wake.set()

    # ----------------------------------------------------------------------------------------- the thread

    def _loop(self) -> None:
        failures = 0
        complained = False
        while True:
            busy = bool(self.stalls) or time.monotonic() < self._busy_until or any(
                r.urgent > r.settled for r in list(self.recs.values()))
            self.wake.wait(self.cfg.fast if busy else self.cfg.interval)
            self.wake.clear()
            if self._stopped or DETECTOR.channel is not self:
                return  # exiting, xccl.shutdown, or another world
            try:
                self._round()
                failures = 0
            except RuntimeError as exc:  # the store: DistStoreError, DistNetworkError (its host is gone)
                failures += 1
                self.broken = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                LOG.debug("xccl mismatch detector: store error: %s", self.broken)
                # A lost connection does not come back (the store's host is gone, or the job is ending): stop
                # rather than fail again every round. A slow store gets a few more tries.
                if isinstance(exc, dist.DistNetworkError) or failures >= 5:
                    return
                time.sleep(min(1.0, self.cfg.interval))
            except Exception:  # a bug here must not kill the program it watches: say so once, keep going
                if not complained:
                    LOG.exception("xccl mismatch detector: internal error (detection may be incomplete)")
                    complained = True

    def _round(self) -> None:
        chan = self.chan
        live = {id(st) for st in list(GROUPS.groups.values())} | {id(GROUPS.default)}
        for st in [st for st in list(self.recs) if id(st) not in live]:  # destroyed groups
            self.by_name.pop(self.recs.pop(st).name, None)
        recs = [r for r in list(self.recs.values()) if r.size > 1 and r.verdict is None and not r.blind]
        for rec in recs:
            if rec.latest != rec.published:
                status = rec.status()  # hashes the steps recorded since the last round
                chan.put(chan.key("st", rec.name, self.rank), status)
                rec.published = status["s"]
        self._publish_stalls()
        plan: list[tuple[Recorder, int]] = []
        for rec in recs:
            urgent = rec.urgent > rec.settled
            plan += [(rec, q) for q in (rec.members if urgent else rec.neighbours) if q != self.rank]
        values = chan.fetch([chan.key("ev")] + [chan.key("st", rec.name, q) for rec, q in plan])
        if isinstance(values[0], int) and values[0] > self._ev_seen:
            self._events(values[0])
        for (rec, q), status in zip(plan, values[1:], strict=True):
            if isinstance(status, dict) and rec.verdict is None:
                self._compare(rec, q, status)
        for rec in recs:
            if rec.urgent > rec.settled and rec.verdict is None:
                self._settle(rec)
        if self.stalls:
            self._stall_round()

    def _compare(self, rec: Recorder, q: int, status: dict[str, Any]) -> None:
        if isinstance(status.get("s"), int):
            rec.seen[q] = status["s"]
        found = A.compare_status(rec, status)
        if found is None:
            return
        same, seq = found
        if same:
            rec.agreed[q] = max(rec.agreed.get(q, -1), seq)
        else:
            self.request_dump(self.chan, rec, rec.agreed.get(q, -1) + 1, seq)

    def _settle(self, rec: Recorder) -> None:
        """Whether every member agrees with this rank at its urgent step (or is dead): then a failure there is
        not a mismatch, and the failing call may be translated as it is."""
        step = rec.urgent
        behind = [q for q in rec.members if q != self.rank and rec.agreed.get(q, -1) < step]
        if not behind or len(self.chan.dead(behind)) == len(behind):
            rec.settled = step

    def _events(self, count: int) -> None:
        chan = self.chan
        for gen in range(self._ev_seen + 1, count + 1):
            (payload,) = chan.fetch([chan.key("ev", gen)])
            if payload is None:
                # Posted right after the counter moved: wait for it a little, then skip it.
                now = time.monotonic()
                if not self._ev_missing_since:
                    self._ev_missing_since = now
                if now - self._ev_missing_since < _STORE_WAIT:
                    return
            self._ev_missing_since = 0.0
            self._ev_seen = gen
            if not isinstance(payload, dict):
                continue
            if payload.get("k") == "v":
                try:
                    self.adopt(Verdict.parse(payload))
                except ValueError:
                    continue
            elif payload.get("k") == "d":
                self._dump(gen, payload)

    def _dump(self, gen: int, event: dict[str, Any]) -> None:
        rec = self.by_name.get(event.get("g"))  # type: ignore[arg-type]
        lo, hi = event.get("lo"), event.get("hi")
        if rec is None or rec.verdict is not None or not isinstance(lo, int) or not isinstance(hi, int) or hi < lo:
            return
        chan = self.chan
        chan.put(chan.key("dump", gen, self.rank), rec.dump(lo, hi))
        self._busy_until = time.monotonic() + 10.0
        keys = {q: chan.key("dump", gen, q) for q in rec.members}
        dumps: dict[int, Any] = {}
        deadline = time.monotonic() + max(_STORE_WAIT, 3 * self.cfg.interval)
        while True:
            missing = [q for q in rec.members if q not in dumps]
            for q, value in zip(missing, chan.fetch([keys[q] for q in missing]), strict=True):
                if value is not None:
                    dumps[q] = value
            if len(dumps) == rec.size or time.monotonic() > deadline or rec.verdict is not None or self._stopped:
                break
            time.sleep(self.cfg.fast)
        if rec.verdict is None:
            verdict = A.from_dumps(rec.name, rec.members, dumps, lo, hi, rec.alias)
            if verdict is not None:
                self.conclude(chan, verdict)

    # ------------------------------------------------------------------------------------------- stalls

    def _publish_stalls(self) -> None:
        stalls = list(self.stalls.items())
        current = tuple((rec.name, s.seq, s.sid) for rec, s in stalls)
        if current == self._stall_published:
            return
        record: dict[str, Any] = {}
        for rec, _ in stalls:
            rec.catch_up()
        if stalls:
            record = {
                "sid": max(s.sid for _, s in stalls),
                "w": [{"g": rec.name, "s": s.seq, "m": list(rec.members), "f": s.fp.text,
                       "h": f"{rec.hash_at(s.seq) or 0:x}"} for rec, s in stalls],
                "q": {rec.name: rec.latest for rec in list(self.recs.values())},
            }
        self.chan.put(self.chan.key("stall", self.rank), record)
        self._stall_published = current

    def _stall_round(self) -> None:
        chan = self.chan
        stalls = list(self.stalls.items())
        if not stalls:
            return
        records: dict[int, Any] = {}
        (records[self.rank],) = chan.fetch([chan.key("stall", self.rank)])
        frontier = {m for rec, _ in stalls for m in rec.members} - {self.rank}
        fetched = {self.rank}
        while frontier and len(fetched) < _MAX_RECORDS:
            ranks = sorted(frontier)[: _MAX_RECORDS - len(fetched)]
            fetched.update(ranks)
            frontier = set()
            for q, record in zip(ranks, chan.fetch([chan.key("stall", q) for q in ranks]), strict=True):
                waits = record.get("w") if isinstance(record, dict) else None
                if waits:
                    records[q] = record
                    frontier.update(m for w in waits if isinstance(w, dict) for m in w.get("m", [])
                                    if isinstance(m, int) and m not in fetched)
        agreed = {rec.name: min((rec.agreed.get(q, -1) for q in rec.members if q != self.rank), default=-1)
                  for rec, _ in stalls}
        found = A.from_stalls(self.rank, records, {rec.name: rec for rec, _ in stalls}, agreed)
        if isinstance(found, Verdict):
            # Name every member's call: a member whose record is not published yet gets a second to publish it.
            rec = self.by_name.get(found.groups[0])
            first = self._partial.setdefault((found.groups, found.reason), time.monotonic())
            if rec is None or len(found.calls) >= rec.size or time.monotonic() - first > 1.0:
                if rec is not None:
                    for m in rec.members:
                        found.calls.setdefault(m, "not known (it published no stalled call)")
                self.conclude(chan, found)
        elif isinstance(found, A.DumpRequest):
            rec = self.by_name.get(found.group)
            if rec is not None:
                self.request_dump(chan, rec, found.lo, found.hi)
        elif isinstance(found, A.Cycle):
            # Seen twice in a row (one fast period apart): no record in it was a stall that has just ended.
            if found.key == self._last_cycle:
                self.conclude(chan, found.verdict)
            self._last_cycle = found.key
        else:
            self._last_cycle = None
