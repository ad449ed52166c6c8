"""The mismatch detector's rules, without processes: fingerprints, rolling hashes, and the decisions drawn from
what peers publish (hashes, dumps of steps, stall records). The multi-rank behaviour is ``tests/test_check.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import xccl
from xccl.collectives._check import Call, decode, disagreement, encode
from xccl.collectives._check import _analysis as A
from xccl.collectives._check import _fingerprint as F
from xccl.collectives._check._record import RING, Recorder, Verdict
from xccl.ops import _specs as S


def _call(op: str = "all_reduce", tensors: tuple[tuple[str, tuple[int, ...]], ...] = (("float32", (4,)),),
          **kw: Any) -> Call:
    fields: dict[str, Any] = {"seq": 3, "op": op, "group": "0", "size": 2, "tensors": tensors, "reduce_op": "sum",
                              "root": -1, "extra": ()}
    fields.update(kw)
    return Call(**fields)


class _Group:
    """What a recorder reads of a group's dispatch state (a real capability table, plain attributes)."""

    def __init__(self, rank: int = 0, size: int = 2, name: str = "0") -> None:
        self.name, self.size, self.rank, self.ranks = name, size, rank, tuple(range(size))
        self.table = xccl.capabilities("cpu")
        self.seq = 0


def _recorder(calls: list[Call], rank: int = 0, size: int = 2, every: int = 1000) -> Recorder:
    rec = Recorder(_Group(rank, size))
    for i, c in enumerate(calls):
        fp, _ = rec.intern((c,), c.at(-1))
        rec.record(fp)
        if i % every == 0:
            rec.catch_up()  # what the detector's thread does each round
    rec.catch_up()
    return rec


# ------------------------------------------------------------------------------------------------ fingerprints


def test_fingerprint_round_trip():
    call = Call(7, "reduce", "g;1", 4, (("bfloat16", (2, 3)), ("float32", ())), "max", 2, (1, 2))
    back = decode(encode(call))
    assert back == Call(7, "reduce", "g_1", 4, (("bfloat16", (2, 3)), ("float32", ())), "max", 2, (1, 2))
    assert back.describe() == "reduce(bfloat16[2,3], float32[], op=max, root=2, counts=[1, 2]) #7 on group 'g_1'"


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x04\x95\x00\x00\x00\x00",  # a pickle
        b"x1;1;all_reduce;0;2;float32:4;sum;-1",  # a field short
        b"x2;1;all_reduce;0;2;float32:4;sum;-1;",  # another format version
        b"x1;1;all_reduce;0;2;float32:4x__import__;sum;-1;",
        b"x1;" + b"9" * (1 << 18) + b";a;0;2;;;-1;",  # oversized
        "x1;1;all_reduce;0;2;float32:4;sùm;-1;",  # not ASCII
    ],
    ids=["pickle", "short", "version", "code", "oversized", "unicode"],
)
def test_peer_fingerprints_are_parsed_strictly(raw):
    with pytest.raises((ValueError, UnicodeDecodeError)):
        decode(raw)


def test_disagreement_rules():
    assert disagreement([_call(), _call()]) is None
    assert "different collectives" in (disagreement([_call(), _call(op="broadcast")]) or "")
    assert "different reduce ops" in (disagreement([_call(), _call(reduce_op="max")]) or "")
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
    # Some members only (a 4-rank group): the asymmetric ops compare their common part.
    assert disagreement([ok[0], ok[1]], size=4) is None
    assert "do not pair up" in (disagreement([ok[0], _call("all_gather", (ag[0], ag[0], ag[0]))], size=4) or "")


def test_canonical_form_ignores_what_legitimately_differs_between_ranks():
    alias = F.aliases(xccl.capabilities("cpu"))
    ag = [("float32", (2,)), ("float32", (3,))]
    same = [F.intern(_call("all_gather", (ag[r], *ag)), alias).digest for r in range(2)]
    assert same[0] == same[1]
    a2a = [F.intern(_call("all_to_all_single_uneven", ((d, (r + 1, 5)), (d, (2, 5)))), alias).digest
           for r, d in ((0, "float32"), (1, "float32"))]
    assert a2a[0] == a2a[1]
    assert F.intern(_call(), alias).digest != F.intern(_call(reduce_op="max"), alias).digest
    assert F.intern(_call(), alias).digest != F.intern(_call(tensors=(("float32", (8,)),)), alias).digest


