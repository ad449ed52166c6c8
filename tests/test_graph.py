"""Graph mode on gloo: every public collective compiled with fullgraph=True against the same code run eagerly.

One body, :func:`body_all_ops`, runs every collective (in-place results, uneven ops, async handles, a send/recv
ring whose order differs between even and odd ranks) eagerly and then compiled, under the eager, aot_eager and
inductor backends, with static and dynamic shapes, on the world and on sub-groups; it returns, per result,
whether the compiled value equals the eager one exactly, and how many graphs and graph breaks Dynamo produced.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

BODY_TIMEOUT = 300.0
_GROUPS: dict[tuple[int, ...], Any] = {}


def _halves() -> tuple[Any, tuple[int, ...]]:
    """This rank's half of a 4-rank world, as a sub-group: {0, 2} or {1, 3} (created once, on every rank)."""
    w = xccl.get_world()
    if not _GROUPS:
        for ranks in ((0, 2), (1, 3)):
            _GROUPS[ranks] = xccl.new_group(list(ranks))
    ranks = (0, 2) if w.rank % 2 == 0 else (1, 3)
    return _GROUPS[ranks], ranks


def _count(i: int, j: int) -> int:
    return 1 + (i + 2 * j) % 3


#: Group size and group rank for _program, as a global: with dynamic=True Dynamo turns integers captured in a
#: closure into symbols, and a root or peer must be a constant (xccl raises Unsupported for a symbolic one).
_CFG: dict[str, int] = {}


