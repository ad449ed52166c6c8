"""Eager and graph mode refuse a bad call with the same typed error: the bad-input catalog, run both ways.

Both modes validate with the op's one description (``xccl.ops._specs``): the eager path raises
``InvalidArgument`` from dispatch, the graph path raises its trace-time twin from the graph form while Dynamo traces
(``torch.compile(fullgraph=True)``). For every case of the catalog (``tests/test_bad_input.py``) that is a call of a
collective, this runs the call eagerly and compiled, on every rank of a 2-rank pool, and compares the error classes.

It also pins the three drifts the graph copies of the collectives had before they shared the validators: even vs
uneven all_to_all_single decided from split *values*, an empty all_to_all list read at index 0, and all_gather
without dtype and shape checks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from test_bad_input import CALLS, POOL

import xccl
from xccl.testing import RankPool

#: Catalog cases that are calls of a collective (not group creation, init or rank-table parsing).
#: Cases whose *call* Dynamo cannot trace, whatever xccl does: the catalog builds the premul_sum op inside the call,
#: and ``dist._make_nccl_premul_sum`` is a pybind builtin Dynamo refuses (``Unsupported``) before xccl is reached.
UNTRACEABLE = {"all_reduce-premul-sum-on-integers"}
GRAPH_CASES = [c for c in POOL
               if not c.id.startswith(("new_group-", "init-", "ranktable-")) and c.id not in UNTRACEABLE]


def _classes(fn: Callable[[], Any]) -> list[str]:
    try:
        fn()
    except Exception as exc:  # the test compares the class names
        return [c.__name__ for c in type(exc).__mro__]
    return ["no error"]


def _xccl_class(names: list[str]) -> str:
    """The most derived xccl error class in an MRO (the trace-time twin shares the name of its xccl class)."""
    for name in names:
        if name in ("InvalidArgument", "UnsupportedCollective", "InitError", "ConstraintViolation", "RankTableError"):
            return name
    return names[0]


def body_both_modes(case_ids: list[str]) -> dict[str, tuple[str, str, list[float]]]:
    """Each case eagerly, then inside torch.compile(fullgraph=True); then an all_reduce proves the group works."""
    import torch._dynamo

    out: dict[str, tuple[str, str, list[float]]] = {}
    for case_id in case_ids:
        call = CALLS[case_id]
        eager = _xccl_class(_classes(lambda call=call: call("")))
        torch._dynamo.reset()
        compiled = torch.compile(lambda call=call: call(""), fullgraph=True, backend="eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = _xccl_class(_classes(compiled))
        t = torch.ones(2)
        xccl.all_reduce(t)
        out[case_id] = (eager, graph, t.tolist())
    return out


@pytest.fixture(scope="module")
def pool() -> Any:
    with RankPool(2, {"timeout": 20}, start_method="forkserver") as p:
        yield p


def test_eager_and_graph_raise_the_same_typed_error_for_every_catalog_case(pool: RankPool) -> None:
    outs = pool.run_ok(body_both_modes, [c.id for c in GRAPH_CASES], timeout=600)
    assert len(GRAPH_CASES) >= 30
    for rank, results in enumerate(outs):
        for case in GRAPH_CASES:
            eager, graph, after = results[case.id]
            assert eager == case.error, (rank, case.id, eager)
            assert graph == eager, f"rank {rank}, {case.id}: eager raised {eager}, graph mode {graph}"
            assert after == [2.0, 2.0], (rank, case.id)


# --------------------------------------------------------------------------------------------------- the drifts


def body_drifts() -> dict[str, str]:
    """The calls the graph copies got wrong, compiled; each must raise InvalidArgument or agree with eager."""
    import torch._dynamo

    n, me = xccl.get_world().world_size, xccl.get_world().rank
    results: dict[str, str] = {}

    def run(name: str, fn: Callable[[], Any]) -> None:
        torch._dynamo.reset()
        results[name] = _xccl_class(_classes(torch.compile(fn, fullgraph=True, backend="eager")))

    # An empty list: the graph copy read input_tensor_list[0] first and failed with IndexError.
    run("all_to_all-empty", lambda: xccl.all_to_all([], []))
    # all_gather without its checks: a wrong dtype and a wrong shape in the output list went through.
    run("all_gather-dtype", lambda: xccl.all_gather([torch.empty(2, dtype=torch.int64) for _ in range(n)],
                                                    torch.ones(2)))
    run("all_gather-shape", lambda: xccl.all_gather([torch.empty(3) for _ in range(n)], torch.ones(2)))

    # Even vs uneven from split *values*: [[1, 1], [1, 2]] looks even on rank 0 and uneven on rank 1. With split
    # sizes passed, both ranks must choose the uneven op (the key the table is asked about): the graph path now
    # asks with the same key eager dispatch uses, whatever the values.
    from xccl.ops import _specs as S

    m = [[1, 1], [1, 2]]
    out = torch.empty(sum(m[j][me] for j in range(n)))
    inp = torch.arange(float(sum(m[me])))
    kargs = S.ALL_TO_ALL_SINGLE.validate(xccl.collectives._groups.state_of(None), _raise, out, inp,
                                         [m[j][me] for j in range(n)], m[me])
    results["a2a-key"] = S.ALL_TO_ALL_SINGLE.key_of(kargs).value
    compiled = torch.compile(lambda o, i: xccl.all_to_all_single(o, i, [m[j][me] for j in range(n)], m[me]),
                             fullgraph=True, backend="eager")
    torch._dynamo.reset()
    compiled(out, inp)
    results["a2a-values"] = str(out.tolist())
    return results


def _raise(op: str, detail: str) -> Any:
    raise xccl.InvalidArgument(op, detail)


def test_the_graph_copies_drifts_are_gone(pool: RankPool) -> None:
    outs = pool.run_ok(body_drifts, timeout=300)
    for r in outs:
        assert r["all_to_all-empty"] == "InvalidArgument", r
        assert r["all_gather-dtype"] == "InvalidArgument", r
        assert r["all_gather-shape"] == "InvalidArgument", r
        assert r["a2a-key"] == "all_to_all_single_uneven", r
    # rank 0 receives 1 element from each rank, rank 1 two from rank 1 and one from rank 0.
    assert outs[0]["a2a-values"] == "[0.0, 0.0]" and outs[1]["a2a-values"] == "[1.0, 1.0, 2.0]"


def test_every_spec_has_exactly_one_graph_form() -> None:
    """``graph._forms.run`` looks the form up by spec name: every public collective's spec must have one."""
    from xccl.graph import _forms
    from xccl.ops import _specs as S

    names = {s.name for s in S.SPECS.values()} | {S.ISEND.name, S.IRECV.name}
    assert set(_forms._FORMS) == names
