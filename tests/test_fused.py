"""Fused matmul + collective ops (xccl.fused._api) on live gloo ranks: values and gradients against references each
rank computes locally from every rank's (deterministic) inputs, typed errors, and native-kernel dispatch with the
fallback policy.

Each test sends one body to the rank pool that loops over many cases and returns the failures, so the suite stays
fast; a failure names the case.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.collectives._groups import register, state_of
from xccl.plugin import Collective, Level, Plugin, Runtime, Support, table_from

C = Collective
OPS = ("mm_reduce_scatter", "all_gather_mm", "mm_all_reduce")


def operand(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    """A deterministic operand: any rank can rebuild any other rank's."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(shape, generator=g).to(dtype)


def tolerance(dtype: torch.dtype, k: int) -> dict[str, float]:
    if dtype == torch.float32:
        return {"rtol": 1e-4, "atol": 1e-4 * max(1, k) ** 0.5}
    return {"rtol": 3e-2, "atol": 3e-2 * max(1, k) ** 0.5}


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, k: int) -> bool:
    return got.shape == want.shape and got.dtype == dtype and torch.allclose(got.float(), want.float(), **tolerance(dtype, k))


# ------------------------------------------------------------------------------------------ values, every op

#: (m, k, n): m divisible by 4 for mm_reduce_scatter, rows not divisible by the chunk counts below; k small and
#: large against m and n.
SHAPES = ((20, 3, 10), (28, 96, 6), (12, 40, 33))
CHUNKS = (None, 1, 3, 7)


def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    stack = torch.stack(parts)
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.mean(0)
    if op == "max":
        return stack.max(0).values
    return stack.min(0).values


