"""What the main thread does with the store, on its slow paths: compare the first call of its kind before it
is issued (:func:`preflight`), and the errors a wait ends with when no mismatch explains it.

A call whose canonical fingerprint is new on its group is posted (``pre/<group>/<rank>``: step, digest, rolling
hash, fingerprint text) and compared with every member's step before it is issued. Members that see it as new
too post theirs; a member that does not (a mismatch, or a different history) is read from what its background
thread published. Ranks whose histories agree see the same calls as new, so matching calls pay this once per
distinct call, all together; every wait is sliced and bounded like a collective's.
"""

from __future__ import annotations

import time
from typing import Any, Final

from ...errors import CollectiveTimeout, PeerFailure, XcclError
from .._faults import classify, notify
from . import _fingerprint as F
from ._analysis import call_at, parse_digest, reason_for
from ._channel import Channel
from ._detector import Detector
from ._record import Recorder, Stall, Verdict

__all__ = ["behind", "preflight", "silent", "store_fault"]

_monotonic: Final = time.monotonic


def behind(rec: Recorder, seq: int) -> list[int]:
    """The members whose last published step is before ``seq`` (those not heard from are not named)."""
    return [q for q in rec.members if q != rec.me and rec.seen.get(q, seq) < seq]


def silent(rec: Recorder, seq: int, op: str, started: float, detail: str,
            ranks: list[int] | None = None) -> CollectiveTimeout:
    ranks = ranks if ranks is not None else behind(rec, seq) or [q for q in rec.members if q != rec.me]
    notify("CollectiveTimeout", rec.me, op, rec.name)  # the flight recorder dumps, here and on every rank
    return CollectiveTimeout(
        f"ranks {ranks} did not reach step #{seq} of this group ({detail}): they are hung, slow, dead, or busy in "
        "a collective of a group this rank is not in. Look at their logs and stacks (py-spy dump --pid ...)",
        rank=rec.me, op=op, group=rec.name, elapsed=_monotonic() - started,
    )


def preflight(det: Detector, rec: Recorder, seq: int, fp: F.Fp, op: str, started: float) -> None:
    """Compare the first call of its kind with every member's step ``seq`` before issuing it.

    Members that also see it as new post theirs (``pre/``); a member that does not (a mismatch, or a history
    that differs) is read from what its background thread published. Waits are sliced like a collective's.

    Raises:
        CollectiveMismatch: a member's call at this step differs (published for every member).
        CollectiveTimeout: a member did not reach this step within the timeout.
        PeerFailure: a member on this host died, or the store is gone.
    """
    chan = det.main_channel()
    cfg = det.cfg
    stall: Stall | None = None
    try:
        rec.catch_up()
        mine = rec.hash_at(seq)
        chan.put(chan.key("pre", rec.name, rec.me),
                 {"s": seq, "d": f"{fp.digest:x}", "h": None if mine is None else f"{mine:x}", "f": fp.text})
        calls: dict[int, F.Call] = {rec.me: fp.call.at(seq)}
        differs: float | None = None
        waiting = [q for q in rec.members if q != rec.me]
        pause, next_dead = 0.0005, started + 1.0
        while True:
            waiting, found, history = _read_peers(chan, rec, seq, fp, waiting, calls)
            if history:
                # The same call here, after different ones earlier: find those (the background thread reports).
                det.request_dump(chan, rec, min(list(rec.agreed.values()), default=-1) + 1, seq - 1)
            if found and differs is None:
                differs = _monotonic()
            now = _monotonic()
            if differs is not None and (not waiting or now - differs > min(1.0, cfg.stall)):
                _mismatch(det, chan, rec, seq, calls)
            if not waiting:
                if len(calls) == rec.size:  # every member posted: the rules of the asymmetric ops apply
                    why = F.disagreement([calls[m] for m in rec.members], rec.alias)
                    if why is not None:
                        _mismatch(det, chan, rec, seq, calls, why)
                return
            if rec.verdict is not None or det.pending is not None:
                raise det.error_for(rec)
            if stall is None and now - started > cfg.stall:
                stall = Stall(seq, fp, det.next_sid())
                det.mark_stall(rec, stall)
            if now > next_dead:
                next_dead = now + 1.0
                dead = chan.dead(waiting)
                if dead:
                    raise PeerFailure(
                        f"rank {dead[0]} (on this host) is dead: it exited while this rank waited for it at step "
                        f"#{seq} of the group. Its own log says why; the group cannot be used any more",
                        rank=rec.me, op=op, group=rec.name, elapsed=now - started,
                    )
            if now - started > cfg.timeout:
                raise silent(rec, seq, op, started, "the detector waited for their first call of this kind",
                              waiting)
            time.sleep(pause)
            pause = min(pause * 2, cfg.fast)
    except XcclError:
        raise
    except RuntimeError as exc:
        raise store_fault(exc, rec.me, rec.name, op, started) from exc
    finally:
        if stall is not None:
            det.clear_stall(rec)


