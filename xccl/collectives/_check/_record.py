"""What each rank keeps of its own calls: a bounded ring of interned fingerprints and a rolling hash per group.

Recording is local and costs no communication: the call's key is looked up among the group's interned
fingerprints (:class:`~._fingerprint.Fp`), the fingerprint goes into a ring of the last :data:`RING` calls, and
the group's step counter advances. The main thread is the only writer; the rolling hash of the sequence (built
from each call's canonical digest) is computed from the ring by its readers: the detector's thread, and the main
thread on its slow paths. No lock, no allocation, no string formatted per call.

Also here: the detector's settings (:class:`Config`), and a :class:`Verdict`, a found mismatch as every rank
reports it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Final, final

from ...errors import CollectiveMismatch
from ...ops._settings import seconds
from .._faults import notify
from .._state import PROCESS, Part
from . import _fingerprint as F

__all__ = ["DETECTOR", "RING", "Config", "DetectorPart", "Recorder", "Stall", "Verdict", "config"]

LOG = logging.getLogger("xccl")
#: Calls kept per group (a power of two): how far back a mismatch can be located, how far ranks' published
#: positions may drift apart and still be compared exactly, and how many calls may go by between two hashings.
RING: Final = 16384
RMASK: Final = RING - 1
#: Every CHECKPOINT-th step's hash is kept longer, for ranks whose published positions drift further apart; the
#: main thread also wakes the detector's thread every CHECKPOINT calls, so that it hashes well before the ring laps.
CHECKPOINT: Final = 4096
CPMASK: Final = CHECKPOINT - 1
_CHECKPOINTS: Final = 16
#: An odd 64-bit multiplier: h' = (h ^ digest) * P mod 2**64 is invertible in h, so histories that differ anywhere
#: give different hashes (up to a 2**-64 chance).
PRIME: Final = 0x100000001B3
M64: Final = (1 << 64) - 1
#: Distinct calls interned per group before the table starts over (every rank starts over at the same step).
_MAX_INTERNED: Final = 1024
ADVICE: Final = (
    "Every rank of a group must issue the same collectives in the same order, with the same shapes, dtypes, "
    "reduce op and root; look for a rank-dependent branch around these calls"
)


@final
@dataclass(frozen=True, slots=True)
class Config:
    """The detector's timing, from the collective timeout and the environment."""

    #: The collective timeout (seconds).
    timeout: float
    #: A wait longer than this makes the rank publish what it waits in and compare with its peers.
    stall: float
    #: Seconds between two background comparisons of the rolling hashes.
    interval: float
    #: The background thread's period while something is being compared or waited for.
    fast: float = 0.05
    #: Length of one slice of a watched wait: how soon a waiting rank sees a verdict.
    slice: float = 0.05


def config(timeout: float) -> Config:
    """Settings for a collective timeout of ``timeout`` seconds.

    ``XCCL_CHECK_STALL`` (default ``min(2, timeout / 4)``) and ``XCCL_CHECK_INTERVAL`` (default 0.5) override the
    stall threshold and the period of the background comparison.

    Raises:
        InitError: one of them is not a positive number.
    """
    stall = seconds("XCCL_CHECK_STALL", min(2.0, timeout / 4))
    interval = seconds("XCCL_CHECK_INTERVAL", 0.5)
    return Config(timeout, stall, interval, fast=min(0.05, interval), slice=min(0.05, stall / 4))


@final
@dataclass(slots=True)
class Stall:
    """A call this rank has waited in for longer than the stall threshold."""

    seq: int
    fp: F.Fp
    #: Counts this rank's stalls, so that a peer can tell a new stall from an old record.
    sid: int


