"""Who is gone, when a peer's connection closes: the ranks a :class:`~xccl.PeerFailure` names.

gloo reports a lost peer as "Connection closed by peer [addr]:port" on whichever connection noticed first, and
once the first survivors fail they close connections of their own: the address quoted is not reliably the lost
rank's, and the error carries no rank. So at ``xccl.init`` every rank of a world of more than one publishes its
:class:`~._facts.Facts` in the rendezvous store (``xccl.runtime._rendezvous``, which also compares them) and opens a
*liveness port*: a listening TCP socket that answers without the process doing anything. The kernel completes a
connection to it for as long as the process lives, and refuses it once the process is gone: a rank stuck in a
collective, or holding the GIL, still answers. (The sentinel, ``._sentinel``, accepts on it: its neighbours'
connections, whose reset tells them at once that the process ended, and the probes, which it closes.) At a closed
connection, :func:`lost_peers`:

1. reaches the store (a bare TCP connect first, bounded by :func:`look_wait`, so that a store whose host is gone
   costs no more than that);
2. store reachable: marks this rank a survivor, reads the facts of the group's other members and the survivors'
   marks, and probes the liveness ports of the members not marked. A refused connection means the process is
   gone while its host is up; no answer means the host is down or cut off. Survivors that already exited after
   their own failure are marked, so they are not named;
3. store unreachable: its host is the one knowable suspect. The ranks on the store's host (recorded at init: the
   ranks whose address to the store is the store's own, or rank 0 when rank 0's process hosted it) are probed and
   named; nothing can be said about the others without the store.

Only the failure path pays: opening the port is one ``listen`` at init, and nothing runs until a fault, or until a
call has waited past the health watch's deadline (:func:`watch_look`, ``._watch``). The verdict is computed once per
group's member set and reused by every later fault of the process (the watch's only once it names ranks).

**Every survivor names the same ranks.** Survivors look independently and a moment apart, so two could see
different pictures (a host whose processes end one after another). The first survivor to find ranks gone publishes
its verdict (``verdict/<members>``, compare-and-set: the first writer wins) and every later look adopts it, so
``PeerFailure.ranks`` is one set on every survivor: what ``dist.shrink_group(err.ranks)`` needs
(``xccl.runtime._shrink``).

Store keys, under ``xccl/world/<restart>.<generation>/`` (the prefix is :attr:`Liveness.prefix`)::

    rank/<rank>     the rank's Facts (JSON), set once at init   read at a fault, and by ``xccl doctor --world``
    log             every rank's Facts, one line each (append)  read when init fails, to say who differs / is missing
    ref             the world view of the first rank to arrive
    count           ranks arrived; full/<n>: set when n arrived; bad: the rank that found a disagreement
    storehost       Facts of the ranks on the store's host, one line each
    survivors       "<rank>," for every rank that saw a peer fail
    verdict/<ms>    the first verdict that named lost ranks of member set <ms> ("0,1,2,3"): JSON ranks + text
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import selectors
import socket
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, final

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from .._state import PROCESS
from ._facts import Facts, describe_ranks

__all__ = [
    "ALIVE", "Liveness", "Verdict", "alarms", "close_quietly", "lost_peers", "look_wait", "open_port", "probe",
    "probeable", "route_address", "watch_look",
]

#: The longest one step of a look takes (store connect, port probes), and the shortest.
_WAIT_MAX: Final = 2.0
_WAIT_MIN: Final = 0.3
#: Once a rank is found gone, how long the other ranks of its host get to be found gone too; while none is, how
#: long the look goes on probing (see :func:`_settled`).
_SETTLE: Final = 0.3
_NOTHING: Final = 0.5
#: The longest connecting to a store that answered the probe may take.
_CONNECT: Final = 0.5

# Probe outcomes.
ALIVE: Final = "alive"
GONE: Final = "gone"  # the host answers, the port is closed: the process ended
SILENT: Final = "silent"  # no answer in time: the host is down or cut off
UNKNOWN: Final = "unknown"  # cannot be probed from here (a loopback address of another host)


# ------------------------------------------------------------------------------------------------ the port


def route_address(host: str, port: int) -> tuple[str, int]:
    """This machine's address on the route to ``host`` (no packet is sent), and its address family."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return str(s.getsockname()[0]), int(family)