def _read_peers(chan: Channel, rec: Recorder, seq: int, fp: F.Fp, waiting: list[int],
                calls: dict[int, F.Call]) -> tuple[list[int], bool, bool]:
    """Read what the members still waited for have posted or published: (still waiting, a call that differs,
    the same call after a history that differs)."""
    left: list[int] = []
    differs = history = False
    mine = rec.hash_at(seq)
    unposted: list[int] = []
    for q, pre in zip(waiting, chan.fetch([chan.key("pre", rec.name, q) for q in waiting]), strict=True):
        step = pre.get("s") if isinstance(pre, dict) else None
        if step == seq:
            call = call_at(pre.get("f"), seq)
            if call is not None:
                calls[q] = call
            same = parse_digest(pre.get("d")) == fp.digest
            differs |= not same
            theirs = parse_digest(pre.get("h"))
            history |= same and None not in (mine, theirs) and theirs != mine
        elif isinstance(step, int) and step > seq:
            pass  # it got past this step, so it compared its call with this rank's and found them equal
        else:
            unposted.append(q)
    for q, status in zip(unposted, chan.fetch([chan.key("st", rec.name, q) for q in unposted]), strict=True):
        pairs = status.get("r") if isinstance(status, dict) else None
        theirs = next((parse_digest(p[1]) for p in pairs or [] if isinstance(p, list) and len(p) == 2 and p[0] == seq), None)
        if theirs is None:
            left.append(q)  # not at this step yet
            continue
        # It made its call at this step without posting it: the call is not new to it. Its published text of
        # that call (while this is its last step) says whether the *call* differs; its hash only says that the
        # sequences differ somewhere up to here, which the background comparison locates.
        call = call_at(status.get("f"), seq) if status.get("s") == seq else None
        if call is not None and F.digest(F.canonical(call, rec.alias)) != fp.digest:
            differs = True
            calls[q] = call
        elif mine is not None and theirs != mine:
            history = True
    return left, differs, history


def _mismatch(det: Detector, chan: Channel, rec: Recorder, seq: int, calls: dict[int, F.Call],
              why: str | None = None) -> None:
    """Publish the members' calls at ``seq`` as a verdict and raise it (the calls differ)."""
    described = {m: c.describe() for m, c in calls.items()}
    for m in rec.members:
        described.setdefault(m, f"not known (it had not reached step #{seq} when this was found)")
    reason = why or reason_for(calls, rec.members, rec.alias)
    det.conclude(chan, Verdict((rec.name,), f"{reason} at step #{seq}", described))
    raise det.error_for(rec)


def store_fault(exc: RuntimeError, rank: int, group: str, op: str, started: float) -> XcclError:
    """A store error while checking: the store (hosted by rank 0, or torchrun's agent) is gone, or timed out."""
    where: dict[str, Any] = {"rank": rank, "op": op, "group": group, "elapsed": _monotonic() - started}
    if classify(str(exc)) is CollectiveTimeout:
        return CollectiveTimeout(f"the mismatch detector's store did not answer ({exc})", **where)
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    return PeerFailure(
        f"the mismatch detector lost the rendezvous store ({first}); it is hosted by rank 0 (MASTER_ADDR) or the "
        "launcher's agent, which probably died: look at its log",
        **where,
    )
