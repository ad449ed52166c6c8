"""The collective-mismatch detector (``xccl.init(check=True)``) at 2 and 4 ranks, on real gloo groups.

Each mismatch is made by one rank calling something different (op, shape, dtype, root, reduce op, group, or
all_to_all sizes); every rank of the group must raise :class:`~xccl.CollectiveMismatch` naming each rank's call,
within seconds, and the group must still give correct results afterwards. Matching calls whose tensors
legitimately differ between ranks (all_gather, uneven all_to_all_single, gather/scatter lists on the root only)
must pass and compute the right values.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import xccl
from xccl.collectives._check import Call, disagreement, encode
from xccl.plugin._capabilities import Collective
from xccl.testing import RankPool

TIMEOUT = 5.0


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request: pytest.FixtureRequest) -> Iterator[RankPool]:
    with RankPool(request.param, {"check": True, "timeout": TIMEOUT}, start_method="forkserver") as p:
        yield p


# ---------------------------------------------------------------------------------------------- rank bodies

_GROUPS: dict[str, Any] = {}


def _rank() -> tuple[int, int]:
    w = xccl.get_world()
    return w.rank, w.world_size


def _pair() -> Any:
    """A sub-group of ranks {0, 1}, created once per pool (every rank must call new_group)."""
    if "pair" not in _GROUPS:
        _GROUPS["pair"] = xccl.new_group([0, 1])
    return _GROUPS["pair"]


def body_mismatch(kind: str) -> None:
    rank, n = _rank()
    odd = rank == n - 1  # the last rank is the one that differs
    t = torch.ones(4)
    if kind == "op":
        if odd:
            xccl.broadcast(t, src=0)
        else:
            xccl.all_reduce(t)
    elif kind == "shape":
        xccl.all_reduce(torch.ones(8 if odd else 4))
    elif kind == "dtype":
        xccl.all_reduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32))
    elif kind == "root":
        xccl.broadcast(t, src=1 if odd else 0)
    elif kind == "reduce_op":
        xccl.all_reduce(t, op=xccl.ReduceOp.MAX if odd else xccl.ReduceOp.SUM)
    elif kind == "group":
        pair = _pair()
        if rank == 0:
            xccl.all_reduce(t, group=pair)  # rank 0 on {0, 1}; everyone else on the world
        else:
            xccl.all_reduce(t)
    elif kind == "all_to_all_sizes":
        outs = [torch.empty(3 if (odd and j == 0) else 2) for j in range(n)]
        xccl.all_to_all(outs, [torch.ones(2) for _ in range(n)])
    elif kind == "skipped":
        if not odd:
            xccl.all_reduce(t)  # the odd rank skips it and goes straight to the barrier
        xccl.barrier()
    else:  # pragma: no cover
        raise AssertionError(kind)


def body_after() -> float:
    t = torch.full((3,), float(xccl.get_world().rank))
    xccl.all_reduce(t)
    return t[0].item()


def body_matching() -> list[str]:
    """Calls whose tensors differ between ranks but agree as collectives; each result checked on the spot."""
    rank, n = _rank()
    wrong: list[str] = []
    # all_gather: same output lists everywhere.
    outs = [torch.empty(2) for _ in range(n)]
    xccl.all_gather(outs, torch.full((2,), float(rank)))
    if [o[0].item() for o in outs] != [float(r) for r in range(n)]:
        wrong.append("all_gather")
    # uneven all_to_all_single: rank r sends j + 1 rows to rank j.
    inp = torch.cat([torch.full((j + 1,), float(rank * 10 + j)) for j in range(n)])
    out = torch.empty(n * (rank + 1))
    xccl.all_to_all_single(out, inp, [rank + 1] * n, [j + 1 for j in range(n)])
    expect = torch.cat([torch.full((rank + 1,), float(i * 10 + rank)) for i in range(n)])
    if not torch.equal(out, expect):
        wrong.append("all_to_all_single uneven")
    # gather and scatter: a list on the root only.
    t = torch.full((2,), float(rank))
    lst = [torch.empty(2) for _ in range(n)] if rank == 0 else None
    xccl.gather(t, lst, dst=0)
    if rank == 0 and [x[0].item() for x in lst or []] != [float(r) for r in range(n)]:
        wrong.append("gather")
    got = torch.empty(2)
    xccl.scatter(got, [torch.full((2,), float(r)) for r in range(n)] if rank == 0 else None, src=0)
    if got[0].item() != float(rank):
        wrong.append("scatter")
    # reduce_scatter_tensor, all_to_all (even lists), broadcast, barrier: symmetric calls.
    rs = torch.empty(2)
    xccl.reduce_scatter_tensor(rs, torch.ones(2 * n))
    if rs.tolist() != [float(n)] * 2:
        wrong.append("reduce_scatter_tensor")
    a2a = [torch.empty(1) for _ in range(n)]
    xccl.all_to_all(a2a, [torch.full((1,), float(rank)) for _ in range(n)])
    if [x.item() for x in a2a] != [float(r) for r in range(n)]:
        wrong.append("all_to_all")
    b = torch.full((2,), float(rank))
    xccl.broadcast(b, src=n - 1)
    if b[0].item() != float(n - 1):
        wrong.append("broadcast")
    xccl.barrier()
    return wrong


def body_silent() -> Any:
    rank, n = _rank()
    if rank == n - 1:
        time.sleep(TIMEOUT + 1.5)
        return "slept"
    xccl.all_reduce(torch.ones(2))
    return "no error"


# ---------------------------------------------------------------------------------------------- tests

MISMATCHES = {
    "op": "the ranks called different collectives",
    "shape": "has a different shape",
    "dtype": "has a different dtype",
    "root": "different roots",
    "reduce_op": "different reduce ops",
    "group": "group",
    "all_to_all_sizes": "which expects 3",
    "skipped": "different collectives",
}


@pytest.mark.parametrize("kind", list(MISMATCHES), ids=list(MISMATCHES))
def test_mismatch_raises_on_every_rank_and_the_group_survives(pool, kind):
    n = pool.world_size
    outs = pool.run(body_mismatch, kind, timeout=TIMEOUT + 30)
    for o in outs:
        assert o.raised(xccl.CollectiveMismatch), str(o)
        assert MISMATCHES[kind] in o.message, o.message
        assert o.elapsed < 6.0, o  # a group mismatch is found after the first second of waiting, others at once
        calls = o.attrs["calls"]
        assert set(calls) <= set(range(n)) and len(calls) >= 2, calls
    if kind != "group":
        # Every rank names every member's call: the odd one and a regular one differ.
        calls = outs[0].attrs["calls"]
        assert len(calls) == n and calls[n - 1] != calls[0], calls
    assert pool.run_ok(body_after) == [float(sum(range(n)))] * n


def test_matching_calls_pass_and_compute_the_right_values(pool):
    assert pool.run_ok(body_matching, timeout=60) == [[]] * pool.world_size


def test_silent_rank_is_a_collective_timeout_naming_it(pool):
    n = pool.world_size
    outs = pool.run(body_silent, timeout=TIMEOUT + 30)
    assert outs[n - 1].value == "slept"
    for o in outs[: n - 1]:
        assert o.raised(xccl.CollectiveTimeout), str(o)
        assert f"ranks [{n - 1}] did not reach step" in o.message
        assert TIMEOUT - 0.5 <= o.attrs["elapsed"] < TIMEOUT + 5
    assert pool.run_ok(body_after) == [float(sum(range(n)))] * n


def body_check_flag() -> bool:
    return xccl.get_world().check


def test_env_variable_turns_the_detector_on():
    with RankPool(2, {"timeout": TIMEOUT}, env={"XCCL_CHECK": "1"}, start_method="forkserver") as p:
        assert p.run_ok(body_check_flag) == [True, True]
        outs = p.run(body_mismatch, "shape", timeout=30)
        assert all(o.raised(xccl.CollectiveMismatch) for o in outs), outs


# ---------------------------------------------------------------------------------------------- fingerprints


def _call(op: str = "all_reduce", tensors: tuple[tuple[str, tuple[int, ...]], ...] = (("float32", (4,)),), **kw: Any) -> Call:
    fields: dict[str, Any] = {"seq": 3, "op": op, "group": "0", "size": 2, "tensors": tensors, "reduce_op": "sum",
                              "root": -1, "extra": ()}
    fields.update(kw)
    return Call(**fields)


def test_fingerprint_round_trip():
    t = torch.empty(2, 3, dtype=torch.bfloat16)
    raw = encode(7, Collective.REDUCE, "g;1", 4, (t, torch.empty(())), xccl.ReduceOp.MAX, 2, (1, 2))
    call = Call.decode(raw)
    assert call == Call(7, "reduce", "g_1", 4, (("bfloat16", (2, 3)), ("float32", ())), "max", 2, (1, 2))
    assert call.describe() == "reduce(bfloat16[2,3], float32[], op=max, root=2, counts=[1, 2]) #7 on group 'g_1'"


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x04\x95\x00\x00\x00\x00",  # a pickle
        b"x1;1;all_reduce;0;2;float32:4;sum;-1",  # a field short
        b"x2;1;all_reduce;0;2;float32:4;sum;-1;",  # another format version
        b"x1;1;all_reduce;0;2;float32:4x__import__;sum;-1;",
        b"x1;" + b"9" * (1 << 18) + b";a;0;2;;;-1;",  # oversized
    ],
    ids=["pickle", "short", "version", "code", "oversized"],
)
def test_peer_fingerprints_are_parsed_strictly(raw):
    with pytest.raises((ValueError, UnicodeDecodeError)):
        Call.decode(raw)


def test_disagreement_rules():
    assert disagreement([_call(), _call()]) is None
    assert "different collectives" in (disagreement([_call(), _call(op="broadcast")]) or "")
    assert "different steps" in (disagreement([_call(), _call(seq=4)]) or "")
    # all_gather: rank i's tensor is output i of every rank's list.
    ag = [("float32", (2,)), ("float32", (3,))]
    ok = [_call("all_gather", (ag[0], *ag)), _call("all_gather", (ag[1], *ag))]
    assert disagreement(ok) is None
    assert "rank 1's tensor" in (disagreement([ok[0], _call("all_gather", (ag[0], *ag))]) or "")
    # uneven all_to_all_single: totals must balance; even and uneven are one op where both are native.
    a = _call("all_to_all_single", (("float32", (3,)), ("float32", (2,))))
    b = _call("all_to_all_single_uneven", (("float32", (1,)), ("float32", (2,))))
    assert "different collectives" in (disagreement([a, b]) or "")
    assert disagreement([a, b], {"all_to_all_single_uneven": "all_to_all_single"}) is None
    c = _call("all_to_all_single", (("float32", (3,)), ("float32", (3,))))
    assert "elements in all" in (disagreement([a, c]) or "")
