"""The pieces of ``xccl.collectives._health`` on their own: the Facts record, the liveness port and its probe.

The fault path end to end (a rank dies; the survivors' PeerFailure names it) is in tests/test_init_world_check.py
(one host) and tests/test_multihost.py (a host lost).
"""

from __future__ import annotations

import datetime
import json
import socket

import pytest

from xccl.collectives._health import _facts as F
from xccl.collectives._health import _liveness as L
from xccl.collectives._state import PROCESS


def _facts(rank: int = 1, **kw: object) -> F.Facts:
    base: dict[str, object] = dict(
        rank=rank, world_size=4, local_rank=rank % 2, local_world_size=2, node=rank // 2, plugin="cpu",
        backend="gloo", simulate=False, check=False, fallback="warn", xccl="0.1.0", torch="2.13.0",
        host=f"node{rank // 2}", addr=f"10.0.0.{10 + rank // 2}", port=4000 + rank, pid=100 + rank,
    )
    base.update(kw)
    return F.Facts(**base)  # type: ignore[arg-type]


def test_facts_round_trip_and_compare_only_the_world_view():
    f = _facts()
    assert F.Facts.decode(f.encode()) == f
    assert F.Facts.decode(f.encode().encode()) == f
    # Where a rank runs differs between ranks; what it was told must not.
    assert _facts(2).view() == f.view()
    assert _facts(world_size=6).view() != f.view()
    assert json.loads(f.view())[0] == 4  # WORLD_SIZE first: the world check wakes ranks by it


@pytest.mark.parametrize(
    "raw",
    ["", "not json", "[1, 2]", '{"rank": 1}', "x" * 5000],
    ids=["empty", "garbage", "a list", "fields missing", "oversize"],
)
def test_malformed_facts_are_rejected(raw):
    assert F.Facts.decode(raw) is None


def test_a_field_of_the_wrong_type_is_rejected():
    data = json.loads(_facts().encode())
    for name, bad in (("rank", "1"), ("simulate", 1), ("port", True), ("host", 3)):
        assert F.Facts.decode(json.dumps({**data, name: bad})) is None, name


def test_parse_lines_skips_what_it_cannot_read():
    raw = (_facts(0).encode() + "\n{broken\n\n" + _facts(3).encode() + "\n").encode()
    assert [f.rank for f in F.parse_lines(raw)] == [0, 3]


def test_describe_ranks_groups_by_host():
    facts = {r: _facts(r) for r in range(4)}
    assert F.describe_ranks([3, 2, 0], facts) == "rank 0 on node0 (10.0.0.10) and ranks [2, 3] on node1 (10.0.0.11)"
    assert F.describe_ranks([5], facts) == "rank 5"


def test_the_probe_tells_a_live_port_from_a_closed_one():
    live = L.open_port(socket.AF_INET)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # bound, never listened: nothing holds it now
    try:
        states = L.probe({0: ("127.0.0.1", live.getsockname()[1]), 1: ("127.0.0.1", closed_port),
                          2: ("not-an-address", 1)}, wait=2.0)
    finally:
        live.close()
    assert states == {0: L.ALIVE, 1: L.GONE, 2: L.UNKNOWN}


def test_a_loopback_address_is_probed_only_from_its_own_host():
    assert L.probeable(_facts(addr="127.0.0.1", host=socket.gethostname()))
    assert not L.probeable(_facts(addr="127.0.1.1", host="another-host"))
    assert not L.probeable(_facts(port=0))


def test_route_address_is_this_machines_side_of_the_route():
    addr, family = L.route_address("127.0.0.1", 9)
    assert addr == "127.0.0.1" and family == socket.AF_INET


def test_no_liveness_means_no_verdict():
    assert PROCESS.liveness is None
    assert L.lost_peers([0, 1]) is None


@pytest.mark.parametrize(
    ("seconds", "wait"), [(1.0, 0.3), (4.0, 1.0), (300.0, 2.0)], ids=["short", "mid", "default"]
)
def test_look_wait_is_a_quarter_of_the_timeout_within_bounds(seconds, wait):
    assert L.look_wait(datetime.timedelta(seconds=seconds)) == wait