def open_port(family: int = socket.AF_INET) -> socket.socket:
    """A listening socket on every address of ``family``, that answers for the process (see the module docstring)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        # Each survivor may probe each rank once per fault: the backlog holds those connections.
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def look_wait(timeout: _dt.timedelta) -> float:
    """How long one step of a look may take: a quarter of the timeout, within [0.3, 2] s."""
    return min(_WAIT_MAX, max(_WAIT_MIN, timeout.total_seconds() / 4))


def _close_in_child(ref: weakref.ref[Liveness]) -> None:
    live = ref()
    if live is not None:
        live.sock.close()  # only the port: the sentinel's goodbye would speak for the parent (``_sentinel``)


@final
class Liveness:
    """This rank's liveness port, and what it needs at a fault: the store's address, and the ranks on its host.

    Held in ``PROCESS.liveness`` from ``xccl.init`` to ``xccl.shutdown`` (which closes it).

    Args:
        sock: the liveness port (:func:`open_port`).
        rank: this rank.
        store: ``(address, port)`` of the rendezvous store.
        prefix: the store prefix of this world's keys.
        hosted_by: who runs the store, for messages (``"rank 0's process"``, ``"torchrun's agent"``).
        store_peers: Facts of the ranks on the store's host.
        wait: :func:`look_wait` of the world's timeout.
    """

    __slots__ = ("__weakref__", "hosted_by", "prefix", "rank", "sentinel", "sock", "store", "store_peers", "verdicts",
                 "wait")

    def __init__(self, sock: socket.socket, rank: int, store: tuple[str, int], prefix: str, hosted_by: str,
                 store_peers: Sequence[Facts], wait: float) -> None:
        self.sock = sock
        self.rank: Final = rank
        self.store: Final = store
        self.prefix: Final = prefix
        self.hosted_by: Final = hosted_by
        self.store_peers: Final = {f.rank: f for f in store_peers}
        self.wait: Final = wait
        #: Sorted member tuple -> the verdict already reached for it.
        self.verdicts: dict[tuple[int, ...], Verdict] = {}
        #: The neighbours' connections (``_sentinel.Sentinel``), once every rank has published its Facts.
        self.sentinel: Any = None
        # A forked child (a DataLoader worker) would keep the port open after this process died: close its copy.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=partial(_close_in_child, ref))

    def close(self) -> None:
        """Leave on purpose: the sentinel says goodbye to its neighbours, then the port closes."""
        self.leave()
        self.sock.close()

    def leave(self) -> None:
        """Stop the sentinel with a goodbye (the shrink's old world; :meth:`close`); the port stays open. A look of
        the sentinel's under way (at most three look steps) ends first: not at interpreter exit, not after a shrink
        has restarted the device."""
        sentinel, self.sentinel = self.sentinel, None
        if sentinel is not None:
            sentinel.stop(self.wait * 3 + 1)


# ------------------------------------------------------------------------------------------------ probing


def probe(targets: Mapping[int, tuple[str, int]], wait: float) -> dict[int, str]:
    """Connect to every ``(address, port)`` at once; rank -> :data:`ALIVE`, :data:`GONE` or :data:`SILENT`
    (:data:`UNKNOWN`: the host does not resolve). A host may be a name: the store's is ``MASTER_ADDR`` as given,
    ``localhost`` under ``torchrun --standalone``; every path that knocks on it comes here."""
    states: dict[int, str] = {}
    pending: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    try:
        for r, (addr, port) in targets.items():
            try:
                family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
                s = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                states[r] = UNKNOWN
                continue
            s.setblocking(False)
            err = s.connect_ex(sockaddr)
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                pending[r] = s
                sel.register(s, selectors.EVENT_WRITE, r)
            else:
                states[r] = _outcome(err)
                s.close()
        deadline = time.monotonic() + wait
        while pending and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                r = key.data
                s = pending.pop(r)
                states[r] = _outcome(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
                sel.unregister(s)
                s.close()
    finally:
        for r, s in pending.items():
            states[r] = SILENT
            s.close()
        sel.close()
    return states


def _outcome(err: int) -> str:
    if err == 0:
        return ALIVE
    # Refused: the host's kernel answered for a port no process holds any more.
    return GONE if err == errno.ECONNREFUSED else SILENT


def probeable(f: Facts) -> bool:
    # A loopback address names the prober's own machine unless the rank runs there.
    loopback = f.addr.startswith("127.") or f.addr == "::1"
    return f.port > 0 and (not loopback or f.host == socket.gethostname())


# ------------------------------------------------------------------------------------------------ the look


@final
@dataclass(frozen=True, slots=True)
class Verdict:
    """What a look found: a sentence for the error, and the global ranks found lost (gone or silent)."""

    text: str
    #: Sorted; empty when none was found (the sentence says what was seen instead).
    ranks: tuple[int, ...] = ()
    #: Whether the store answered: then every survivor has the same ``ranks``, and the store a shrink needs is up.
    agreed: bool = True


def lost_peers(members: Sequence[int]) -> Verdict | None:
    """The :class:`Verdict` on ``members`` (global ranks), or None when xccl cannot look (a world it adopted, of
    one rank, or without a TCP store). Bounded by about three :func:`look_wait` steps. Every survivor that reaches
    the store gets the same ranks (see the module docstring)."""
    live = PROCESS.liveness
    if not isinstance(live, Liveness):
        return None
    key = tuple(sorted(members))
    if key not in live.verdicts:
        live.verdicts[key] = _look(live, [r for r in key if r != live.rank], key)
    return live.verdicts[key]


def alarms() -> int:
    """How many losses and alarms this process's sentinel has heard (``_sentinel``): the health watch looks when
    the count moves. 0 without a sentinel."""
    live = PROCESS.liveness
    sentinel = live.sentinel if isinstance(live, Liveness) else None
    return 0 if sentinel is None else int(sentinel.alarms)


def known_loss(key: tuple[int, ...]) -> Verdict | None:
    """The verdict naming lost ranks that this process already holds for the group of ``key`` (its sorted global
    ranks), or None: no look. A verdict on a larger group (the world's, which the sentinel looks at) that names
    members of this one is this group's too: the same on every survivor, as the larger one is."""
    live = PROCESS.liveness
    if not isinstance(live, Liveness) or not live.verdicts:
        return None
    known = live.verdicts.get(key)
    if known is not None:
        return known if known.ranks else None
    for members, verdict in list(live.verdicts.items()):  # the sentinel's thread may add one meanwhile
        lost = tuple(r for r in verdict.ranks if r in key)
        if lost and set(key) <= set(members):
            return Verdict(verdict.text, lost, verdict.agreed)
    return None


def watch_look(members: Sequence[int], *, reset: bool = False) -> Verdict | None:
    """The health watch's look at ``members`` (``_health``): the verdict when a member is found lost or another
    survivor published one, else None. Unlike :func:`lost_peers` it marks this rank a survivor and keeps the
    verdict only when ranks are named (the call it watches may yet complete), and probes once while nothing is
    found gone; with ``reset`` (the sentinel read a connection's reset: a process is ending) it probes on for a
    while, as at a backend's fault (a process under load closes its sockets one after another)."""
    live = PROCESS.liveness
    if not isinstance(live, Liveness):
        return None
    key = tuple(sorted(members))
    known = live.verdicts.get(key)
    if known is None or not known.ranks:
        known = _look(live, [r for r in key if r != live.rank], key, watch=True, nothing=_NOTHING if reset else 0.0)
        if not known.ranks:
            return None
        live.verdicts[key] = known
    return known


def _agreed(store: Any, key: tuple[int, ...], mine: Verdict) -> Verdict:
    """The group's verdict: the first one published that named lost ranks (``mine`` if it is the first)."""
    name = "verdict/" + ",".join(map(str, key))
    try:
        if mine.ranks:
            raw = store.compare_set(name, "", json.dumps({"ranks": list(mine.ranks), "text": mine.text}))
        elif store.check([name]):
            raw = store.get(name)
        else:
            return mine
        data = json.loads(raw)
        ranks = tuple(sorted(int(r) for r in data["ranks"]))
        text = str(data["text"])
    except (RuntimeError, ValueError, KeyError, TypeError):  # the store went away, or a malformed record
        return mine
    if ranks == mine.ranks:
        return mine
    return Verdict(f"{text} (as the first survivor to look found it)", ranks)


def _look(live: Liveness, others: list[int], key: tuple[int, ...] = (), watch: bool = False,
          nothing: float = _NOTHING) -> Verdict:
    started = time.monotonic()
    addr, port = live.store
    store_state = probe({-1: (addr, port)}, live.wait).get(-1, UNKNOWN)
    store: Any = None
    why = {GONE: "connection refused", SILENT: f"no answer within {live.wait:g} s",
           UNKNOWN: f"its address {addr!r} does not resolve"}.get(store_state, "")
    if store_state == ALIVE:
        try:
            # Connecting retries a refused port until the timeout: a store that was dying at the probe must not
            # cost more than _CONNECT. Reads then get the full step.
            raw = dist.TCPStore(addr, port, is_master=False, timeout=_dt.timedelta(seconds=min(_CONNECT, live.wait)),
                                wait_for_workers=False)
            raw.set_timeout(_dt.timedelta(seconds=live.wait))
            store = PrefixStore(live.prefix, raw)
            if not watch:
                store.append("survivors", f"{live.rank},")
            facts = {f.rank: f for f in map(Facts.decode, store.multi_get([f"rank/{r}" for r in others]))
                     if f is not None}
            survivors = _survivors(store)
        except RuntimeError as exc:  # the store went away in between, or timed out
            store, why = None, _reason(exc, live.wait)
    if store is None:
        return _without_store(live, why, started)
    verdict = _agreed(store, key, _found(store, live, others, facts, survivors, started, nothing))
    if watch and verdict.ranks:
        with contextlib.suppress(RuntimeError):
            store.append("survivors", f"{live.rank},")  # before it raises, as lost_peers marks
    return verdict


def _found(store: Any, live: Liveness, others: list[int], facts: dict[int, Facts], survivors: set[int],
           started: float, nothing: float = _NOTHING) -> Verdict:
    suspects = {r: f for r, f in facts.items() if r not in survivors and probeable(f)}
    states = _settled(suspects, live.wait, nothing)
    # A survivor marks itself before it raises, and closes its port only after (at exit or xccl.shutdown): one
    # found closed now but marked by now saw the fault too, and is no suspect.
    with contextlib.suppress(RuntimeError):
        survivors |= _survivors(store)
    states = {r: st for r, st in states.items() if r not in survivors}
    took = time.monotonic() - started
    gone = [r for r, s in states.items() if s == GONE]
    silent = [r for r, s in states.items() if s == SILENT]
    parts = []
    if gone:
        one = len(gone) == 1
        parts.append(f"{describe_ranks(gone, facts)} {_are(gone)} gone: {'its' if one else 'their'} host refuses "
                     f"connections to the liveness port{'' if one else 's'} opened at init, so "
                     f"{'its process' if one else 'their processes'} ended (killed, crashed, or exited)")
    if silent:
        parts.append(f"{describe_ranks(silent, facts)} {_are(silent)} lost: no answer from "
                     f"{'its' if len(silent) == 1 else 'their'} host within {live.wait:g} s: it is down or cut off")
    if parts:
        return Verdict("; ".join(parts) + f" (xccl looked {took:.2f} s after the fault)", tuple(sorted(gone + silent)))
    alive = sorted(r for r, s in states.items() if s == ALIVE)
    told = sorted(r for r in others if r in survivors)
    seen = [f"{describe_ranks(alive, facts)} answer{'s' if len(alive) == 1 else ''}"] if alive else []
    seen += [f"{describe_ranks(told, facts)} saw the fault too"] if told else []
    found = "; ".join(seen) or "none could be probed"
    return Verdict(f"a connection of this group closed, yet no rank is found gone ({found}): a peer destroyed the "
                   "group or exited after an error of its own, or the network reset the connection")


def _survivors(store: Any) -> set[int]:
    if not store.check(["survivors"]):  # the health watch's look marks nobody (a get would wait for the key)
        return set()
    return {int(x) for x in store.get("survivors").decode("ascii", "replace").split(",") if x.isdigit()}


def _settled(suspects: Mapping[int, Facts], wait: float, nothing: float = _NOTHING) -> dict[int, str]:
    """Probe ``suspects``, and again while the picture may still change: a dying process can reset its
    connections an instant before its port closes (so the fault is seen first), and the processes of a lost host
    end one after another. While nothing is found gone, every live suspect is re-probed for up to
    :data:`_NOTHING` s; once some are, the live ranks of their hosts for up to :data:`_SETTLE` s. Kept short:
    under torchrun, a survivor's agent kills it about a second after the store's host goes."""
    states = probe({r: (f.addr, f.port) for r, f in suspects.items()}, wait)
    now = time.monotonic()
    step, nothing_end, settle_end = 0.02, now + nothing, None
    while True:
        gone_hosts = {suspects[r].host for r, st in states.items() if st in (GONE, SILENT)}
        if gone_hosts and settle_end is None:
            settle_end = time.monotonic() + _SETTLE
        limit = settle_end if settle_end is not None else nothing_end
        again = [r for r, st in states.items() if st == ALIVE and (not gone_hosts or suspects[r].host in gone_hosts)]
        if not again or time.monotonic() + step > limit:
            return states
        time.sleep(step)
        step = min(step * 2, 0.1)
        states.update(probe({r: (suspects[r].addr, suspects[r].port) for r in again}, max(0.05, limit - time.monotonic())))


def _without_store(live: Liveness, why: str, started: float) -> Verdict:
    """What can be said when the store cannot be reached: its host is the suspect, and its ranks are probed. Not
    agreed with the other survivors (that needs the store); the ranks are those found closed."""
    addr, port = live.store
    where = f"the rendezvous store at {addr}:{port} ({live.hosted_by}) cannot be reached ({why})"
    peers = dict(live.store_peers)
    states = _settled({r: f for r, f in peers.items() if r != live.rank and probeable(f)}, live.wait)
    took = time.monotonic() - started
    tail = f" (xccl looked {took:.2f} s after the fault; ranks on other hosts cannot be looked up without the store)"
    closed = sorted(r for r, s in states.items() if s in (GONE, SILENT))
    alive = sorted(r for r, s in states.items() if s == ALIVE)
    how = "are closed" if all(states[r] == GONE for r in closed) else "do not answer"
    if live.hosted_by.startswith("rank 0") and 0 in closed:
        # The store ran in rank 0's process: that one is certain. Other ranks of its host may have been lost
        # with it, or may be survivors that already exited after this fault: without the store, no telling.
        rest = [r for r in closed if r != 0]
        text = (f"{describe_ranks([0], peers)} is {'gone' if states[0] == GONE else 'lost'}: {where}, and its "
                f"liveness port {'is closed' if states[0] == GONE else 'does not answer'}")
        if rest:
            verb = "no longer answers" if len(rest) == 1 else "no longer answer"
            text += f"; {describe_ranks(rest, peers)}, on its host, {verb} either (lost with it, or exited after this fault)"
        return Verdict(text + tail, tuple(closed), agreed=False)
    if closed:
        return Verdict(f"{describe_ranks(closed, peers)} {_are(closed)} lost with the store's host: {where}, and their "
                       f"liveness ports {how}" + tail, tuple(closed), agreed=False)
    if alive:
        return Verdict(f"{where}, yet {describe_ranks(alive, peers)}, on its host, answer: the store's process is "
                       "gone, not its host" + tail, agreed=False)
    return Verdict(f"{where}; the ranks on its host could not be probed from here" + tail, agreed=False)


def _reason(exc: BaseException, wait: float) -> str:
    text = str(exc).strip()
    if "trying to connect" in text:
        return f"no connection within {min(_CONNECT, wait):g} s"
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _are(ranks: Sequence[int]) -> str:
    return "is" if len(ranks) == 1 else "are"


def close_quietly(live: Any) -> None:
    """Close a :class:`Liveness` (``xccl.shutdown``, a failed init); anything else is ignored."""
    if isinstance(live, Liveness):
        with contextlib.suppress(OSError):
            live.close()
