"""Ascend graph mode as TorchAir compiles it, in simulation, over real 2-rank process groups.

Every compiled graph below goes through the simulated TorchAir (``xccl_ascend._torchair_sim``): traced as TorchAir
traces, xccl's graph ops lowered to the vendor ops TorchAir converts, every node checked against TorchAir's
vocabulary (``torchair_vocabulary.json``), then run on CPU and compared with eager mode. The check is shown to
reject what TorchAir cannot convert, and the same graphs compile without it (so the rejection is the check's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from xccl_ascend import _torchair_derive
from xccl_ascend._capabilities import GRAPH_REDUCE_OPS, GRAPH_SOURCES, TORCHAIR_COMMIT, ascend_table
from xccl_ascend._runtime import MC2_DOMAIN
from xccl_ascend._torchair import normalize_reduce_op, target_name, vocabulary
from xccl_ascend._torchair_lower import LOWERED, lowering
from xccl_ascend._torchair_sim import NS, simulated_torchair

import xccl
from xccl.collectives._state import PROCESS
from xccl.plugin import Collective as C
from xccl.plugin import Level, Mode

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

EMULATE = {"vendor": "ascend", "simulate": True, "fallback": "emulate"}
STRICT = {"vendor": "ascend", "simulate": True, "fallback": "error"}
TIMEOUT = 400.0


# ----------------------------------------------------------------------------------------------------- helpers


def _compile(fn: Callable[..., Any], *, check: bool = True) -> tuple[Callable[..., Any], list[tuple[str, set[str]]]]:
    """``xccl.compile(fn)`` through the simulated TorchAir the runtime builds, recording each checked graph's
    targets by TorchAir's names."""
    rt = PROCESS.runtime
    ops = rt.sdk.graph_ops()
    graphs: list[tuple[str, set[str]]] = []

    def observe(phase: str, gm: torch.fx.GraphModule) -> None:
        names = {target_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        graphs.append((phase, {ops.names.get(n, n) for n in names}))

    torch._dynamo.reset()
    backend = simulated_torchair(lowering(rt, ops, MC2_DOMAIN), ops.names, check=check, observe=observe)
    return xccl.compile(fn, fullgraph=True, inner=backend), graphs


def _xccl_left(graphs: list[tuple[str, set[str]]]) -> list[str]:
    return sorted(t for _, targets in graphs for t in targets if t.startswith(("xccl.", f"{NS}.")))


def _error(fn: Callable[[], Any]) -> str:
    """The error ``fn`` raises (through Dynamo's wrapper), as ``TypeName: message``; "" when it does not raise."""
    try:
        fn()
    except Exception as exc:  # Dynamo wraps backend errors: report the innermost
        inner = exc
        while getattr(inner, "inner_exception", None) is not None or inner.__cause__ is not None:
            inner = getattr(inner, "inner_exception", None) or inner.__cause__  # type: ignore[assignment]
        return f"{type(inner).__name__}: {inner}"
    return ""


# ------------------------------------------------------------------------------------------ TP MLP training step


def _tp_losses(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, target: torch.Tensor, n: int, r: int
               ) -> torch.Tensor:
    """Megatron MLP (column- then row-parallel, all_reduce) and its sequence-parallel form (all_gather, then
    reduce_scatter), as in tests/test_graph_train.py."""
    f = xccl.functional
    y = f.all_reduce(torch.relu(x @ w1) @ w2)
    tp = ((y - target) ** 2).mean() / n
    b = x.shape[0] // n
    ys = f.reduce_scatter_tensor(torch.relu(f.all_gather_into_tensor(x[r * b : (r + 1) * b]) @ w1) @ w2)
    sp = ((ys - target[r * b : (r + 1) * b]) ** 2).sum() / target.numel()
    return torch.stack([tp, sp])


def body_tp_step(dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    gen = torch.Generator().manual_seed(0)
    d, hdim, batch = 8, 4 * n, 2 * n
    W1, W2 = torch.randn(d, hdim, generator=gen).to(dtype), torch.randn(hdim, d, generator=gen).to(dtype)
    x, target = torch.randn(batch, d, generator=gen).to(dtype), torch.randn(batch, d, generator=gen).to(dtype)
    cols = slice(r * hdim // n, (r + 1) * hdim // n)

    def step(fn: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        w1, w2 = W1[:, cols].clone().requires_grad_(), W2[cols, :].clone().requires_grad_()
        losses = fn(w1, w2, x, target, n, r)
        losses.sum().backward()
        return losses.detach(), [w1.grad, w2.grad]

    eager_loss, eager_grads = step(_tp_losses)
    observed, graphs = _compile(_tp_losses)
    loss, grads = step(observed)
    torch._dynamo.reset()
    default_loss, _ = step(xccl.compile(_tp_losses, fullgraph=True))  # the runtime's own backend, unobserved
    # bfloat16: the graph reduces in float32 (GE's HcomAllReduce has no bfloat16), eager in bfloat16.
    tol = {"rtol": 3e-2, "atol": 3e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
    close = lambda a, b: bool(torch.allclose(a.float(), b.float(), **tol))  # noqa: E731
    return {
        "matches_eager": close(loss, eager_loss) and all(map(close, grads, eager_grads)),
        "default_matches": close(default_loss, eager_loss),
        "phases": sorted(p for p, _ in graphs),
        "collectives": sorted({t for _, ts in graphs for t in ts if t.startswith("_c10d_functional")}),
        "xccl_left": _xccl_left(graphs),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_tp_mlp_step_compiles_through_the_torchair_check(rank_pools: Any, dtype: torch.dtype) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_tp_step, dtype, timeout=TIMEOUT):
        assert out["matches_eager"] and out["default_matches"], out
        assert out["phases"] == ["backward", "forward"]
        assert out["collectives"] == [
            "_c10d_functional.all_gather_into_tensor.default", "_c10d_functional.all_reduce.default",
            "_c10d_functional.reduce_scatter_tensor.default", "_c10d_functional.wait_tensor.default",
        ]
        assert out["xccl_left"] == []  # the order joins became copies


# -------------------------------------------------------------------------------------------- send/recv ring


def _ring(x: torch.Tensor) -> torch.Tensor:
    """Two rounds around the ring (even ranks send first), then an all_reduce joined to the order chain."""
    w = xccl.get_world()
    r, n = w.rank, w.world_size
    a = torch.empty_like(x)
    for step in range(2):
        if r % 2 == 0:
            xccl.send(x * (step + 2), (r + 1) % n)
            xccl.recv(a, (r - 1) % n)
        else:
            xccl.recv(a, (r - 1) % n)
            xccl.send(x * (step + 2), (r + 1) % n)
        x = x + a
    xccl.all_reduce(x)
    return x


def body_ring() -> dict[str, Any]:
    x = torch.arange(4.0) + 10 * dist.get_rank()
    compiled, graphs = _compile(_ring)
    got = compiled(x)
    targets = [t for _, ts in graphs for t in ts]
    return {"equal": torch.equal(got, _ring(x)), "targets": sorted(t for t in targets if t.startswith("npu_define")),
            "xccl_left": _xccl_left(graphs)}


def test_send_recv_ring_lowers_to_torchair_send_recv(rank_pools: Any) -> None:
    # Graph send/recv need CANN 8.6.0; torch 2.8's torch_npu pairs with 8.3.RC1 (below it they are refused:
    # test_ascend_graph_runtime.py).
    cann = {"XCCL_SIM_CANN_VERSION": "9.0.0"}
    for out in rank_pools.get(2, env=cann, **EMULATE).run_ok(body_ring, timeout=TIMEOUT):
        assert out["equal"]
        assert out["targets"] == ["npu_define._recv.default", "npu_define._send.default"]
        assert out["xccl_left"] == []


# ----------------------------------------------------------------------------------------------------- uneven


def _uneven(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gathered = torch.empty(3, 4)
    xccl.all_gather_into_tensor_uneven(gathered, x, [1, 2])
    mine = torch.empty(dist.get_rank() + 1, 4)
    xccl.reduce_scatter_tensor_uneven(mine, y, [1, 2])
    avg = torch.empty_like(mine)
    xccl.reduce_scatter_tensor_uneven(avg, y, [1, 2], op=dist.ReduceOp.AVG)
    return gathered, mine, avg


def body_uneven() -> dict[str, Any]:
    r = dist.get_rank()
    x = torch.full((r + 1, 4), float(r + 1))
    y = torch.arange(12.0).view(3, 4) * (r + 1)
    compiled, graphs = _compile(_uneven)
    got, want = compiled(x, y), _uneven(x, y)
    return {"equal": all(torch.equal(a, b) for a, b in zip(got, want, strict=True)),
            "targets": sorted({t for _, ts in graphs for t in ts if t.startswith("npu_define")}),
            "xccl_left": _xccl_left(graphs)}


def test_uneven_collectives_lower_to_torchair_uneven_ops(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_uneven, timeout=TIMEOUT):
        assert out["equal"]
        assert out["targets"] == ["npu_define.allgather_in_tensor_uneven.default",
                                  "npu_define.reduce_scatter_tensor_uneven.default"]
        assert out["xccl_left"] == []


# ------------------------------------------------------------------------------------------------------ fused

#: The MC2 operators each fused op's forward + backward graphs hold (mm_reduce_scatter's backward is an
#: all_gather_mm; all_gather_mm's reduce-scatters its gradient unfused, mm_all_reduce's has no collective).
_MC2 = {
    "mm_reduce_scatter": ["npu.npu_all_gather_base_mm.default", "npu.npu_mm_reduce_scatter_base.default"],
    "all_gather_mm": ["npu.npu_all_gather_base_mm.default"],
    "mm_all_reduce": ["npu.npu_mm_all_reduce_base.default"],
}


def _fused(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = getattr(xccl, name)(a, b)
    return out[0] if isinstance(out, tuple) else out


def body_fused(name: str, dtype: torch.dtype) -> dict[str, Any]:
    """Forward and backward of one fused op: compiled through the check against eager."""
    xccl_ascend = __import__("xccl_ascend")
    xccl_ascend.reset_mc2_domain()
    gen = torch.Generator().manual_seed(dist.get_rank())
    # k = n = 256: the MC2 kernels take the forward and the fused calls of its backward (k >= 256 there too).
    a0, b0 = torch.randn(4, 256, generator=gen).to(dtype), torch.randn(256, 256, generator=gen).to(dtype)

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        out = fn(name, a, b)
        out.float().sum().backward()
        return out.detach().float(), a.grad.float(), b.grad.float()

    want = run(_fused)
    compiled, graphs = _compile(_fused)
    got = run(compiled)
    xccl_ascend.reset_mc2_domain()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    scale = max(float(w.abs().max()) for w in want)
    return {"close": all(float((g - w).abs().max()) <= tol * scale for g, w in zip(got, want, strict=True)),
            "mc2": sorted({t for _, ts in graphs for t in ts if t.startswith("npu.")}),
            "unfused": sorted({t for _, ts in graphs for t in ts if t.startswith("_c10d_functional")}),
            "xccl_left": _xccl_left(graphs)}


@pytest.mark.parametrize("name", sorted(_MC2))
def test_each_fused_op_lowers_to_its_mc2_operator(rank_pools: Any, name: str) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_fused, name, torch.bfloat16, timeout=TIMEOUT):
        assert out["close"], out
        assert out["mc2"] == _MC2[name], out
        assert out["xccl_left"] == []


def test_fused_op_outside_mc2_constraints_gets_the_unfused_graph(rank_pools: Any) -> None:
    """float32 is no MC2 dtype: under fallback="emulate" the graph holds matmul + collective instead."""
    for out in rank_pools.get(2, **EMULATE).run_ok(body_fused, "mm_reduce_scatter", torch.float32, timeout=TIMEOUT):
        assert out["close"] and out["mc2"] == [] and out["xccl_left"] == [], out
        assert "_c10d_functional.reduce_scatter_tensor.default" in out["unfused"]


def body_fused_strict() -> str:
    a, b = torch.randn(4, 256), torch.randn(256, 16)
    compiled, _ = _compile(_fused)
    return _error(lambda: compiled("mm_reduce_scatter", a, b))


def test_fused_constraint_violation_raises_at_compile_time_under_error_policy(rank_pools: Any) -> None:
    for err in rank_pools.get(2, **STRICT).run_ok(body_fused_strict, timeout=TIMEOUT):
        assert err.startswith("ConstraintViolation") and "float16 or bfloat16" in err.replace("bf16", "bfloat16"), err


# ------------------------------------------------------------------- unsupported entries, and what TorchAir rejects


def _barrier(x: torch.Tensor) -> torch.Tensor:
    xccl.barrier()
    return x + 1


def _premul(x: torch.Tensor) -> torch.Tensor:
    xccl.all_reduce(x, op=PREMUL)
    return x


PREMUL = dist._make_nccl_premul_sum(2.0)  # made outside the graph: Dynamo cannot trace the constructor


def _avg(x: torch.Tensor) -> torch.Tensor:
    xccl.all_reduce(x, op=dist.ReduceOp.AVG)
    return x * 1


def body_unsupported() -> dict[str, str]:
    x = torch.ones(4)
    out = {}
    for name, fn in (("barrier", _barrier), ("premul_sum", _premul)):
        compiled, _ = _compile(fn)
        out[name] = _error(lambda c=compiled: c(x.clone()))  # type: ignore[misc]
    return out


def test_unsupported_graph_entries_fail_at_compile_time_with_the_reason(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_unsupported, timeout=TIMEOUT):
        assert out["barrier"].startswith("UnsupportedCollective"), out
        assert "TorchAir has no graph op for it" in out["barrier"]
        assert "premul_sum" in out["premul_sum"] and "has: max, min, product, sum" in out["premul_sum"], out


def body_avg() -> dict[str, Any]:
    x = torch.arange(4.0) * (dist.get_rank() + 1)
    compiled, graphs = _compile(_avg)
    return {"equal": torch.equal(compiled(x.clone()), _avg(x.clone())), "xccl_left": _xccl_left(graphs)}


def test_avg_compiles_as_sum_then_divide(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_avg, timeout=TIMEOUT):
        assert out == {"equal": True, "xccl_left": []}


def _lgamma(x: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(x) + 1


def _histc(x: torch.Tensor) -> torch.Tensor:
    return torch.histc(x, bins=4) + 1


def _raw_barrier(x: torch.Tensor) -> torch.Tensor:
    # xccl's graph op called directly, past the graph form's table lookup: nothing lowers it.
    xccl.functional  # noqa: B018 - loads the graph forms, which register torch.ops.xccl.*
    torch.ops.xccl.barrier(dist.group.WORLD.group_name, torch.zeros(1, dtype=torch.int32))
    return x + 1


def _raw_avg(x: torch.Tensor) -> torch.Tensor:
    # A standard collective with a reduce op GE lacks, reaching TorchAir unconverted.
    y = torch.ops._c10d_functional.all_reduce(x, "avg", dist.group.WORLD.group_name)
    return torch.ops._c10d_functional.wait_tensor(y)


def body_rejections() -> dict[str, tuple[str, str]]:
    """Each program: the error with the check, and the error without it ("" = compiled and ran)."""
    x = torch.rand(4) + 1
    out = {}
    for name, fn in (("lgamma", _lgamma), ("histc", _histc), ("raw_barrier", _raw_barrier)):
        checked, _ = _compile(fn)
        with_check = _error(lambda c=checked: c(x))  # type: ignore[misc]
        unchecked, _ = _compile(fn, check=False)
        out[name] = (with_check, _error(lambda c=unchecked: c(x)))  # type: ignore[misc]
    torch._dynamo.reset()  # xccl.compile as users call it: the runtime's own backend runs the check too
    out["default"] = (_error(lambda: xccl.compile(_lgamma, fullgraph=True)(x)), "")
    # Straight to the simulated TorchAir, without xccl's graph converters (which would rewrite avg).
    rt = PROCESS.runtime
    ops = rt.sdk.graph_ops()
    for check in (True, False):
        torch._dynamo.reset()
        backend = simulated_torchair(lowering(rt, ops, MC2_DOMAIN), ops.names, check=check)
        out.setdefault("raw_avg", ("", ""))
        err = _error(lambda b=backend: torch.compile(_raw_avg, backend=b, fullgraph=True)(x))  # type: ignore[misc]
        out["raw_avg"] = (err, out["raw_avg"][1]) if check else (out["raw_avg"][0], err)
    return out


def test_check_rejects_graphs_torchair_cannot_convert(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_rejections, timeout=TIMEOUT):
        for name, (with_check, without) in out.items():
            assert without == "", f"{name} should compile and run without the check: {without}"  # (default: n/a)
            assert with_check.startswith("UnsupportedCollective") and "simulated TorchAir conversion check" in with_check
        assert "torch.ops.aten.lgamma.default ge_converter is not implemented!" in out["lgamma"][0]
        assert "torch.ops.aten.lgamma.default ge_converter is not implemented!" in out["default"][0]
        assert ("Failed to auto-generated converter for aten.histc.default to AscendIR: PyTorch built-in ops not "
                "support auto-generate converters") in out["histc"][0]
        assert "No AscendIR Barrier was found to be registered" in out["raw_barrier"][0]
        assert "ge unsupported reduce type AVG" in out["raw_avg"][0]
        assert "node 'histc" in out["histc"][0]  # the node is named


# --------------------------------------------------------------------------------- the vocabulary and the column


def test_vocabulary_is_pinned_and_packaged() -> None:
    v = vocabulary()
    assert v.commit == TORCHAIR_COMMIT and v.source["repository"] == "https://github.com/Ascend/torchair"
    assert v.counts == {"registrations": 2112, "converters": 512, "partial": 33, "not_implemented": 1269,
                        "stubs": 330}
    assert len(v.converters) == v.counts["converters"] and len(v.not_implemented) == v.counts["not_implemented"]
    assert resources.files("xccl_ascend").joinpath("torchair_vocabulary.json").is_file()
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert "torchair_vocabulary.json" in pyproject  # shipped as package data
    for name in ("_c10d_functional.all_reduce.default", "npu_define._send.default", "aten.clone.default"):
        assert v.has_converter(name), name
    assert "aten.lgamma.default" in v.not_implemented and "aten.histc.default" not in v.converters


def test_lowering_targets_and_cited_converters_are_in_the_vocabulary() -> None:
    v = vocabulary()
    sim = __import__("xccl_ascend._torchair_sim", fromlist=["_OPS"])._OPS
    for real, _ in sim.values():
        assert v.has_converter(real), real
    for op, sources in GRAPH_SOURCES.items():
        assert sources, op
        for source in sources:
            if source.startswith("Ascend/torchair@"):
                assert source.startswith(f"Ascend/torchair@{TORCHAIR_COMMIT[:12]} "), source
    cited = {path_line for sources in GRAPH_SOURCES.values() for s in sources
             for path_line in [s.split(" ", 1)[1].split(" ")[0]] if s.startswith("Ascend/torchair@")}
    recorded = set(v.converters.values()) | {a["at"] for a in v.anchors.values()}
    for path_line in cited:
        if path_line.endswith(".py") or "-" in path_line.rsplit(":", 1)[-1]:
            continue  # a file or a line range, not one registration
        assert path_line in recorded or path_line.endswith(":73"), path_line  # :73 is the version gate
    # The lowering handles exactly what the runtime says its graph compiler takes (Runtime.graph_ops).
    lowered = {str(op).split(".")[1] for op in lowering(None, None, MC2_DOMAIN)}  # type: ignore[arg-type]
    assert lowered == LOWERED and {"send", "recv", "mm_reduce_scatter"} <= LOWERED
    assert not {"order", "isend", "irecv", "wait"} & LOWERED


def test_graph_column_has_ge_reduce_ops() -> None:
    table = ascend_table()
    for op in C:
        entry = table.entry(op, Mode.GRAPH)
        if entry.level is Level.UNSUPPORTED:
            assert "[" in entry.note, op  # the reason carries its source
            continue
        assert op in GRAPH_SOURCES and entry.note.startswith("graph: "), op
        if entry.reduce_ops is not None:
            assert entry.reduce_ops == GRAPH_REDUCE_OPS, op
    ar = lambda **kw: table.resolve(C.ALL_REDUCE, mode=Mode.GRAPH, **kw)  # noqa: E731
    assert ar(dtype=torch.float32, reduce_op="avg").avg_via_sum
    assert ar(dtype=torch.float32, reduce_op="premul_sum").level is Level.UNSUPPORTED
    # As eager mode casts it (the graph form casts in the graph: GE's HcomAllReduce has no DT_BOOL).
    assert ar(dtype=torch.bool, reduce_op="sum").cast == torch.int32
    assert table.entry(C.ALL_REDUCE, Mode.EAGER).reduce_ops_for(torch.float32) != GRAPH_REDUCE_OPS


def test_normalize_reduce_op_is_torchairs() -> None:
    assert [normalize_reduce_op(op) for op in ("sum", "min", "max", "product")] == ["sum", "min", "max", "prod"]
    with pytest.raises(ValueError, match="ge unsupported reduce type AVG"):
        normalize_reduce_op("avg")
    with pytest.raises(ValueError, match="ge unsupported reduce type PREMUL_SUM"):
        normalize_reduce_op("premul_sum")
    with pytest.raises(ValueError, match="Invalid reduce operation PROD"):
        normalize_reduce_op("prod")


@pytest.mark.skipif(not os.environ.get("XCCL_TORCHAIR_CHECKOUT"),
                    reason="set XCCL_TORCHAIR_CHECKOUT to a checkout of Ascend/torchair at the pinned commit")
def test_vocabulary_derives_from_torchairs_source(tmp_path: Path) -> None:
    out = tmp_path / "vocab.json"
    with out.open("w", encoding="utf-8") as f:
        _torchair_derive.main([os.environ["XCCL_TORCHAIR_CHECKOUT"], "--commit", TORCHAIR_COMMIT,
                               "--date", vocabulary().source["commit_date"]], out=f)
    shipped = json.loads(resources.files("xccl_ascend").joinpath("torchair_vocabulary.json").read_text("utf-8"))
    assert json.loads(out.read_text(encoding="utf-8")) == shipped
