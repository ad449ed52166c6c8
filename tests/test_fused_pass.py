"""The matmul + collective fusion pass (xccl.fused._pass) on live gloo ranks.

Graphs are traced with ``make_fx`` (fake tensors, the post-autograd form Inductor's post-grad passes see) from
functions written with torch's functional collectives; each test runs the graph before and after the pass for
real and compares. The last test compiles a tensor-parallel MLP with Inductor and the pass installed, counts the
fused nodes in the forward and backward graphs, and checks values and gradients against eager mode.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.collectives._groups import register
from xccl.fused._pass import FusedMatmulPass, fuse_matmul_collectives
from xccl.plugin import Collective, Level, Plugin, Runtime, Support, table_from

C = Collective
FUSED = ("torch.ops.xccl.mm_reduce_scatter", "torch.ops.xccl.all_gather_mm")
UNFUSED = ("_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_gather_into_tensor")


def _funcol() -> Any:
    import torch.distributed._functional_collectives as funcol

    return funcol


def _ag(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return _funcol().all_gather_tensor(x, dim, group)


def _rs(x: torch.Tensor, op: str, dim: int, group: Any) -> torch.Tensor:
    return _funcol().reduce_scatter_tensor(x, op, dim, group)


# Model functions, with the group and reduce op as parameters: the pass must match any of them.


def tp_mlp_2d(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, group: Any, op: str) -> Any:
    g = _ag(x, 0, group)
    return _rs(torch.relu(g @ w1) @ w2, op, 0, group), g * 2  # the gathered input is used again


def tp_mlp_seq_dim(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, bias: torch.Tensor, group: Any, op: str) -> Any:
    # (batch, seq / W, hidden), sequence-parallel on dim 1: the split/cat forms, 3-D reshapes, addmm with bias
    g = _ag(x, 1, group)
    y = torch.nn.functional.linear(torch.relu(g @ w1), w2.t(), bias)
    return _rs(y, op, 1, group)


def tp_mlp_batch_dim(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, group: Any, op: str) -> Any:
    # (batch / W, seq, hidden), gathered and scattered on dim 0 of a 3-D tensor: reshapes only
    g = _ag(x, 0, group)
    return _rs(torch.relu(g @ w1) @ w2, op, 0, group)


def product_reused(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, group: Any, op: str) -> Any:
    y = x @ w2
    return _rs(y, op, 0, group), y.sum()  # the full product is needed: no mm_reduce_scatter


MODELS: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]], dict[str, int]]] = {
    "2d": (tp_mlp_2d, lambda w, r: (torch.randn(4, 8), torch.randn(8, 6), torch.randn(6, 8)),
           {"mm_reduce_scatter": 1, "all_gather_mm": 1}),
    "seq_dim": (tp_mlp_seq_dim, lambda w, r: (torch.randn(2, 3, 8), torch.randn(8, 6), torch.randn(6, 8),
                                              torch.randn(8)), {"mm_reduce_scatter": 1, "all_gather_mm": 1}),
    "batch_dim": (tp_mlp_batch_dim, lambda w, r: (torch.randn(2, 3, 8), torch.randn(8, 6), torch.randn(6, 8)),
                  {"mm_reduce_scatter": 1, "all_gather_mm": 1}),
    "product_reused": (product_reused, lambda w, r: (torch.randn(4 * w, 8), torch.randn(8, 6), torch.randn(8, 5)),
                       {"mm_reduce_scatter": 0, "all_gather_mm": 0}),
}


def _subgroup() -> Any:
    global _SUB
    if _SUB is None:
        _SUB = dist.new_group(list(range(dist.get_world_size())))
    return _SUB


_SUB: Any = None


def _trace(name: str, group: Any, op: str) -> tuple[Any, tuple[torch.Tensor, ...]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, make, _ = MODELS[name]
    torch.manual_seed(dist.get_rank())
    args = make(dist.get_world_size(), dist.get_rank())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # funcol's renamed functions
        gm = make_fx(lambda *a: fn(*a, group, op), tracing_mode="fake")(*args)
    return gm, args


def _count(gm: Any, names: tuple[str, ...]) -> int:
    code = gm.code
    return sum(code.count(n) for n in names)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    return all(_same(x, y) for x, y in zip(a, b, strict=False))


def body_forms(group_kind: str, op: str) -> dict[str, Any]:
    group = dist.group.WORLD if group_kind == "world" else _subgroup()
    report: dict[str, Any] = {}
    for name, (_fn, _make, _want) in MODELS.items():
        gm, args = _trace(name, group, op)
        before = gm(*args)
        fused = fuse_matmul_collectives(gm)
        after = gm(*args)
        report[name] = {
            "rewrites": fused,
            "fused_ops": _count(gm, FUSED),
            "unfused_left": _count(gm, UNFUSED),
            "same": _same(before, after),
        }
    return report


@pytest.mark.parametrize(("group_kind", "op"), [("world", "sum"), ("sub", "avg")])
def test_pass_fuses_every_form_for_any_group_and_reduce_op(rank_pools: Any, group_kind: str, op: str) -> None:
    outs = rank_pools.get(2).run_ok(body_forms, group_kind, op, timeout=120)
    assert outs[0] == outs[1]
    for name, (_fn, _make, want) in MODELS.items():
        got = outs[0][name]
        assert got["same"], name
        expected = sum(want.values())
        assert got["rewrites"] == expected and got["fused_ops"] == expected, (name, got)
        if name != "product_reused":
            assert got["unfused_left"] == 0, (name, got)


# ----------------------------------------------------------------------- the plugin's predicate says no


def _refuse_small_k(op: str, b: torch.Tensor) -> None:
    if b.shape[0] < 256:
        raise xccl.ConstraintViolation(op, "mc2like", "k >= 256", f"k={b.shape[0]}")


def _kernel(op: str) -> Any:
    def kernel(ctx: Any, a: torch.Tensor, b: torch.Tensor, *rest: Any) -> Any:
        _refuse_small_k(op, b)
        raise AssertionError("not reached in these tests")

    kernel.check = lambda a, b, world_size, **_: _refuse_small_k(op, b)  # type: ignore[attr-defined]
    return kernel


class Mc2LikeRuntime(Runtime):
    def kernels(self) -> dict[Collective, Any]:
        return {op: _kernel(op.value) for op in (C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE)}


class Mc2Like(Plugin):
    name = "mc2like"
    accelerator = False

    def capabilities(self) -> Any:
        return table_from("mc2like", {op: Support(Level.NATIVE) for op in C})

    def runtime(self, *, simulate: bool) -> Runtime:
        return Mc2LikeRuntime(self, simulate=simulate)


_MC2: Any = None


def _mc2_group() -> Any:
    """A real group whose dispatch context has kernels refusing k < 256 (xccl's group registry is the seam)."""
    global _MC2
    if _MC2 is None:
        _MC2 = dist.new_group(list(range(dist.get_world_size())))
        register(_MC2, Mc2LikeRuntime(Mc2Like(), simulate=False), "warn")
    return _MC2


def body_refused() -> dict[str, Any]:
    report = {}
    gm, _ = _trace("2d", _mc2_group(), "sum")
    code = gm.code
    report["plugin says no"] = (fuse_matmul_collectives(gm), gm.code == code)
    gm, _ = _trace("2d", dist.group.WORLD, "sum")
    code = gm.code
    report["predicate says no"] = (fuse_matmul_collectives(gm, lambda *a, **k: False), gm.code == code)
    seen: list[tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = []

    def spy(op: Collective, a: torch.Tensor, b: torch.Tensor, name: str, size: int, **options: Any) -> bool:
        seen.append((op.value, tuple(a.shape), tuple(b.shape), {k: v for k, v in options.items() if k != "bias"}))
        return True

    gm, _ = _trace("seq_dim", dist.group.WORLD, "avg")
    fuse_matmul_collectives(gm, spy)
    report["predicate saw"] = seen
    return report


def test_pass_leaves_graph_unchanged_where_the_kernel_cannot_take_the_shape(rank_pools: Any) -> None:
    r = rank_pools.get(2).run_ok(body_refused, timeout=120)[0]
    assert r["plugin says no"] == (0, True)
    assert r["predicate says no"] == (0, True)
    # The predicate sees the fused op's operands (2-D, local rows) and options, e.g. for an Ascend-style check.
    assert sorted(r["predicate saw"]) == [
        ("all_gather_mm", (6, 8), (8, 6), {"gather_output": False}),
        ("mm_reduce_scatter", (12, 6), (6, 8), {"reduce_op": "avg"}),
    ]


# --------------------------------------------------------------------- compiled: a TP MLP under Inductor


def tp_mlp_inplace(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Sequence-parallel MLP as users write it, with in-place torch.distributed collectives."""
    w = dist.get_world_size()
    g = x.new_empty((x.shape[0] * w, *x.shape[1:]))
    dist.all_gather_into_tensor(g, x)
    y = torch.relu(g @ w1) @ w2
    out = y.new_empty((y.shape[0] // w, *y.shape[1:]))
    dist.reduce_scatter_tensor(out, y)
    return out


def body_compiled() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters["xccl"].clear()
    torch.manual_seed(dist.get_rank())
    params = [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 16)]
    x, w1, w2 = (p.clone().requires_grad_() for p in params)
    # xccl.compile installs the fusion pass by itself (fuse=True is its default).
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore", FutureWarning)
        # The pass runs only when Inductor compiles: a hit in the FX-graph cache (which persists across runs in
        # the temp directory) would skip it, and the counters it is judged by would stay empty.
        stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        compiled = xccl.compile(tp_mlp_inplace, fullgraph=True)
        out = compiled(x, w1, w2)
        out.square().sum().backward()
    # Eager, unfused reference with torch's differentiable functional collectives.
    x2, w12, w22 = (p.clone().requires_grad_() for p in params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ref = _rs(torch.relu(_ag(x2, 0, dist.group.WORLD) @ w12) @ w22, "sum", 0, dist.group.WORLD)
    ref.square().sum().backward()
    same = torch.allclose(out, ref, atol=1e-4, rtol=1e-4) and all(
        torch.allclose(p.grad, q.grad, atol=1e-3, rtol=1e-4) for p, q in zip((x, w1, w2), (x2, w12, w22), strict=False)
    )
    return {"same": same, "counters": dict(counters["xccl"])}


def test_pass_fires_on_a_compiled_tp_mlp_and_matches_eager(rank_pools: Any) -> None:
    outs = rank_pools.get(2).run_ok(body_compiled, timeout=300)
    for r in outs:
        assert r["same"]
        # forward: all_gather -> mm and mm -> reduce_scatter; backward: the same two, transposed
        assert r["counters"] == {"fused_mm_reduce_scatter": 2, "fused_all_gather_mm": 2}


def test_uuid_keys_the_fx_graph_cache() -> None:
    p = FusedMatmulPass()
    assert isinstance(p.uuid(), bytes) and p.uuid() == FusedMatmulPass().uuid()

    def never(*a: Any, **k: Any) -> bool:
        return False

    assert FusedMatmulPass(never).uuid() != p.uuid()