def test_call_keys_distinguish_what_the_fingerprint_compares():
    key = F.plan_of(S.ALL_REDUCE).key
    t4, t8 = torch.ones(4), torch.ones(8)
    assert key((t4, xccl.ReduceOp.SUM)) == key((torch.zeros(4), xccl.ReduceOp.SUM))
    assert key((t4, xccl.ReduceOp.SUM)) != key((t8, xccl.ReduceOp.SUM))
    assert key((t4, xccl.ReduceOp.SUM)) != key((t4, xccl.ReduceOp.MAX))
    assert key((t4, xccl.ReduceOp.SUM)) != key((t4.double(), xccl.ReduceOp.SUM))
    bkey = F.plan_of(S.BROADCAST).key
    assert bkey((t4, 0)) != bkey((t4, 1))
    assert F.plan_of(S.SEND).p2p and not F.plan_of(S.BARRIER).p2p


# ---------------------------------------------------------------------------------------------- rolling hashes


def test_rolling_hash_agrees_only_for_the_same_sequence():
    a, b, c = _call(), _call(op="broadcast", reduce_op="", root=0), _call(reduce_op="max")
    assert _recorder([a, b, a]).h == _recorder([a, b, a], rank=1).h
    assert _recorder([a, b, a]).h != _recorder([b, a, a]).h  # order matters
    assert _recorder([a, b, a]).h != _recorder([a, c, a]).h
    assert _recorder([a, b]).h != _recorder([a, b, a]).h  # a skipped call


def test_published_status_compares_exactly_within_the_ring():
    a, c = _call(), _call(reduce_op="max")
    mine = _recorder([a] * 10 + [c] + [a] * 5)
    same = _recorder([a] * 10 + [c] + [a] * 5, rank=1)
    other = _recorder([a] * 10 + [a] + [a] * 5, rank=1)
    assert A.compare_status(mine, same.status()) == (True, 15)
    assert A.compare_status(mine, other.status()) == (False, 15)
    behind = _recorder([a] * 9, rank=1)
    assert A.compare_status(mine, behind.status()) == (True, 8)
    # A peer far ahead: only the checkpoints are comparable.
    ahead = _recorder([a] * 10 + [c] + [a] * (RING + 2000), rank=1)
    assert A.compare_status(mine, ahead.status()) == (True, 0)
    assert A.compare_status(mine, {"r": [[3, "zz"]], "c": "junk"}) is None
    # Calls that went unhashed (the ring lapped between two catch-ups) make the rank stop comparing, never differ.
    lapped = _recorder([a] * (RING + 10), every=RING + 100)
    assert lapped.blind and lapped.hash_at(RING) is None and lapped.status()["r"] == []
    assert A.compare_status(lapped, same.status()) is None


def test_dumps_name_the_first_step_that_differs_and_every_rank():
    a, c = _call(), _call(reduce_op="max")
    recs = [_recorder([a, a, c, a], rank=0, size=3), _recorder([a, a, a, a], rank=1, size=3),
            _recorder([a, a, a, a], rank=2, size=3)]
    dumps = {r: rec.dump(0, 3) for r, rec in enumerate(recs)}
    v = A.from_dumps("0", (0, 1, 2), dumps, 0, 3, {})
    assert v is not None and "different reduce ops at step #2" in v.reason
    assert v.calls[0].startswith("all_reduce(float32[4], op=max) #2")
    assert v.calls[1].startswith("all_reduce(float32[4], op=sum) #2")
    assert set(v.calls) == {0, 1, 2}
    # A member that did not answer is named as such; equal dumps are no verdict.
    partial = A.from_dumps("0", (0, 1, 2), {0: dumps[0], 1: dumps[1]}, 0, 3, {})
    assert partial is not None and partial.calls[2] == "did not answer"
    assert A.from_dumps("0", (0, 1, 2), {1: dumps[1], 2: dumps[2]}, 0, 3, {}) is None
    assert A.from_dumps("0", (0, 1, 2), {0: dumps[0], 1: {"e": [[2, "x" * 40, 0]], "t": ["junk"]}}, 0, 3, {}) is None
    # The difference is older than the window: the hashes at its end still tell.
    late = A.from_dumps("0", (0, 1, 2), {r: rec.dump(3, 3) for r, rec in enumerate(recs)}, 3, 3, {})
    assert late is not None and "differ before step #3" in late.reason


