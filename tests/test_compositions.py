"""Compositions chosen by measurement (``Prefer``), and the uneven collectives without padding.

The cpu table prefers reduce_scatter_tensor via all_to_all_single + a local reduction from ``RS_VIA_ALL_TO_ALL
.min_bytes`` of input (a size every rank passes alike), and at every size on 4 ranks, and list all_to_all via one
all_to_all_single with split sizes at every size; the uneven all_gather / reduce_scatter run over all_to_all_single with split sizes.

On real 2- and 4-rank gloo groups: the preferred compositions' results equal gloo's own on a plain gloo group
(``xccl.runtime.vendor_group``: no xccl in between) for every dtype and reduce op gloo has, and each rank made the
same choice, which a scratch buffer in the group's pool witnesses (native kernels take none); below the threshold
the native kernel runs. Preferred compositions neither warn nor count as emulation under ``fallback="error"``, and
a compiled call makes the same choice as the eager one. The uneven ops are checked against a reference every rank
computes, with zero-length contributions and trailing dimensions, and their scratch shows that no padded buffer
was allocated. The table itself refuses preferences that ranks could resolve differently.
"""

from __future__ import annotations

import functools
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.backends.cpu import A2A_VIA_SINGLE, RS_VIA_ALL_TO_ALL, RS_VIA_ALL_TO_ALL_SMALL
from xccl.collectives._emulate import AGREED_BYTES, by_size
from xccl.collectives._groups import register, state_of
from xccl.collectives._scratch import size_class
from xccl.collectives._state import PROCESS
from xccl.plugin import AGREED_SIZE, PORTABLE, Collective, Level, Prefer, Support, table_from
from xccl.tools._render import cell, footnote, render_text

C = Collective
MIN = RS_VIA_ALL_TO_ALL.min_bytes
REDOP = {name: getattr(dist.ReduceOp, name.upper()) for name in
         ("sum", "product", "min", "max", "avg", "band", "bor", "bxor")}
FLOAT_OPS = ("sum", "avg", "product", "min", "max")
INT_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
BOOL_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor")
#: dtype -> reduce ops checked against gloo's reduce_scatter_tensor.
RS_CASES = {
    "float32": FLOAT_OPS, "bfloat16": FLOAT_OPS, "int64": INT_OPS, "int8": INT_OPS, "bool": BOOL_OPS,
    "complex64": ("sum", "avg"),
}
#: Split sizes of the uneven ops, per world size: zero-length contributions, and every rank's empty.
UNEVEN = {2: ([0, 3], [2, 0], [0, 0], [5, 1]), 4: ([2, 0, 3, 1], [0, 0, 0, 5], [0, 0, 0, 0], [1, 2, 3, 4])}
TRAILS = ((), (3,), (2, 3))
BODY_TIMEOUT = 240.0
_RAW: dict[str, Any] = {}


def raw() -> Any:
    """A plain gloo group over every rank (xccl's dispatch not in between), created once per rank process."""
    if "world" not in _RAW:
        from xccl.runtime import vendor_group

        _RAW["world"] = vendor_group()
    return _RAW["world"]