@final
@dataclass(slots=True)
class Verdict:
    """A mismatch, as found by some rank and reported by all: the same text everywhere."""

    #: The groups whose sequences it breaks (two for ranks waiting for each other in different groups).
    groups: tuple[str, ...]
    reason: str
    #: Global rank -> what it called.
    calls: dict[int, str]
    #: Set once this rank has raised it (later calls on the groups raise it again, marked as such).
    raised: bool = field(default=False)

    def error(self) -> CollectiveMismatch:
        """The exception to raise for it."""
        again = (" (reported earlier: the group cannot be used any more; restart the job or create a new group)"
                 if self.raised else "")
        if not self.raised:  # the flight recorder dumps, here and on every rank
            notify("CollectiveMismatch", -1 if PROCESS.world is None else PROCESS.world.rank, "", self.groups[0])
        self.raised = True
        return CollectiveMismatch(f"{self.reason}{again}. {ADVICE}", group=self.groups[0], calls=self.calls)

    def payload(self) -> dict[str, Any]:
        """What travels to peers (JSON)."""
        calls = {str(r): c for r, c in self.calls.items()}
        return {"k": "v", "g": list(self.groups), "why": self.reason, "calls": calls}

    @classmethod
    def parse(cls, data: Any) -> Verdict:
        """The inverse of :meth:`payload`.

        Raises:
            ValueError: not a verdict.
        """
        if not isinstance(data, dict) or data.get("k") != "v":
            raise ValueError("not a verdict")
        groups, why, calls = data.get("g"), data.get("why"), data.get("calls")
        if not (isinstance(groups, list) and groups and all(isinstance(g, str) for g in groups)
                and isinstance(why, str) and isinstance(calls, dict)):
            raise ValueError("malformed verdict")
        return cls(tuple(groups), why[:2000], {int(r): str(c)[:500] for r, c in list(calls.items())[:1024]})