def body_values(dtypes: tuple[torch.dtype, ...]) -> list[str]:
    rank, w = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    for dtype in dtypes:
        for si, (m, k, n) in enumerate(SHAPES):
            # Reference products in float32 from the low-precision operands themselves.
            a = [operand(r, (m, k), dtype, si) for r in range(w)]
            b = [operand(r, (k, n), dtype, si + 50) for r in range(w)]
            bias = [operand(r, (n,), dtype, si + 90) for r in range(w)]
            prods = [a[r].float() @ b[r].float() for r in range(w)]
            for chunks in CHUNKS:
                case = f"{dtype} m,k,n={m},{k},{n} chunks={chunks}"
                for op in ("sum", "avg", "max"):
                    got = xccl.mm_reduce_scatter(a[rank], b[rank], reduce_op=op, chunks=chunks)
                    if not close(got, _reduce(prods, op).chunk(w)[rank], dtype, k):
                        bad.append(f"mm_reduce_scatter {op} {case}")
                got = xccl.mm_reduce_scatter(a[rank], b[rank], reduce_op=dist.ReduceOp.SUM, bias=bias[rank], chunks=chunks)
                want = sum(prods[r] + bias[r].float() for r in range(w))
                if not close(got, want.chunk(w)[rank], dtype, k):
                    bad.append(f"mm_reduce_scatter bias {case}")
                # all_gather_mm: this rank's b (a column shard) times everyone's rows of a.
                rows = m // w
                shard = [x[:rows] for x in a]
                out, gathered = xccl.all_gather_mm(shard[rank], b[rank], chunks=chunks)
                if not torch.equal(gathered, torch.cat(shard)):
                    bad.append(f"all_gather_mm gathered {case}")
                if not close(out, torch.cat(shard).float() @ b[rank].float(), dtype, k):
                    bad.append(f"all_gather_mm {case}")
                out2, empty = xccl.all_gather_mm(shard[rank], b[rank], gather_output=False, chunks=chunks)
                if empty.numel() != 0 or not close(out2, out.float(), dtype, k):
                    bad.append(f"all_gather_mm gather_output=False {case}")
                for shape3 in ((m, k), (2, m // 2, k)):
                    x = a[rank].reshape(shape3)
                    got = xccl.mm_all_reduce(x, b[rank], bias=bias[rank], chunks=chunks)
                    want = sum(prods[r] + bias[r].float() for r in range(w)).reshape(*shape3[:-1], n)
                    if not close(got, want, dtype, k):
                        bad.append(f"mm_all_reduce a{shape3} {case}")
    # Non-contiguous operands (the backward passes b transposed).
    bt = operand(rank, (6, 9), torch.float32, 7).t()
    at = operand(rank, (9, 4 * w), torch.float32, 8).t()
    got = xccl.mm_reduce_scatter(at, bt, chunks=3)
    want = sum(operand(r, (9, 4 * w), torch.float32, 8).t() @ operand(r, (6, 9), torch.float32, 7).t() for r in range(w))
    if not close(got, want.chunk(w)[rank], torch.float32, 9):
        bad.append("mm_reduce_scatter non-contiguous")
    return bad


# The pools are the session's default ones (shared with the other test files); the ranks' EmulationWarning about
# the portable version stays in the rank processes.


@pytest.mark.parametrize("world_size", [2, 4])
def test_ops_match_unfused_reference(rank_pools: Any, world_size: int) -> None:
    outs = rank_pools.get(world_size).run_ok(body_values, (torch.float32, torch.bfloat16), timeout=180)
    assert outs == [[]] * world_size


# ---------------------------------------------------------------------------------------------- gradients


def _grads(loss: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, xs))


def body_gradients(chunks: int | None, unfused: bool = True) -> list[str]:
    """Gradients against (1) the single-device model every rank rebuilds from all ranks' operands and (2) with
    ``unfused``, torch's differentiable unfused ops (the functional collectives' ``_autograd`` forms: the plain ones
    do not differentiate on torch 2.8, and torch 2.7 has no differentiable all_reduce, composed here of the two)."""
    import torch.distributed._functional_collectives as funcol

    rank, w = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    m, k, n = 4 * w + 4, 5, 6
    a = [operand(r, (m, k), torch.float32, 1) for r in range(w)]
    b = [operand(r, (k, n), torch.float32, 2) for r in range(w)]
    bias = [operand(r, (n,), torch.float32, 3) for r in range(w)]
    grad_w = [operand(r, (m, n), torch.float32, 4) for r in range(w)]  # per-rank loss weights
    tol = {"rtol": 1e-4, "atol": 1e-4}

    def leaves(*ts: torch.Tensor) -> list[torch.Tensor]:
        return [t.clone().requires_grad_() for t in ts]

    # mm_reduce_scatter: loss_r = <out_r, G_r>, total = sum over ranks.
    for op in ("sum", "avg"):
        x, y, z = leaves(a[rank], b[rank], bias[rank])
        out = xccl.mm_reduce_scatter(x, y, reduce_op=op, bias=z, chunks=chunks)
        g_fused = _grads((out * grad_w[rank][: m // w]).sum(), x, y, z)
        g_unfused = g_fused
        if unfused:
            x2, y2, z2 = leaves(a[rank], b[rank], bias[rank])
            ref = funcol.reduce_scatter_tensor_autograd(torch.addmm(z2, x2, y2), "sum", 0, dist.group.WORLD)
            ref = ref / w if op == "avg" else ref
            g_unfused = _grads((ref * grad_w[rank][: m // w]).sum(), x2, y2, z2)
        full = [t.clone().requires_grad_() for t in (*a, *b, *bias)]
        total = sum(torch.addmm(full[2 * w + r], full[r], full[w + r]) for r in range(w)) / (w if op == "avg" else 1)
        loss = sum((total.chunk(w)[r] * grad_w[r][: m // w]).sum() for r in range(w))
        g_model = _grads(loss, full[rank], full[w + rank], full[2 * w + rank])
        for name, g1, g2, g3 in zip(("a", "b", "bias"), g_fused, g_unfused, g_model, strict=False):
            if not (torch.allclose(g1, g2, **tol) and torch.allclose(g1, g3, **tol)):
                bad.append(f"mm_reduce_scatter {op} grad {name}")
    # all_gather_mm: out_r = cat(a shards) @ b_r, loss summed over ranks; the gathered output used too.
    rows = m // w
    for gather_output in (True, False):
        x, y = leaves(a[rank][:rows], b[rank])
        out, gathered = xccl.all_gather_mm(x, y, gather_output=gather_output, chunks=chunks)
        loss = (out * grad_w[rank]).sum() + (gathered.sum() if gather_output else 0)
        g_fused = _grads(loss, x, y)
        full = [t.clone().requires_grad_() for t in (*[t[:rows] for t in a], *b)]
        cat = torch.cat(full[:w])
        loss_model = sum(((cat @ full[w + r]) * grad_w[r]).sum() + (cat.sum() if gather_output else 0) for r in range(w))
        g_model = _grads(loss_model, full[rank], full[w + rank])
        g_unfused = g_fused
        if unfused:
            x2, y2 = leaves(a[rank][:rows], b[rank])
            gathered2 = funcol.all_gather_tensor_autograd(x2, 0, dist.group.WORLD)
            loss2 = ((gathered2 @ y2) * grad_w[rank]).sum() + (gathered2.sum() if gather_output else 0)
            g_unfused = _grads(loss2, x2, y2)
        for name, g1, g2, g3 in zip(("a", "b"), g_fused, g_unfused, g_model, strict=False):
            if not (torch.allclose(g1, g2, **tol) and torch.allclose(g1, g3, **tol)):
                bad.append(f"all_gather_mm gather_output={gather_output} grad {name}")
    # mm_all_reduce: replicated output, one loss (tensor-parallel semantics); the single-device model is the
    # reference, and torch's functional all_reduce (which differentiates the sum of W equal losses) gives W times it.
    for shape in ((m, k), (2, m // 2, k)):
        x, y, z = leaves(a[rank].reshape(shape), b[rank], bias[rank])
        out = xccl.mm_all_reduce(x, y, bias=z, chunks=chunks)
        g_fused = _grads((out.reshape(m, n) * grad_w[0]).sum(), x, y, z)
        full = [t.clone().requires_grad_() for t in (*a, *b, *bias)]
        total = sum(torch.addmm(full[2 * w + r], full[r], full[w + r]) for r in range(w))
        g_model = _grads((total * grad_w[0]).sum(), full[rank], full[w + rank], full[2 * w + rank])
        g_funcol = [g * w for g in g_fused]
        if unfused:
            x2, y2, z2 = leaves(a[rank].reshape(shape), b[rank], bias[rank])
            part = funcol.reduce_scatter_tensor_autograd((torch.matmul(x2, y2) + z2).reshape(m, n), "sum", 0,
                                                         dist.group.WORLD)
            ref = funcol.all_gather_tensor_autograd(part, 0, dist.group.WORLD)
            g_funcol = _grads((ref.reshape(m, n) * grad_w[0]).sum(), x2, y2, z2)
        for name, g1, g3, g4 in zip(("a", "b", "bias"), g_fused, g_model, g_funcol, strict=False):
            if not (torch.allclose(g1.reshape(g3.shape), g3, **tol) and torch.allclose(g1 * w, g4, **tol)):
                bad.append(f"mm_all_reduce a{shape} grad {name}")
    return bad


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("chunks", [1, 3])
def test_gradients_match_unfused(rank_pools: Any, world_size: int, chunks: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # funcol's renamed functions, in the parent only
        outs = rank_pools.get(world_size).run_ok(body_gradients, chunks, timeout=120)
    assert outs == [[]] * world_size


# -------------------------------------------------------------------------------------- typed, identical errors


def _bad_call(case: str) -> None:
    rank, w = dist.get_rank(), dist.get_world_size()
    a, b = torch.randn(4 * w, 8), torch.randn(8, 3)
    calls = {
        "k mismatch": lambda: xccl.mm_reduce_scatter(a, torch.randn(7, 3)),
        "m not divisible": lambda: xccl.mm_reduce_scatter(torch.randn(4 * w + 1, 8), b),
        "int dtype": lambda: xccl.mm_all_reduce(a.long(), b.long()),
        "dtype mismatch": lambda: xccl.all_gather_mm(a, b.double()),
        "a 1-D": lambda: xccl.all_gather_mm(a[0], b),
        "a 3-D": lambda: xccl.mm_reduce_scatter(a.reshape(2, -1, 8), b),
        "a 4-D": lambda: xccl.mm_all_reduce(a.reshape(1, 2, -1, 8), b),
        "b 3-D": lambda: xccl.mm_all_reduce(a, b.reshape(1, 8, 3)),
        "bias shape": lambda: xccl.mm_all_reduce(a, b, bias=torch.randn(4)),
        "bias dtype": lambda: xccl.mm_reduce_scatter(a, b, bias=torch.randn(3).double()),
        "not a tensor": lambda: xccl.mm_all_reduce(a.tolist(), b),
        "chunks 0": lambda: xccl.mm_all_reduce(a, b, chunks=0),
        "reduce_op bxor": lambda: xccl.mm_reduce_scatter(a, b, reduce_op="bxor"),
        "max with grad": lambda: xccl.mm_reduce_scatter(a.requires_grad_(), b, reduce_op="max"),
        "gather_output not bool": lambda: xccl.all_gather_mm(a, b, gather_output=1),
    }
    calls[case]()
    _ = rank


BAD = (
    "k mismatch", "m not divisible", "int dtype", "dtype mismatch", "a 1-D", "a 3-D", "a 4-D", "b 3-D", "bias shape",
    "bias dtype", "not a tensor", "chunks 0", "reduce_op bxor", "max with grad", "gather_output not bool",
)


def body_alive() -> float:
    t = torch.ones(2)
    xccl.all_reduce(t)
    return float(t[0])


@pytest.mark.parametrize("case", BAD)
def test_bad_arguments_are_typed_and_identical_on_every_rank(rank_pools: Any, case: str) -> None:
    pool = rank_pools.get(2)
    outs = pool.run(_bad_call, case)
    assert all(o.raised("InvalidArgument") for o in outs), [str(o) for o in outs]
    assert len({o.message for o in outs}) == 1
    assert outs[0].attrs["op"] in OPS
    assert pool.run_ok(body_alive) == [2.0, 2.0]  # nothing half-started: the group still works


_GROUPS: dict[tuple[str, str], Any] = {}


def _group(runtime: str, fallback: str) -> Any:
    """A group over the world with its own dispatch context: the cpu runtime or the test vendor's, and the given
    fallback policy (xccl's group registry is the test seam; the process group itself is real)."""
    key = (runtime, fallback)
    if key not in _GROUPS:
        group = dist.new_group(list(range(dist.get_world_size())))
        rt = state_of(None).runtime if runtime == "cpu" else FusedVendorRuntime(FusedVendor(), simulate=False)
        register(group, rt, fallback)
        _GROUPS[key] = group
    return _GROUPS[key]


def body_fallback_error() -> str:
    try:
        xccl.mm_all_reduce(torch.randn(4, 3), torch.randn(3, 2), _group("cpu", "error"))
    except xccl.UnsupportedCollective as exc:
        return str(exc)
    return "ran"


def test_fallback_error_refuses_the_portable_version(rank_pools: Any) -> None:
    outs = rank_pools.get(2).run_ok(body_fallback_error)
    assert outs[0] == outs[1] and "pipelined" in outs[0] and "fallback" in outs[0]


# --------------------------------------------------------------------------- native kernels and constraints

#: Calls of the test vendor's kernels on this rank: (op, outcome).
CALLS: list[tuple[str, str]] = []


def _kmin(op: str, b: torch.Tensor) -> None:
    if b.shape[0] < 8:
        raise xccl.ConstraintViolation(op, "fusedvendor", "k >= 8", f"k={b.shape[0]}")


def _native_mm_rs(ctx: Any, a: torch.Tensor, b: torch.Tensor, reduce_op: str, bias: Any) -> torch.Tensor:
    """A vendor-style kernel: check the constraint first, then compute (here unfused, through xccl)."""
    try:
        _kmin("mm_reduce_scatter", b)
    except xccl.ConstraintViolation:
        CALLS.append(("mm_reduce_scatter", "refused"))
        raise
    CALLS.append(("mm_reduce_scatter", "native"))
    y = a @ b if bias is None else torch.addmm(bias, a, b)
    out = y.new_empty((a.shape[0] // ctx.size, b.shape[1]))
    xccl.reduce_scatter_tensor(out, y, group=ctx.group)
    return out


def _native_ag_mm(ctx: Any, a: torch.Tensor, b: torch.Tensor, gather_output: bool) -> Any:
    try:
        _kmin("all_gather_mm", b)
    except xccl.ConstraintViolation:
        CALLS.append(("all_gather_mm", "refused"))
        raise
    CALLS.append(("all_gather_mm", "native"))
    g = a.new_empty((a.shape[0] * ctx.size, a.shape[1]))
    xccl.all_gather_into_tensor(g, a.contiguous(), group=ctx.group)
    return g @ b, g


def _native_mm_ar(ctx: Any, a: torch.Tensor, b: torch.Tensor, bias: Any) -> torch.Tensor:
    try:
        _kmin("mm_all_reduce", b)
    except xccl.ConstraintViolation:
        CALLS.append(("mm_all_reduce", "refused"))
        raise
    CALLS.append(("mm_all_reduce", "native"))
    y = torch.matmul(a, b) if bias is None else torch.matmul(a, b) + bias
    xccl.all_reduce(y, group=ctx.group)
    return y


_native_mm_rs.check = lambda a, b, world_size, **_: _kmin("mm_reduce_scatter", b)  # type: ignore[attr-defined]


class FusedVendorRuntime(Runtime):
    """A runtime with native fused kernels that refuse k < 8 (as the Ascend MC2 kernels refuse k < 256)."""

    def kernels(self) -> dict[Collective, Any]:
        return {C.MM_REDUCE_SCATTER: _native_mm_rs, C.ALL_GATHER_MM: _native_ag_mm, C.MM_ALL_REDUCE: _native_mm_ar}


class FusedVendor(Plugin):
    name = "fusedvendor"
    vendor = "test"
    accelerator = False

    def capabilities(self) -> Any:
        from xccl.backends.cpu import plugin as cpu

        eager = {op: sup for (op, mode), sup in cpu.capabilities().items() if mode.value == "eager"}
        eager.update({op: Support(Level.NATIVE, note="test kernel") for op in (C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE)})
        return table_from("fusedvendor", eager)

    def runtime(self, *, simulate: bool) -> Runtime:
        return FusedVendorRuntime(self, simulate=simulate)


def body_native(fallback: str) -> dict[str, Any]:
    rank, w = dist.get_rank(), dist.get_world_size()
    group = _group("vendor", fallback)
    report: dict[str, Any] = {"bad": []}
    for k in (8, 4):  # k=4 violates the vendor's constraint
        a = [operand(r, (2 * w, k), torch.float32, k) for r in range(w)]
        b = [operand(r, (k, 3), torch.float32, k + 1) for r in range(w)]
        CALLS.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = xccl.mm_reduce_scatter(a[rank], b[rank], group)
                ok = torch.allclose(out, sum(x @ y for x, y in zip(a, b, strict=False)).chunk(w)[rank], atol=1e-5)
                (o2, g2) = xccl.all_gather_mm(a[rank], b[rank], group)
                ok &= torch.allclose(o2, torch.cat(a) @ b[rank], atol=1e-5) and torch.equal(g2, torch.cat(a))
                o3 = xccl.mm_all_reduce(a[rank], b[rank], group)
                ok &= torch.allclose(o3, sum(x @ y for x, y in zip(a, b, strict=False)), atol=1e-5)
                report[f"k={k}"] = "ok" if ok else "wrong"
            except xccl.ConstraintViolation as exc:
                report[f"k={k}"] = f"ConstraintViolation {exc.constraint}"
        report[f"k={k} calls"] = list(CALLS)
        report[f"k={k} warnings"] = sorted(
            {f"{type(x.message).__name__}: {'k >= 8' in str(x.message)}" for x in caught}
        )
    # The backward of a natively dispatched op calls the other op's native kernel (with b transposed: n >= 8 too).
    a = operand(rank, (2 * w, 8), torch.float32, 9).requires_grad_()
    b = operand(rank, (8, 8), torch.float32, 10).requires_grad_()
    CALLS.clear()
    xccl.mm_reduce_scatter(a, b, group).sum().backward()
    report["backward calls"] = list(CALLS)
    return report


def test_native_kernel_used_and_constraint_violation_warns_and_falls_back(rank_pools: Any) -> None:
    # One body: the fallback warning is issued once per process, op and constraint.
    outs = rank_pools.get(2).run_ok(body_native, "warn")
    assert outs[0] == outs[1]
    r = outs[0]
    assert r["k=8"] == "ok"
    assert r["k=8 calls"] == [("mm_reduce_scatter", "native"), ("all_gather_mm", "native"), ("mm_all_reduce", "native")]
    assert r["k=8 warnings"] == []
    assert r["backward calls"] == [("mm_reduce_scatter", "native"), ("all_gather_mm", "native")]
    assert r["k=4"] == "ok"  # the portable version computed it
    assert r["k=4 calls"] == [("mm_reduce_scatter", "refused"), ("all_gather_mm", "refused"), ("mm_all_reduce", "refused")]
    assert r["k=4 warnings"] == ["ConstraintFallbackWarning: True"]


def test_constraint_violation_under_emulate_is_silent(rank_pools: Any) -> None:
    r = rank_pools.get(2).run_ok(body_native, "emulate")[0]
    assert r["k=4"] == "ok" and r["k=4 warnings"] == []


def test_constraint_violation_under_error_raises_on_every_rank(rank_pools: Any) -> None:
    outs = rank_pools.get(2).run_ok(body_native, "error")
    assert outs[0] == outs[1]
    assert outs[0]["k=4"] == "ConstraintViolation k >= 8"
    assert outs[0]["k=4 calls"] == [("mm_reduce_scatter", "refused")]
    assert outs[0]["k=8"] == "ok"


# ----------------------------------------------------------------- a backend whose async work is done at once


def body_sophgo() -> list[str]:
    assert state_of(None).table.backend == "sophgo"
    return body_values((torch.float32,)) + body_gradients(3, unfused=False)


@pytest.mark.skipif(importlib.util.find_spec("xccl_sophgo") is None, reason="xccl-sophgo is not installed")
def test_simulated_sophgo_emulated_reduce_scatter(rank_pools: Any) -> None:
    """SCCL has no reduce_scatter (emulated over all_to_all, complete when it returns): still correct."""
    pool = rank_pools.get(2, vendor="sophgo", simulate=True, fallback="emulate")
    assert pool.run_ok(body_sophgo, timeout=180) == [[], []]


def body_ascend() -> dict[str, Any]:
    """Ascend's MC2 kernels (simulated): native where the documented constraints hold, portable elsewhere."""
    rank, w = dist.get_rank(), dist.get_world_size()
    report: dict[str, Any] = {}
    for dtype, k in ((torch.bfloat16, 256), (torch.float32, 256), (torch.bfloat16, 64)):
        a = [operand(r, (2 * w, k), dtype, k) for r in range(w)]
        b = [operand(r, (k, 16), dtype, k + 1) for r in range(w)]
        full = sum(x.float() @ y.float() for x, y in zip(a, b, strict=True))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = close(xccl.mm_reduce_scatter(a[rank], b[rank]), full.chunk(w)[rank], dtype, k)
            out, gathered = xccl.all_gather_mm(a[rank], b[rank])
            ok &= close(out, torch.cat(a).float() @ b[rank].float(), dtype, k) and torch.equal(gathered, torch.cat(a))
            ok &= close(xccl.mm_all_reduce(a[rank], b[rank]), full, dtype, k)
        fallbacks = sorted(
            str(x.message).split(" kernel")[0].rsplit(" ", 1)[-1]
            for x in caught if type(x.message).__name__ == "ConstraintFallbackWarning"
        )
        report[f"{dtype} k={k}"] = (ok, fallbacks)
    return report


@pytest.mark.skipif(importlib.util.find_spec("xccl_ascend") is None, reason="xccl-ascend is not installed")
def test_simulated_ascend_native_kernels_and_constraint_fallback(rank_pools: Any) -> None:
    outs = rank_pools.get(2, vendor="ascend", simulate=True).run_ok(body_ascend, timeout=180)
    assert outs[0] == outs[1]
    r = outs[0]
    assert r["torch.bfloat16 k=256"] == (True, [])  # every constraint holds: the MC2 kernels ran
    assert r["torch.float32 k=256"] == (True, ["all_gather_mm", "mm_all_reduce", "mm_reduce_scatter"])  # dtype
    assert r["torch.bfloat16 k=64"] == (True, ["all_gather_mm", "mm_reduce_scatter"])  # k < 256