def data(tag: str, rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Group rank ``rank``'s input for ``tag``: the same on every rank that asks."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{tag}|{rank}".encode()))
    if dtype.is_complex:
        return torch.complex(data(tag + "re", rank, shape, torch.float32), data(tag + "im", rank, shape, torch.float32))
    if dtype.is_floating_point:
        # Positive values in [0.5, 1.5): no cancellation, so a relative tolerance bounds the rounding.
        return (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    return torch.randint(-3, 4, tuple(shape), generator=gen, dtype=dtype)


def _composed(st: Any) -> bool:
    """Whether the last call took a scratch buffer (compositions do; native kernels do not). Clears the pool."""
    used = st.scratch.idle_bytes > 0
    st.scratch.clear()
    return used


# ------------------------------------------------------------------------------------------------ rank bodies


def body_reduce_scatter(big: bool) -> dict[str, tuple[Any, ...]]:
    """reduce_scatter_tensor through xccl and through gloo itself: ``{case: (xccl, gloo, composed, via, agreed
    size)}``."""
    n, r = dist.get_world_size(), dist.get_rank()
    st = state_of(None)
    st.scratch.clear()
    out: dict[str, tuple[Any, ...]] = {}
    cols = 7  # rows of 7 elements: no power of two anywhere
    for name, ops in RS_CASES.items():
        dtype = getattr(torch, name)
        rows = -(-MIN // (n * cols * dtype.itemsize)) if big else 3
        for op in ops:
            tag = f"rs|{name}|{op}|{big}"
            x = data(tag, r, (n * rows, cols), dtype)
            got = torch.empty(rows, cols, dtype=dtype)
            xccl.reduce_scatter_tensor(got, x, REDOP[op])
            composed = _composed(st)
            want = torch.empty_like(got)
            as_real = torch.view_as_real if dtype.is_complex else (lambda t: t)
            if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
                # gloo has no integer AVG: its sum, then the truncating divide that avg means for integers.
                dist.reduce_scatter_tensor(want, x, dist.ReduceOp.SUM, group=raw())
                want = torch.div(want, n, rounding_mode="trunc")
            elif op == "avg" and dtype.is_complex:
                dist.reduce_scatter_tensor(as_real(want), as_real(x), dist.ReduceOp.SUM, group=raw())
                want /= n
            else:
                dist.reduce_scatter_tensor(as_real(want), as_real(x), REDOP[op], group=raw())
            res = st.table.resolve(C.REDUCE_SCATTER_TENSOR, dtype=dtype, reduce_op=op, world_size=n,
                                   nbytes=x.numel() * x.element_size())
            out[f"{name}|{op}"] = (got, want, composed, res.via, x.numel() * x.element_size())
    return out


def _ref_all_to_all(m: list[list[int]], tag: str, dtype: torch.dtype, r: int) -> list[torch.Tensor]:
    n = len(m)
    xs = [data(tag, j, (sum(m[j]), 3), dtype) for j in range(n)]
    return [xs[j].split(m[j])[r] for j in range(n)]


def body_all_to_all() -> dict[str, tuple[Any, ...]]:
    """List all_to_all through xccl against gloo's own (equal sizes) or the reference (unequal sizes)."""
    n, r = dist.get_world_size(), dist.get_rank()
    st = state_of(None)
    out: dict[str, tuple[Any, ...]] = {}
    for name in ("float32", "int8", "bool", "complex64"):
        dtype = getattr(torch, name)
        for shape in ("even", "uneven"):
            # Uneven: rank 0's own sizes are all equal, its peers' are not; no rank sees the others'.
            m = [[4 if shape == "even" else 1 + (i * j) % 3 for j in range(n)] for i in range(n)]
            tag = f"a2a|{name}|{shape}"
            ins = [c.clone() for c in data(tag, r, (sum(m[r]), 3), dtype).split(m[r])]
            outs = [torch.empty(m[j][r], 3, dtype=dtype) for j in range(n)]
            st.scratch.clear()
            xccl.all_to_all(outs, ins)
            composed = _composed(st)
            if shape == "even":
                want = [torch.empty_like(t) for t in outs]
                dist.all_to_all(want, ins, group=raw())
            else:
                want = _ref_all_to_all(m, tag, dtype, r)
            res = st.table.resolve(C.ALL_TO_ALL, dtype=dtype, world_size=n)
            out[f"{name}|{shape}"] = (torch.cat(outs), torch.cat(want), composed, res.via)
    return out


def body_policies() -> dict[str, Any]:
    """Preferred compositions under fallback="error" (allowed: the op is native) and "warn" (silent)."""
    n, r = dist.get_world_size(), dist.get_rank()
    out: dict[str, Any] = {}
    for policy in ("error", "warn"):
        g = xccl.new_group()
        st = register(g, PROCESS.runtime, fallback=policy)  # type: ignore[arg-type]
        rows = -(-MIN // (n * 4))
        x = torch.arange(float(n * rows)) + r
        got = torch.empty(rows)
        ins = [torch.full((2,), float(r)) for _ in range(n)]
        outs = [torch.empty(2) for _ in range(n)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xccl.reduce_scatter_tensor(got, x, group=g)
            rs_composed = _composed(st)
            xccl.all_to_all(outs, ins, group=g)
        out[policy] = {
            "rs": torch.equal(got, n * torch.arange(float(n * rows)).view(n, rows)[r] + sum(range(n))),
            "rs_composed": rs_composed,
            "a2a": [t.tolist() for t in outs] == [[float(j)] * 2 for j in range(n)],
            "warnings": [str(w.message) for w in caught],
        }
        dist.destroy_process_group(g)
    return out


def body_uneven() -> dict[str, tuple[Any, ...]]:
    """Uneven all_gather / reduce_scatter against the reference: ``{case: (result, reference, scratch bytes,
    the bytes of an unpadded buffer, via)}``, sync and async."""
    n, r = dist.get_world_size(), dist.get_rank()
    st = state_of(None)
    out: dict[str, tuple[Any, ...]] = {}
    for a in (False, True):
        for sizes in UNEVEN[n]:
            for trail in TRAILS:
                row = functools.reduce(lambda p, q: p * q, trail, 1)
                for name in ("float32", "int64", "bool", "complex64"):
                    dtype = getattr(torch, name)
                    tag = f"ag|{sizes}|{trail}|{name}"
                    xs = [data(tag, j, (sizes[j], *trail), dtype) for j in range(n)]
                    got = torch.empty(sum(sizes), *trail, dtype=dtype)
                    st.scratch.clear()
                    w = xccl.all_gather_into_tensor_uneven(got, xs[r], sizes, async_op=a)
                    if a:
                        w.wait()
                    unpadded = n * sizes[r] * row * dtype.itemsize
                    via = st.table.resolve(C.ALL_GATHER_INTO_TENSOR_UNEVEN, dtype=dtype, world_size=n).via
                    out[f"ag|{sizes}|{trail}|{name}|{a}"] = (got, torch.cat(xs), st.scratch.idle_bytes, unpadded, via)

                    ops = ("sum", "max") if name != "bool" else ("sum", "band")
                    ops = ("sum", "avg") if name == "complex64" else ops + (("avg",) if name == "int64" else ())
                    for op in ops:
                        tag = f"rs|{sizes}|{trail}|{name}|{op}"
                        xs = [data(tag, j, (sum(sizes), *trail), dtype) for j in range(n)]
                        got = torch.empty(sizes[r], *trail, dtype=dtype)
                        st.scratch.clear()
                        w = xccl.reduce_scatter_tensor_uneven(got, xs[r], sizes, REDOP[op], async_op=a)
                        if a:
                            w.wait()
                        chunks = [x.split(sizes)[r] for x in xs]
                        via = st.table.resolve(C.REDUCE_SCATTER_TENSOR_UNEVEN, dtype=dtype, reduce_op=op,
                                               world_size=n).via
                        out[f"rs|{sizes}|{trail}|{name}|{op}|{a}"] = (got, _reduce(chunks, op), st.scratch.idle_bytes,
                                                                     unpadded, via)
    return out


def _reduce(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction (float64 / complex128 for floats)."""
    dtype = xs[0].dtype
    if dtype is torch.bool:
        fn = torch.logical_or if op == "sum" else torch.logical_and
        return functools.reduce(fn, xs)
    wide = [x.to(torch.complex128 if dtype.is_complex else torch.float64) if dtype.is_floating_point or dtype.is_complex
            else x for x in xs]
    if op == "max":
        return functools.reduce(torch.maximum, wide)
    total = functools.reduce(torch.add, wide)
    if op == "avg":
        return total / len(xs) if total.is_floating_point() or total.is_complex() else torch.div(
            total, len(xs), rounding_mode="trunc")
    return total


def body_graph() -> dict[str, Any]:
    """reduce_scatter_tensor above the threshold, compiled (fullgraph) and eager: the same result, both composed."""
    n, r = dist.get_world_size(), dist.get_rank()
    st = state_of(None)
    rows = -(-MIN // (n * 4))

    def f(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows, dtype=x.dtype)
        xccl.reduce_scatter_tensor(out, x)
        return out

    x = data("graph", r, (n * rows,), torch.float32)
    st.scratch.clear()
    eager = f(x)
    eager_composed = _composed(st)
    compiled = torch.compile(f, backend="eager", fullgraph=True)(x)
    return {"equal": torch.equal(eager, compiled), "eager_composed": eager_composed,
            "compiled_composed": _composed(st)}


# ----------------------------------------------------------------------------------------------- parent side


def _agree(got: torch.Tensor, want: torch.Tensor, n: int, what: str) -> None:
    if got.dtype.is_floating_point or got.dtype.is_complex:
        real = got.dtype.to_real() if got.dtype.is_complex else got.dtype
        # Each side within n*eps of the exact value (positive inputs, see tests/test_emulation.py tol()).
        rtol = 2 * n * torch.finfo(real).eps
        torch.testing.assert_close(got.to(want.dtype), want, rtol=rtol, atol=0.0, msg=lambda m: f"{what}: {m}")
    else:
        assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: got\n{got}\nwant\n{want}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_preferred_reduce_scatter_equals_gloo_and_every_rank_chooses_alike(rank_pools: Any, world_size: int) -> None:
    pool = rank_pools.get(world_size, vendor="cpu", fallback="emulate")
    seen = set()
    for big in (True, False):
        per_rank = pool.run_ok(body_reduce_scatter, big, timeout=BODY_TIMEOUT)
        for key in per_rank[0]:
            prefer = any(p.applies(per_rank[0][key][4], world_size) for p in (RS_VIA_ALL_TO_ALL, RS_VIA_ALL_TO_ALL_SMALL))
            want = (True, "all_to_all") if prefer else (False, "")
            choices = {rec[key][2:4] for rec in per_rank}
            assert choices == {want}, f"{key} big={big}: ranks chose {choices}, expected {want}"
            seen.add(want)
            for rank, rec in enumerate(per_rank):
                _agree(rec[key][0], rec[key][1], world_size, f"{key} big={big} rank {rank}")
    # Both sides of the threshold at 2 ranks; at 4 the composition at every size.
    assert seen == ({(True, "all_to_all"), (False, "")} if world_size == 2 else {(True, "all_to_all")})


@pytest.mark.parametrize("world_size", [2, 4])
def test_preferred_all_to_all_equals_gloo_with_equal_and_unequal_sizes(rank_pools: Any, world_size: int) -> None:
    per_rank = rank_pools.get(world_size, vendor="cpu", fallback="emulate").run_ok(body_all_to_all)
    for key in per_rank[0]:
        assert {(rec[key][2], rec[key][3]) for rec in per_rank} == {(True, "all_to_all_single")}, key
        for rank, rec in enumerate(per_rank):
            _agree(rec[key][0], rec[key][1], world_size, f"{key} rank {rank}")


def test_preferred_compositions_are_not_emulation_for_the_fallback_policy(rank_pools: Any) -> None:
    for rank, out in enumerate(rank_pools.get(2, vendor="cpu", fallback="emulate").run_ok(body_policies)):
        for policy in ("error", "warn"):
            got = out[policy]
            assert got["rs"] and got["a2a"] and got["rs_composed"], f"rank {rank} {policy}: {got}"
            assert got["warnings"] == [], f"rank {rank} {policy}: {got['warnings']}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_uneven_ops_move_their_splits_unpadded(rank_pools: Any, world_size: int) -> None:
    per_rank = rank_pools.get(world_size, vendor="cpu", fallback="emulate").run_ok(body_uneven, timeout=BODY_TIMEOUT)
    assert len(per_rank[0]) > 100
    for key in per_rank[0]:
        for rank, rec in enumerate(per_rank):
            got, want, scratch, unpadded, via = rec[key]
            assert via == "all_to_all_single", key
            _agree(got, want, world_size, f"{key} rank {rank}")
            # The only buffer taken is this rank's rows once per peer (all_gather) or its own chunk once per peer
            # (reduce_scatter): world size x this rank's split, never world size x the largest split.
            assert scratch == size_class(unpadded), f"{key} rank {rank}: {scratch} bytes of scratch for {unpadded}"


def test_compiled_call_chooses_as_the_eager_one(rank_pools: Any) -> None:
    for rank, out in enumerate(rank_pools.get(2, vendor="cpu", fallback="emulate").run_ok(body_graph, timeout=120)):
        assert out == {"equal": True, "eager_composed": True, "compiled_composed": True}, f"rank {rank}: {out}"


# ------------------------------------------------------------------------------------------ the table alone


def _table(op: Collective, sup: Support) -> Any:
    native = Support(Level.NATIVE)
    return table_from("t", {o: native for o in Collective} | dict(PORTABLE) | {op: sup})


def test_resolution_follows_size_and_world_size() -> None:
    p = Prefer("all_to_all", min_bytes=1 << 20, max_bytes=64 << 20, world_sizes=(2, 4), why="measured")
    t = _table(C.REDUCE_SCATTER_TENSOR, Support(Level.NATIVE, prefer=(p,)))
    rs = functools.partial(t.resolve, C.REDUCE_SCATTER_TENSOR, dtype=torch.float32, reduce_op="sum")
    assert rs(world_size=2, nbytes=1 << 20).via == "all_to_all"
    assert rs(world_size=4, nbytes=(64 << 20) - 1).prefer is p
    assert rs(world_size=2, nbytes=(1 << 20) - 1).via == ""
    assert rs(world_size=2, nbytes=64 << 20).via == ""
    assert rs(world_size=8, nbytes=2 << 20).via == ""
    assert rs(world_size=2).via == ""  # size unknown: a bounded preference does not apply
    assert rs(world_size=2, nbytes=2 << 20).level is Level.NATIVE
    # premul_sum over an integer: the host reduction cannot, so the native kernel stays.
    assert t.resolve(C.REDUCE_SCATTER_TENSOR, dtype=torch.int32, reduce_op="premul_sum", world_size=2,
                     nbytes=2 << 20).via == ""
    assert t.size_bounds(C.REDUCE_SCATTER_TENSOR, world_size=2) == (1 << 20, 64 << 20)
    assert t.size_bounds(C.REDUCE_SCATTER_TENSOR, world_size=8) == ()
    assert t.to_dict()["reduce_scatter_tensor"]["eager"]["prefer"] == [p.to_dict()]  # type: ignore[index]


def test_table_refuses_preferences_ranks_could_resolve_differently() -> None:
    with pytest.raises(ValueError, match="do not agree on a size"):
        _table(C.ALL_TO_ALL, Support(Level.NATIVE, prefer=(Prefer("all_to_all_single", min_bytes=1, why="x"),)))
    with pytest.raises(ValueError, match="no composition"):
        _table(C.ALL_REDUCE, Support(Level.NATIVE, prefer=(Prefer("all_to_all", why="x"),)))
    with pytest.raises(ValueError, match="emulated entry"):
        _table(C.ALL_TO_ALL, Support(Level.EMULATED, via="all_to_all_single",
                                     prefer=(Prefer("all_to_all_single", why="x"),)))
    with pytest.raises(ValueError, match="must say why"):
        Prefer("all_to_all")
    with pytest.raises(ValueError, match="min_bytes < max_bytes"):
        Prefer("all_to_all", min_bytes=8, max_bytes=8, why="x")


def test_every_op_with_an_agreed_size_can_compute_it() -> None:
    assert {op.value for op in AGREED_BYTES} == set(AGREED_SIZE)


def test_by_size_picks_the_range_of_the_agreed_size() -> None:
    kernels = [lambda *k, i=i: i for i in range(3)]
    pick = by_size(C.REDUCE_SCATTER_TENSOR, (100, 200), kernels)
    out = torch.empty(1)
    assert [pick(out, torch.empty(e, dtype=torch.int8), None, False) for e in (0, 99, 100, 199, 200, 10**4)] == [
        0, 0, 1, 1, 2, 2]


def test_caps_shows_the_choice_and_why() -> None:
    cpu = xccl.capabilities("cpu")
    assert cell(cpu.entry(C.REDUCE_SCATTER_TENSOR)) == "prefer(all_to_all)"
    assert cell(cpu.entry(C.ALL_TO_ALL)) == "prefer(all_to_all_single)"
    note = footnote(C.REDUCE_SCATTER_TENSOR, cpu.entry(C.REDUCE_SCATTER_TENSOR))
    assert RS_VIA_ALL_TO_ALL.describe() in note and "benchmarks/emulation.py" in note
    assert A2A_VIA_SINGLE.describe() in render_text(cpu)
    assert "prefer(via): native, but composed" in render_text(cpu)
    # The graph column asks the same entries.
    assert cpu.entry(C.REDUCE_SCATTER_TENSOR, "graph").prefer == (RS_VIA_ALL_TO_ALL, RS_VIA_ALL_TO_ALL_SMALL)


def test_a_native_entry_runs_its_kernel_whatever_via_it_carries() -> None:
    """``via`` names an emulated entry's composition only. Before the one planner, dispatch ran such an entry's
    native kernel for real dtypes, while the composition builder took ``via`` for complex ones (viewed as real):
    two rules, two kernels for one entry."""
    t = _table(C.ALL_REDUCE, Support(Level.NATIVE, via="all_gather"))
    for dtype in (torch.float32, torch.complex64):
        res = t.resolve(C.ALL_REDUCE, dtype=dtype, reduce_op="sum", world_size=2)
        assert res.level is Level.NATIVE and res.via == "" and res.native_entry, (dtype, res)


def test_the_planner_answers_from_one_table_question() -> None:
    """plan_call: the resolution at no size, the size ranges and one resolution per range; the policy's refusal
    worded as ``require`` words it."""
    from xccl.collectives._plan import plan_call

    p = Prefer("all_to_all", min_bytes=1 << 20, world_sizes=(2,), why="measured")
    t = _table(C.REDUCE_SCATTER_TENSOR, Support(Level.NATIVE, prefer=(p,)))
    plan = plan_call(t, C.REDUCE_SCATTER_TENSOR, "error", dtype=torch.float32, reduce_op="sum", world_size=2)
    assert plan.native and plan.level is Level.NATIVE and plan.bounds == (1 << 20,)
    assert [r.via for r in plan.by_size] == ["", "all_to_all"]
    assert plan_call(t, C.REDUCE_SCATTER_TENSOR, "warn", dtype=torch.float32, world_size=8).bounds == ()
    emulated = _table(C.ALL_TO_ALL, Support(Level.EMULATED, via="all_to_all_single"))
    assert not plan_call(emulated, C.ALL_TO_ALL, "emulate", dtype=torch.float32, world_size=2).native
    with pytest.raises(xccl.UnsupportedCollective) as got:
        plan_call(emulated, C.ALL_TO_ALL, "error", dtype=torch.float32, world_size=2)
    with pytest.raises(xccl.UnsupportedCollective) as want:
        emulated.require(C.ALL_TO_ALL, dtype=torch.float32, world_size=2, allow_emulated=False)
    assert str(got.value) == str(want.value) and "fallback policy is 'error'" in str(got.value)