def _program(group: Any, n: int, me: int) -> Any:
    """Every public collective on group ``group`` (``n`` ranks, this one group rank ``me``), in one function."""
    R = dist.ReduceOp
    _CFG.update(n=n, me=me)

    def f(x: torch.Tensor) -> dict[str, Any]:
        n, me = _CFG["n"], _CFG["me"]
        uneven = [1 + i % 3 for i in range(n)]
        k = x.shape[0]
        out: dict[str, Any] = {}
        t = x * 2
        xccl.all_reduce(t, group=group)
        out["all_reduce"] = t
        t = x.clone()
        xccl.all_reduce(t, R.MAX, group)
        out["all_reduce_max"] = t
        t = x.clone()
        work = xccl.all_reduce(t, R.AVG, group, async_op=True)
        work.wait()
        out["all_reduce_async_avg"] = t
        t = torch.arange(6, dtype=torch.int64).reshape(2, 3) + me
        xccl.all_reduce(t, R.AVG, group)  # integer avg: emulated as sum then a divide
        out["all_reduce_int_avg"] = t
        lst = [torch.zeros_like(x) for _ in range(n)]
        xccl.all_gather(lst, x + 1, group)
        out["all_gather"] = torch.stack(lst)
        t = x.new_zeros(n * k)
        xccl.all_gather_into_tensor(t, x, group)
        out["all_gather_into_tensor"] = t
        t = x.new_zeros(k)
        xccl.reduce_scatter(t, [x + i for i in range(n)], group=group)
        out["reduce_scatter"] = t
        t = x.new_zeros(k // n)
        xccl.reduce_scatter_tensor(t, x * 3, group=group)
        out["reduce_scatter_tensor"] = t
        outs = [x.new_zeros(k // n) for _ in range(n)]
        xccl.all_to_all(outs, list((x + 5).chunk(n)), group)
        out["all_to_all"] = torch.cat(outs)
        t = torch.zeros_like(x)
        xccl.all_to_all_single(t, x - 1, group=group)
        out["all_to_all_single"] = t
        isz = [_count(me, j) for j in range(n)]
        osz = [_count(j, me) for j in range(n)]
        src = torch.arange(sum(isz), dtype=torch.float32) + 100 * me
        t = torch.zeros(sum(osz))
        xccl.all_to_all_single(t, src, osz, isz, group)
        out["all_to_all_single_uneven"] = t
        t = x.clone()
        xccl.broadcast(t, group=group, group_src=n - 1)
        out["broadcast"] = t
        t = x + 7
        xccl.reduce(t, op=R.SUM, group=group, group_dst=0)
        out["reduce"] = t
        lst = [torch.zeros_like(x) for _ in range(n)] if me == 1 else None
        xccl.gather(x + 3, lst, group=group, group_dst=1)
        out["gather"] = torch.stack(lst) if lst is not None else x.new_zeros(0)
        t = torch.zeros_like(x)
        xccl.scatter(t, [x * (i + 1) for i in range(n)] if me == 0 else None, group=group, group_src=0)
        out["scatter"] = t
        xccl.barrier(group)
        # A ring in both directions, with the order of send and recv opposite on even and odd ranks: a
        # reordering scheduler deadlocks it, a missing copy into the buffer gives zeros.
        nxt, prv = (me + 1) % n, (me - 1) % n
        right, left = torch.zeros_like(x), torch.zeros_like(x)
        if me % 2 == 0:
            xccl.send(x + 10, group=group, group_dst=nxt)
            xccl.recv(right, group=group, group_src=prv)
            xccl.send(x + 20, group=group, group_dst=prv)
            xccl.recv(left, group=group, group_src=nxt)
        else:
            xccl.recv(right, group=group, group_src=prv)
            xccl.send(x + 10, group=group, group_dst=nxt)
            xccl.recv(left, group=group, group_src=nxt)
            xccl.send(x + 20, group=group, group_dst=prv)
        out["ring_right"], out["ring_left"] = right, left
        t = torch.zeros_like(x)
        sent = xccl.isend(x + 30, group=group, group_dst=nxt)
        got = xccl.irecv(t, group=group, group_src=prv)
        sent.wait()
        got.wait()
        out["isend_irecv"] = t
        rows = torch.arange(uneven[me] * 2, dtype=torch.float32).reshape(uneven[me], 2) + 10 * me
        t = torch.zeros(sum(uneven), 2)
        xccl.all_gather_into_tensor_uneven(t, rows, uneven, group)
        out["all_gather_into_tensor_uneven"] = t
        t = torch.zeros(uneven[me], 2)
        xccl.reduce_scatter_tensor_uneven(t, torch.ones(sum(uneven), 2) * (me + 1), uneven, group=group)
        out["reduce_scatter_tensor_uneven"] = t
        matrix = [[_count(i, j) for j in range(n)] for i in range(n)]
        t = torch.zeros(sum(row[me] for row in matrix))
        xccl.all_to_all_v(t, torch.arange(sum(matrix[me]), dtype=torch.float32) + 50 * me, matrix, group)
        out["all_to_all_v"] = t
        return out

    return f


def _breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def body_all_ops(backends: list[str], dynamic: bool, subgroup: bool) -> dict[str, Any]:
    """Compile :func:`_program` under each backend; per backend: mismatching results, graphs, graph breaks."""
    from torch._dynamo.testing import CompileCounterWithBackend

    w = xccl.get_world()
    if subgroup:
        group, ranks = _halves()
        n, me = len(ranks), ranks.index(w.rank)
    else:
        group, n, me = None, w.world_size, w.rank
    f = _program(group, n, me)
    sizes = (2 * n, 4 * n) if dynamic else (2 * n,)
    report: dict[str, Any] = {}
    for backend in backends:
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=dynamic)
        before = _breaks()
        bad = []
        for k in sizes:
            x = torch.arange(k, dtype=torch.float32) + 100 * w.rank
            ref, got = f(x.clone()), compiled(x.clone())
            bad += [f"{name}@{k}" for name in ref if not torch.equal(ref[name], got[name])]
        report[backend] = {"bad": bad, "graphs": counter.frame_count, "breaks": _breaks() - before}
    return report


def _check(outs: list[dict[str, Any]], backends: list[str]) -> None:
    for rank, report in enumerate(outs):
        for backend in backends:
            r = report[backend]
            assert r["bad"] == [], f"rank {rank}, {backend}: compiled differs from eager in {r['bad']}"
            assert (r["graphs"], r["breaks"]) == (1, 0), f"rank {rank}, {backend}: {r}"


# This one with dynamic shapes (10 s) in the second tier: the first compiles every collective with static shapes
# here and with dynamic ones on subgroups below.
@pytest.mark.parametrize("dynamic", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "dynamic"])
def test_every_collective_compiles_like_eager_2_ranks(rank_pools: Any, dynamic: bool) -> None:
    backends = ["eager", "aot_eager", "inductor"]
    _check(rank_pools.get(2).run_ok(body_all_ops, backends, dynamic, False, timeout=BODY_TIMEOUT * 2), backends)


@pytest.mark.slow
def test_every_collective_compiles_like_eager_4_ranks(rank_pools: Any) -> None:
    backends = ["eager", "inductor"]
    _check(rank_pools.get(4).run_ok(body_all_ops, backends, False, False, timeout=BODY_TIMEOUT * 2), backends)


def test_every_collective_on_subgroups_4_ranks(rank_pools: Any) -> None:
    """Roots and peers given as group ranks map to the right processes in {0, 2} and {1, 3} at once."""
    backends = ["aot_eager"]
    _check(rank_pools.get(4).run_ok(body_all_ops, backends, True, True, timeout=BODY_TIMEOUT), backends)


# ------------------------------------------------------------------------------------------- graph breaks


def body_breaks_without_fullgraph() -> tuple[int, int]:
    """Graphs and graph breaks of a function ending in collectives, compiled without fullgraph.

    ``torch._dynamo.explain`` under-reports a break in the last statement; the counter does not.
    """
    from torch._dynamo.testing import CompileCounterWithBackend

    w = xccl.get_world()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        xccl.broadcast(y, src=0)
        if w.rank == 0:
            xccl.send(y, 1)
        elif w.rank == 1:
            xccl.recv(y, 0)
        xccl.reduce(y, dst=1)
        return y

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    before = _breaks()
    x = torch.ones(4) * (w.rank + 1)
    assert torch.equal(torch.compile(f, backend=counter)(x), f(x))
    return counter.frame_count, _breaks() - before


def test_no_graph_break_counted_without_fullgraph(rank_pools: Any) -> None:
    assert rank_pools.get(2).run_ok(body_breaks_without_fullgraph) == [(1, 0), (1, 0)]


# --------------------------------------------------------------------------------------------- trace errors


def body_unsupported_at_trace_time() -> list[str]:
    """Ops the cpu table refuses raise typed errors while tracing, before any rank communicates."""
    R = dist.ReduceOp
    premul = dist._make_nccl_premul_sum(2.0)
    found = []
    cases = {
        "premul_sum": lambda t: xccl.all_reduce(t, premul),
        "band_on_float": lambda t: xccl.reduce_scatter_tensor(torch.zeros(2), t, R.BAND),
        "peer_is_self": lambda t: xccl.send(t, xccl.get_world().rank),
        "non_member_root": lambda t: xccl.broadcast(t, src=7),
    }
    for name, fn in cases.items():
        torch._dynamo.reset()
        try:
            torch.compile(fn, fullgraph=True, backend="eager")(torch.ones(4))
        except xccl.UnsupportedCollective:
            found.append(f"{name}:unsupported")
        except xccl.InvalidArgument:
            found.append(f"{name}:invalid")
    return found


def test_unsupported_raises_typed_error_at_trace_time(rank_pools: Any) -> None:
    expected = ["premul_sum:unsupported", "band_on_float:unsupported", "peer_is_self:invalid", "non_member_root:invalid"]
    assert rank_pools.get(2).run_ok(body_unsupported_at_trace_time) == [expected, expected]
