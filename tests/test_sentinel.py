"""The sentinel (``xccl.collectives._health._sentinel``) with real sockets in one process: a neighbour's reset is
an alarm that travels peer to peer; a probe, a goodbye and a forked child's copies are not.

The multi-rank case (a SIGKILLed rank heard by every survivor long before the health watch's deadline, a clean
leave heard by none) is in tests/test_health.py.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from xccl.collectives._health import _liveness as L
from xccl.collectives._health._sentinel import Sentinel, ring_of

WAIT = 5.0  # a bound on the thread's reaction, not a measure of it


def _until(cond: Callable[[], bool], wait: float = WAIT) -> bool:
    end = time.monotonic() + wait
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def _addr(sock: socket.socket) -> tuple[str, int]:
    return "127.0.0.1", sock.getsockname()[1]


@pytest.fixture
def ports() -> Iterator[list[socket.socket]]:
    socks = [L.open_port(socket.AF_INET) for _ in range(4)]
    yield socks
    for s in socks:
        s.close()


@pytest.mark.parametrize(("rank", "size", "ring"), [(0, 1, []), (0, 2, [1]), (1, 4, [2, 3]), (3, 4, [0, 1]),
                                                    (5, 8, [6, 7, 1]), (2, 3, [0, 1])])
def test_each_rank_watches_the_ranks_1_2_4_after_it(rank, size, ring):
    assert ring_of(rank, size) == ring


def test_a_reset_is_an_alarm_that_reaches_every_rank_along_the_chain(ports):
    # a -> b -> c -> d, where d is a bare port: its close resets c's connection, and the alarm goes back to a.
    d = ports[3]
    c = Sentinel(ports[2], {3: _addr(d)})
    b = Sentinel(ports[1], {2: _addr(ports[2])})
    a = Sentinel(ports[0], {1: _addr(ports[1])})
    try:
        time.sleep(0.2)  # connected, and nothing heard
        assert (a.alarms, b.alarms, c.alarms) == (0, 0, 0)
        L.probe({0: _addr(ports[0]), 1: _addr(ports[1])}, wait=1.0)  # another survivor's look: no peer
        time.sleep(0.2)
        assert (a.alarms, b.alarms) == (0, 0)
        d.close()  # d's process ends: its kernel resets the connection from c
        assert _until(lambda: a.alarms > 0 and b.alarms > 0 and c.alarms > 0), (a.alarms, b.alarms, c.alarms)
    finally:
        for s in (a, b, c):
            s.stop()


def test_a_goodbye_is_no_alarm(ports):
    b = Sentinel(ports[1], {2: _addr(ports[2])})
    a = Sentinel(ports[0], {1: _addr(ports[1])})
    try:
        time.sleep(0.2)
        b.stop()  # b leaves on purpose (xccl.shutdown); its port stays open, as Liveness closes it after
        ports[1].close()
        time.sleep(0.5)
        assert a.alarms == 0
    finally:
        a.stop()


def test_a_refused_neighbour_at_the_start_is_an_alarm(ports):
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    port = gone.getsockname()[1]
    gone.close()
    a = Sentinel(ports[0], {1: ("127.0.0.1", port)})
    try:
        assert _until(lambda: a.alarms > 0)
    finally:
        a.stop()


def test_a_forked_child_does_not_keep_the_connections_open(ports):
    # A DataLoader worker forked from a rank holds copies of its sockets: if it kept the neighbours' connections,
    # the rank's death would reset nothing. The fork hook closes the child's copies.
    s = Sentinel(ports[0], {1: _addr(ports[1])})
    ports[1].settimeout(WAIT)
    conn, _ = ports[1].accept()
    conn.settimeout(WAIT)
    assert conn.recv(1) == b"h"
    pid = os.fork()
    if pid == 0:
        time.sleep(WAIT + 1)
        os._exit(0)
    try:
        s.forget()  # as if this process ended: only the child could still hold the connection
        assert conn.recv(1) == b"", "the forked child kept the connection open"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        conn.close()