class Recorder:
    """One group's record on this rank (created on its first checked call).

    The main thread only writes ``ring[step % RING] = fingerprint`` and advances the group's step counter; the
    rolling hash is computed by whoever reads (:meth:`catch_up`, under a lock: the detector's thread every round,
    the main thread on its slow paths), so the hot path does no arithmetic on 64-bit integers.
    """

    __slots__ = (
        "agreed", "alias", "blind", "canon", "cps", "fps", "h", "hashed", "hashes", "lock", "me", "members", "name",
        "neighbours", "published", "ring", "seen", "seq", "settled", "size", "st", "urgent", "verdict",
    )

    def __init__(self, st: Any) -> None:
        #: The group's dispatch state.
        self.st: Final = st
        #: The step counter (the group's calls recorded so far), advanced by the main thread.
        self.seq = 0
        self.name: Final[str] = str(st.name)
        self.size: Final[int] = st.size
        #: Global ranks of the members, in group-rank order, and this rank's.
        self.members: Final[tuple[int, ...]] = tuple(st.ranks)
        self.me: Final[int] = st.ranks[st.rank]
        n, r = st.size, st.rank
        #: The members whose published hashes the background round reads: the ring neighbours (if every
        #: adjacent pair agrees, all do).
        self.neighbours: Final = tuple(sorted({self.members[(r + 1) % n], self.members[(r - 1) % n]} - {self.me}))
        self.alias: Final = F.aliases(st.table)
        self.fps: Final[dict[tuple[Any, ...], F.Fp]] = {}
        #: Canonical digests seen on this group: a call whose digest is new here is checked before it is issued.
        self.canon: Final[set[int]] = set()
        #: step % RING -> the call's fingerprint (the main thread's only per-call write).
        self.ring: Final[list[F.Fp | None]] = [None] * RING
        #: step % RING -> the rolling hash after that step, for steps up to ``hashed``.
        self.hashes: Final[list[int]] = [0] * RING
        self.hashed = -1
        #: The rolling hash after step ``hashed`` (0 before the first call).
        self.h = 0
        self.cps: Final[dict[int, int]] = {}
        self.lock: Final = threading.Lock()
        #: Set if calls went unhashed (more than RING between two catch-ups): this rank no longer compares hashes
        #: on the group (a hash it cannot compute must not look like a mismatch).
        self.blind = False
        #: The mismatch found on this group, raised by every later call on it.
        self.verdict: Verdict | None = None
        #: Peer -> the last step at which its hash equalled this rank's (the detector thread's).
        self.agreed: Final[dict[int, int]] = {}
        #: Peer -> the last step it published, as last read (detector thread).
        self.seen: Final[dict[int, int]] = {}
        #: The last step this rank published (detector thread).
        self.published = -2
        #: The step of a failed or stalled call that wants every member compared now (main thread sets it).
        self.urgent = -1
        #: The last step that every member is known to agree on or be dead at (detector thread).
        self.settled = -1

    def intern(self, key: tuple[Any, ...], call: F.Call) -> tuple[F.Fp, bool]:
        """Intern a call seen for the first time with this key; also whether its canonical form is new here."""
        if len(self.canon) >= _MAX_INTERNED:
            # Every rank with the same history starts over at the same step, so novelty stays consistent.
            self.fps.clear()
            self.canon.clear()
        elif len(self.fps) >= 4 * _MAX_INTERNED:
            # Many keys, few canonical forms (uneven all_to_all sizes that change every step): the keys are a
            # local cache only, dropping them changes nothing a peer sees.
            self.fps.clear()
        fp = self.fps[key] = F.intern(call, self.alias)
        novel = fp.digest not in self.canon
        self.canon.add(fp.digest)
        return fp, novel

    def record(self, fp: F.Fp) -> int:
        """Record a call (what the hot path does inline); returns its step."""
        seq = self.seq
        self.ring[seq & RMASK] = fp
        self.seq = seq + 1  # after the ring write: a reader that sees the step sees its entry
        return seq

    # ---------------------------------------------------------------------- reads (any thread, after catch_up)

    @property
    def latest(self) -> int:
        """The last recorded step (-1 before any)."""
        return self.seq - 1

    def catch_up(self) -> int:
        """Hash the steps recorded since the last catch-up; the last step hashed."""
        with self.lock:
            latest = self.latest
            if self.blind or latest == self.hashed:
                return self.hashed
            start = self.hashed + 1
            if latest - start >= RING:
                return self._lost(latest)
            h, ring, hashes = self.h, self.ring, self.hashes
            for seq in range(start, latest + 1):
                fp = ring[seq & RMASK]
                if fp is None:
                    return self._lost(latest)
                h = ((h ^ fp.digest) * PRIME) & M64
                hashes[seq & RMASK] = h
                if not seq & CPMASK:
                    self.cps[seq] = h
                    if len(self.cps) > _CHECKPOINTS:
                        del self.cps[min(self.cps)]
            if self.latest - RING >= start:  # the main thread lapped the ring while this ran
                return self._lost(latest)
            self.h, self.hashed = h, latest
            return latest

    def _lost(self, latest: int) -> int:
        self.blind = True
        self.hashed = latest
        LOG.warning("xccl mismatch detector: more than %d calls on group %r went unhashed; it stops comparing this "
                    "group's sequence (calls new on the group are still compared before they are issued)", RING,
                    self.name)
        return latest

    def fp_at(self, seq: int) -> F.Fp | None:
        """The fingerprint of step ``seq``, if the ring still holds it."""
        return self.ring[seq & RMASK] if seq >= 0 and self.latest - RING < seq <= self.latest else None

    def hash_at(self, seq: int) -> int | None:
        """The rolling hash after step ``seq`` (0 at step -1), if this rank knows it (as of the last catch-up)."""
        if seq == -1:
            return 0
        if self.blind:
            return None
        hashed = self.hashed
        if hashed - RING < seq <= hashed and self.latest - RING < seq:
            return self.hashes[seq & RMASK]
        return self.cps.get(seq) if seq <= hashed else None

    def status(self) -> dict[str, Any]:
        """What this rank publishes for the group: its last step and hash, the few before, the checkpoints."""
        hashed = self.catch_up()
        recent = [[s, f"{h:x}"] for s in range(hashed, max(hashed - 8, -1), -1) if (h := self.hash_at(s)) is not None]
        last = self.fp_at(hashed)
        return {
            "s": hashed,
            "r": recent,
            "c": [[s, f"{h:x}"] for s, h in sorted(self.cps.items())],
            "f": last.text if last is not None else "",
        }

    def dump(self, lo: int, hi: int) -> dict[str, Any]:
        """Steps ``lo..hi`` this rank still holds: ``[step, digest, text index]`` and the distinct texts."""
        hashed = self.catch_up()
        texts: dict[str, int] = {}
        rows = []
        for seq in range(max(lo, hashed - RING + 1, 0), min(hi, hashed) + 1):
            fp = self.fp_at(seq)
            if fp is not None:
                rows.append([seq, f"{fp.digest:x}", texts.setdefault(fp.text, len(texts))])
        end = self.hash_at(hi)
        return {"e": rows, "t": list(texts), "s": hashed, "h": None if end is None else f"{end:x}"}


@dataclass
class DetectorPart(Part):
    """The mismatch detector's part of the process state."""

    #: The detector (its recorders, store channel and background thread), once started.
    channel: Any = None


DETECTOR: Final = Part.register(DetectorPart())