# ------------------------------------------------------------------------------------------------------ stalls


def _record(sid: int, group: str, step: int, members: list[int], reached: dict[str, int], call: Call | None = None,
            h: str = "1") -> dict[str, Any]:
    call = call or _call(group=group, size=len(members))
    return {"sid": sid, "w": [{"g": group, "s": step, "m": members, "f": encode(call.at(-1)), "h": h}], "q": reached}


def test_ranks_waiting_for_each_other_in_different_groups_are_a_cycle():
    recs = {"a": Recorder(_Group(0, 2, "a"))}
    records = {
        0: _record(1, "a", 5, [0, 1], {"a": 5, "b": 2}),  # rank 0 waits in a#5; it has not reached b#3
        1: _record(7, "b", 3, [0, 1], {"a": 4, "b": 3}),  # rank 1 waits in b#3; it has not reached a#5
    }
    found = A.from_stalls(0, records, recs, {})
    assert isinstance(found, A.Cycle) and found.key == frozenset({(0, 1), (1, 7)})
    assert "rank 0 waits in group 'a' (step #5) for rank 1, rank 1 waits in group 'b'" in found.verdict.reason
    assert found.verdict.groups == ("a", "b") and set(found.verdict.calls) == {0, 1}
    # Rank 1 has reached a#5 (the record of rank 1 says so): it will complete, no cycle.
    records[1]["q"]["a"] = 5
    assert A.from_stalls(0, records, recs, {}) is None
    # A rank not stalled at all breaks the chain too.
    assert A.from_stalls(0, {0: records[0]}, recs, {}) is None


def test_the_same_step_stalled_with_different_calls_is_a_verdict():
    rec = Recorder(_Group(0, 2, "a"))
    records = {0: _record(1, "a", 5, [0, 1], {"a": 5}, _call(group="a")),
               1: _record(1, "a", 5, [0, 1], {"a": 5}, _call(op="broadcast", group="a", reduce_op="", root=0))}
    found = A.from_stalls(0, records, {"a": rec}, {})
    assert isinstance(found, Verdict) and "different collectives at step #5" in found.reason
    # Same call, different histories: ask for the steps in between.
    records[1] = _record(1, "a", 5, [0, 1], {"a": 5}, _call(group="a"), h="2")
    assert A.from_stalls(0, records, {"a": rec}, {"a": 2}) == A.DumpRequest("a", 3, 5)


@pytest.mark.parametrize("payload", [None, [], {"k": "v"}, {"k": "v", "g": [], "why": "x", "calls": {}},
                                     {"k": "v", "g": ["0"], "why": 3, "calls": {}}, {"k": "d", "g": ["0"]}])
def test_malformed_verdicts_are_rejected(payload):
    with pytest.raises(ValueError):
        Verdict.parse(payload)


def test_verdict_round_trip_and_error():
    v = Verdict(("0",), "the ranks passed different roots at step #4", {0: "broadcast(...)", 1: "broadcast(...)"})
    back = Verdict.parse(v.payload())
    assert back == v
    err = back.error()
    assert isinstance(err, xccl.CollectiveMismatch) and err.calls == {0: "broadcast(...)", 1: "broadcast(...)"}
    assert "reported earlier" in str(back.error())
