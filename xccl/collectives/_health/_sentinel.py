"""The sentinel: a lost rank's process is noticed by its neighbours at once, and every survivor's watched wait
looks now instead of at its deadline.

The health watch (``._watch``) looks at a group's liveness when a call has waited past its deadline: a survivor
hears of a lost rank about a second after the loss, whatever it was waiting for. The kernel knows sooner. Each
rank holds a TCP connection to the liveness port of the ranks 1, 2, 4, ... after it (``Facts.port``, the
listening socket of ``._liveness``), and the sentinel, one daemon thread, accepts those of the ranks before it.
When a process ends, however it ends (SIGKILL, a crash, the OOM killer), its kernel resets these connections, and
its neighbours read the reset within a millisecond. A neighbour that reads one, or reads a peer's alarm, sends an
alarm on each of its own connections (once per world) and bumps :attr:`Sentinel.alarms`; every rank hears it
within about log2(world) hops. At an alarm the sentinel looks at the world itself, until a look names lost ranks
(the look, and the verdict every survivor shares, are ``._liveness``'s): a verdict that names ranks is kept, so that
every later call on a group with a lost member raises it before it communicates, and runs the vendor's abort, or
arms the end where the vendor has none (``._ending``), which releases a host blocked on the device outside xccl. A
watched wait that sees the count move looks now (``._watch``). An alarm costs a look; a look that finds every member
alive changes nothing.

A rank that leaves on purpose (``xccl.shutdown``, xccl's teardown at exit, the shrink that replaces this world)
says goodbye on each connection first, so its neighbours raise no alarm. A host that goes down sends no reset: TCP
keepalive finds it within about :data:`_KEEPALIVE` x 4 seconds, and the watch's deadline sooner. Probes of the
liveness port (another survivor's look) are accepted and closed; a connection says who it is with one byte before
anything else, so a probe is never taken for a peer.

Nothing runs on the call path: the watch reads one integer per slice of a wait. Worlds of one have no liveness
port and no sentinel; ``XCCL_HEALTH_DEADLINE=0`` (no watch) starts none either.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import selectors
import socket
import threading
import weakref
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final, final

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from .._state import PROCESS
from ._ending import at_verdict
from ._facts import Facts
from ._liveness import Liveness, probeable, watch_look
from ._watch import deadline

__all__ = ["Sentinel", "ring_of", "start"]

# One byte each, on a connection between neighbours.
_HELLO: Final = b"h"  # first, from the connecting side: a peer, not a probe
_ALARM: Final = b"a"  # a peer of the sender's was lost (or an alarm reached it)
_BYE: Final = b"b"  # the sender leaves on purpose: its close is no loss
#: Seconds of silence before TCP keepalive asks a neighbour's host, and between asks (3 unanswered: reset).
_KEEPALIVE: Final = 1
#: Seconds a connection to a neighbour may take (a rank's port is open from init on, so only a dead host is slow).
_CONNECT: Final = 1.0


def ring_of(rank: int, size: int) -> list[int]:
    """The ranks ``rank`` connects to: those 1, 2, 4, ... after it, modulo ``size`` (none twice, never itself)."""
    out: list[int] = []
    step = 1
    while step < size:
        peer = (rank + step) % size
        if peer not in out:
            out.append(peer)
        step *= 2
    return out


@final
class Sentinel:
    """One rank's connections to its neighbours, and the thread that reads them (see the module docstring).

    Args:
        listen: this rank's liveness port (owned by ``Liveness``: never closed here).
        peers: rank -> ``(address, port)`` of the liveness ports to connect to.
        react: called on this thread at an alarm until it returns True (:func:`start`: the look at the world,
            until it finds ranks lost).
    """

    __slots__ = ("__weakref__", "_conns", "_found", "_listen", "_react", "_sel", "_sent", "_thread", "_wake",
                 "alarms")

    def __init__(self, listen: socket.socket, peers: Mapping[int, tuple[str, int]],
                 react: Callable[[], bool] = lambda: True) -> None:
        self._listen, self._react, self._found = listen, react, False
        #: Losses and alarms heard so far; a watched wait that sees it move looks at once.
        self.alarms = 0
        self._sent = False
        self._conns: dict[socket.socket, bool] = {}  # a connection -> whether it is a peer's (not a probe)
        self._sel = selectors.DefaultSelector()
        self._wake = socket.socketpair()
        self._sel.register(self._wake[0], selectors.EVENT_READ)
        lost = 0
        for addr, port in peers.values():  # here, not in the thread: a fork from now on finds them registered
            try:
                conn = socket.create_connection((addr, port), timeout=_CONNECT)
                conn.sendall(_HELLO)
            except OSError:  # refused: that rank is gone already
                lost += 1
                continue
            self._add(conn, peer=True)
        self._listen.setblocking(False)
        self._sel.register(self._listen, selectors.EVENT_READ)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=partial(_forget_in_child, ref))
        self._thread = threading.Thread(target=self._run, args=(lost,), name="xccl-sentinel", daemon=True)
        self._thread.start()

    def _run(self, lost: int) -> None:
        # Closed under it by a stop that did not wait for it: end quietly.
        with contextlib.suppress(OSError, ValueError, KeyError):
            for _ in range(lost):
                self._lost()
            while True:
                for key, _ in self._sel.select():
                    sock = key.fileobj
                    if sock is self._wake[0]:
                        return
                    if sock is self._listen:
                        self._accept()
                    else:
                        assert isinstance(sock, socket.socket)
                        self._read(sock)

    def _add(self, conn: socket.socket, *, peer: bool) -> None:
        conn.setblocking(False)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):
            if hasattr(socket, opt):
                conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), _KEEPALIVE)
        if hasattr(socket, "TCP_KEEPCNT"):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        self._conns[conn] = peer
        self._sel.register(conn, selectors.EVENT_READ)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listen.accept()
            except OSError:  # none left (BlockingIOError), or one that was reset before it was accepted
                return
            self._add(conn, peer=False)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset: the process at the other end ended
            data = b""
        if not data:
            peer = self._conns.pop(conn, False)
            self._sel.unregister(conn)
            conn.close()
            if peer:
                self._lost()
            return
        for byte in (data[i:i + 1] for i in range(len(data))):
            if byte == _HELLO:
                self._conns[conn] = True
            elif byte == _BYE:
                self._conns[conn] = False  # its close that follows is no loss
            elif byte == _ALARM:
                self._lost()

    def _lost(self) -> None:
        """A peer was lost, or an alarm came: count it, pass the alarm on once, and react until the reaction finds
        what it looks for (a look too early, while the lost process was still closing its sockets, finds nothing:
        its other connections' resets come next)."""
        self.alarms += 1
        if not self._sent:
            self._sent = True
            self._send(_ALARM)
        if not self._found:
            self._found = self._react()

    def _send(self, byte: bytes) -> None:
        for conn, peer in list(self._conns.items()):  # a stop's goodbye, while a look keeps the thread: a copy
            if peer:
                with contextlib.suppress(OSError):
                    conn.send(byte)

    def stop(self, wait: float = _CONNECT * 2) -> None:
        """Leave on purpose: goodbye on every connection, then close them (the liveness port stays open). Waits up to
        ``wait`` seconds for the thread (a look under way: see :func:`start`)."""
        with contextlib.suppress(OSError):
            self._wake[1].send(b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(wait)
        self._send(_BYE)
        self.forget()

    def forget(self) -> None:
        """Close this process's copies of the connections without a word (a forked child's: the parent's stay)."""
        for conn in (*self._conns, *self._wake):
            conn.close()
        self._conns.clear()
        with contextlib.suppress(Exception):
            self._sel.close()


def _forget_in_child(ref: weakref.ref[Sentinel]) -> None:
    # A forked child (a DataLoader worker) holding these connections would keep them open after this process died,
    # and its neighbours would never read the reset.
    sentinel = ref()
    if sentinel is not None:
        sentinel.forget()


def start(live: Any, size: int) -> None:
    """Start the sentinel of ``live`` (a :class:`~._liveness.Liveness`; anything else is ignored) once every rank
    of its world of ``size`` has published its Facts (after the world check, or the survivors' meeting in a
    shrink). Without the health watch (``XCCL_HEALTH_DEADLINE=0``) nobody would read its alarms: none starts; nor
    when the store cannot say where the neighbours are (the watch's deadline still holds)."""
    ring = ring_of(live.rank, size) if isinstance(live, Liveness) else []
    if not ring or not deadline():
        return
    try:
        raw = dist.TCPStore(live.store[0], live.store[1], is_master=False, wait_for_workers=False,
                            timeout=_dt.timedelta(seconds=live.wait))
        facts: list[Facts | None] = [Facts.decode(b) for b in
                                     PrefixStore(live.prefix, raw).multi_get([f"rank/{r}" for r in ring])]
    except RuntimeError:
        return
    peers = {f.rank: (f.addr, f.port) for f in facts if f is not None and probeable(f)}
    live.sentinel = Sentinel(live.sock, peers, partial(_look, live, size))


def _look(live: Liveness, size: int) -> bool:
    """An alarm: look at the world from this thread, without waiting for a call to look; whether it is done (ranks
    found lost, or this world is over). A verdict is kept
    (every later call on a group with a lost member raises it before it communicates, ``._watch``) and runs the
    vendor's abort, or arms the end where nothing ever returns (``._ending``): the host may be blocked on the
    device outside xccl, as on a device vendor's hardware, where no call of xccl's waits."""
    runtime = PROCESS.runtime
    if PROCESS.liveness is not live or runtime is None:  # shut down, or shrunk, meanwhile
        return True
    verdict = watch_look(range(size), reset=True)
    if verdict is not None and PROCESS.liveness is live:  # a shrink waits for this look before it restarts the device
        at_verdict(runtime, live.rank, verdict.ranks)
    return verdict is not None
