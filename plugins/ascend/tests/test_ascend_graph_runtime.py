"""Ascend graph mode where TorchAir's conversion is not the whole story: GE's dtype lists, the CANN floor of graph
send/recv, isend/irecv, and TorchAir's own backend as the Ascend tutorials call it.

Each test runs over a real 2-rank process group on the simulated TorchAir (``xccl_ascend._torchair_sim``), which
fails the way the hardware would (the sources are in the simulation's docstrings and docs/fidelity.md):

* GE refuses an HCCL operator whose dtype its IR prototype does not list (TorchAir's bundled
  ``auto_generated_ge_raw_ops.py``: no DT_BF16 / DT_INT64 for HcomAllReduce, no DT_BOOL / DT_BF16 for
  HcomAllGather, ...);
* graph send/recv need CANN 8.6.0 (``npu_fx_compiler.py`` ``_process_send_recv``);
* TorchAir has no isend/irecv, and converts none of xccl's own ops;
* ``torchair.get_npu_backend()`` has none of xccl's lowering and no avg (``normalize_reduceop_type``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from xccl_ascend import sim_npu_backend
from xccl_ascend._capabilities import ascend_table
from xccl_ascend._torchair import target_name, vocabulary
from xccl_ascend._torchair_sim import sim_cann_version, simulated_torchair

import xccl
from xccl.plugin import Collective as C
from xccl.plugin import Level, Mode

EMULATE = {"vendor": "ascend", "simulate": True, "fallback": "emulate"}
TIMEOUT = 400.0
CANN_ENV = "XCCL_SIM_CANN_VERSION"


# ----------------------------------------------------------------------------------------------------- helpers


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """(the exception type raised, the innermost error as ``Type: message``); ("", "") when ``fn`` returns.

    A trace-time error from xccl's graph forms reaches the caller as itself; an error from the backend (TorchAir's
    check) arrives wrapped in Dynamo's BackendCompilerFailed.
    """
    try:
        fn()
    except Exception as exc:
        inner: BaseException = exc
        while getattr(inner, "inner_exception", None) is not None or inner.__cause__ is not None:
            inner = getattr(inner, "inner_exception", None) or inner.__cause__  # type: ignore[assignment]
        return type(exc).__name__, f"{type(inner).__name__}: {inner}"
    return "", ""


def _xccl_compile(fn: Callable[..., Any], graphs: list[set[str]] | None = None) -> Callable[..., Any]:
    """``xccl.compile(fn)`` on the runtime's simulated TorchAir, recording each checked graph's targets."""
    torch._dynamo.reset()
    if graphs is None:
        return xccl.compile(fn, fullgraph=True)  # type: ignore[no-any-return]
    rt = xccl.collectives._state.PROCESS.runtime  # type: ignore[attr-defined]
    ops = rt.sdk.graph_ops()
    from xccl_ascend._runtime import MC2_DOMAIN
    from xccl_ascend._torchair_lower import lowering

    from xccl.graph import _ops  # noqa: F401 - the lowering names every torch.ops.xccl.*, which xccl defines lazily

    def observe(phase: str, gm: torch.fx.GraphModule) -> None:
        graphs.append({ops.names.get(n, n) for n in (target_name(x.target) for x in gm.graph.nodes
                                                     if x.op == "call_function")})

    backend = simulated_torchair(lowering(rt, ops, MC2_DOMAIN), ops.names, observe=observe, cann=sim_cann_version())
    return xccl.compile(fn, fullgraph=True, inner=backend)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------- (a) GE's dtype lists


def _raw_bf16_all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = torch.ops._c10d_functional.all_reduce(x, "sum", dist.group.WORLD.group_name)
    return torch.ops._c10d_functional.wait_tensor(y)


def _raw_bool_all_gather(x: torch.Tensor) -> torch.Tensor:
    y = torch.ops._c10d_functional.all_gather_into_tensor(x, 2, dist.group.WORLD.group_name)
    return torch.ops._c10d_functional.wait_tensor(y)


def body_ge_refuses_ir_dtypes() -> dict[str, tuple[str, str]]:
    """The simulated GE check on its own: standard collectives of dtypes the IR prototypes lack, straight to the
    simulated TorchAir (no xccl graph form in between), with the check and without it."""
    out = {}
    for name, fn, x in (("bf16_all_reduce", _raw_bf16_all_reduce, torch.ones(4, dtype=torch.bfloat16)),
                        ("bool_all_gather", _raw_bool_all_gather, torch.ones(4, dtype=torch.bool))):
        for check in (True, False):
            torch._dynamo.reset()
            backend = simulated_torchair({}, {}, check=check)
            err = _outcome(lambda b=backend, f=fn, t=x: torch.compile(f, backend=b, fullgraph=True)(t))[1]
            out[f"{name}:{check}"] = err  # type: ignore[assignment]
    return out  # type: ignore[return-value]


def test_simulated_ge_refuses_dtypes_the_ir_prototypes_lack(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_ge_refuses_ir_dtypes, timeout=TIMEOUT):
        assert out["bf16_all_reduce:False"] == "" and out["bool_all_gather:False"] == "", out
        bf16, boolean = out["bf16_all_reduce:True"], out["bool_all_gather:True"]
        assert bf16.startswith("UnsupportedCollective") and "GE refuses HcomAllReduce" in bf16, bf16
        assert "lists no DT_BF16 for input x" in bf16 and "auto_generated_ge_raw_ops.py:24351" in bf16, bf16
        assert "GE refuses HcomAllGather" in boolean and "lists no DT_BOOL" in boolean, boolean


def _dtype_program(x: torch.Tensor, flags: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """bfloat16 sum and avg, a bool or (sum) and an and (product), a bool and a bfloat16 gather and broadcast."""
    s, a = x.clone(), x.clone()
    xccl.all_reduce(s)
    xccl.all_reduce(a, op=dist.ReduceOp.AVG)
    anyf, allf = flags.clone(), flags.clone()
    xccl.all_reduce(anyf)
    xccl.all_reduce(allf, op=dist.ReduceOp.PRODUCT)
    gathered = torch.empty(2 * flags.numel(), dtype=torch.bool)
    xccl.all_gather_into_tensor(gathered, flags)
    gb = torch.empty(2 * b.numel(), dtype=torch.bfloat16)
    xccl.all_gather_into_tensor(gb, b)
    root = b.clone()
    xccl.broadcast(root, src=1)
    return s, a, anyf, allf, gathered, gb, root


def _int64_sum(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    xccl.all_reduce(y)
    return y


def body_graph_dtypes() -> dict[str, Any]:
    r = dist.get_rank()
    # Exact in bfloat16, summed or averaged over two ranks; the gathered and broadcast values are bit patterns.
    x = torch.tensor([1.0, -2.5, 96.0, 0.0078125], dtype=torch.bfloat16) * (r + 1)
    flags = torch.tensor([True, False, r == 1, True])
    b = torch.randn(8, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16)
    graphs: list[set[str]] = []
    got = _xccl_compile(_dtype_program, graphs)(x, flags, b)
    want = _dtype_program(x, flags, b)
    int64 = _outcome(lambda: _xccl_compile(_int64_sum)(torch.arange(4)))
    return {
        "equal": [bool(torch.equal(g, w)) and g.dtype == w.dtype for g, w in zip(got, want, strict=True)],
        "collectives": sorted({t for ts in graphs for t in ts if t.startswith("_c10d_functional") and "wait" not in t}),
        "int64": int64,
    }


def test_bf16_and_bool_compile_through_casts_and_int64_is_refused_at_trace_time(rank_pools: Any) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_graph_dtypes, timeout=TIMEOUT):
        assert all(out["equal"]), out
        assert out["collectives"] == ["_c10d_functional.all_gather_into_tensor.default",
                                      "_c10d_functional.all_reduce.default", "_c10d_functional.broadcast.default"]
        outer, err = out["int64"]
        # Refused by the graph column while tracing (the typed error itself, not the backend's wrapped one).
        assert outer == "UnsupportedCollective" and "dtype int64 is not supported" in err and "(graph mode)" in err, out


def test_graph_dtypes_are_the_ir_prototypes() -> None:
    """The graph column takes each operator's IR dtype list, casts the eager dtypes it lacks where a cast is exact
    (moves: bool as uint8, floats as wider floats; reductions: bool/uint8 as int32, bfloat16 as float32), refuses
    the rest."""
    from xccl_ascend._capabilities import GRAPH_REDUCE_CASTS

    table, v = ascend_table(), vocabulary()
    ar, ag = table.entry(C.ALL_REDUCE, Mode.GRAPH), table.entry(C.ALL_GATHER_INTO_TENSOR, Mode.GRAPH)
    assert ar.dtypes == v.dtypes_of("HcomAllReduce", "input x") and ar.cast_to == GRAPH_REDUCE_CASTS
    assert ag.dtypes == v.dtypes_of("HcomAllGather", "input x")
    # Exact conversions (TorchAir converts .to, not a bit-cast view): bool as uint8, the floats as wider floats.
    assert ag.cast_to == {torch.bool: torch.uint8, torch.bfloat16: torch.float32, torch.float8_e4m3fn: torch.float16,
                          torch.float8_e5m2: torch.float16}
    assert table.entry(C.ALL_GATHER_INTO_TENSOR_UNEVEN, Mode.GRAPH).dtypes >= {torch.bfloat16}  # HcomAllGatherV has it
    res = lambda op, dt, ro=None: table.resolve(op, mode=Mode.GRAPH, dtype=dt, reduce_op=ro)  # noqa: E731
    assert res(C.ALL_REDUCE, torch.int64, "sum").level is Level.UNSUPPORTED
    assert res(C.REDUCE_SCATTER_TENSOR, torch.bfloat16, "product").cast == torch.float32
    assert res(C.BROADCAST, torch.bool).cast == torch.uint8
    for op in (C.ALL_REDUCE, C.REDUCE_SCATTER_TENSOR, C.ALL_GATHER, C.BROADCAST, C.ALL_TO_ALL_SINGLE, C.SEND, C.RECV):
        assert "IR prototype [Ascend/torchair@" in table.entry(op, Mode.GRAPH).note, op
    # HcomAllToAll (even splits, CANN >= 8.2.RC1) and HcomAllToAllV take the same dtypes: either may be chosen.
    assert v.dtypes_of("HcomAllToAll", "input x") == v.dtypes_of("HcomAllToAllV", "input send_data")


# ----------------------------------------------------------------------------- (b) CANN floor of graph p2p


def _pair(x: torch.Tensor) -> torch.Tensor:
    got = torch.empty_like(x)
    if dist.get_rank() == 0:
        xccl.send(x, 1)
        xccl.recv(got, 1)
    else:
        xccl.recv(got, 0)
        xccl.send(x, 0)
    return got


def body_cann_floor(cann: str) -> dict[str, Any]:
    old = os.environ.get(CANN_ENV)
    os.environ[CANN_ENV] = cann
    try:
        x = torch.arange(4.0) + dist.get_rank()
        outer, err = _outcome(lambda: _xccl_compile(_pair)(x))
        eager = _pair(x)  # the floor is the graph's: eager send/recv are HCCL's own
        return {"outer": outer, "err": err, "eager_ok": bool(torch.equal(eager, torch.arange(4.0) + 1 - dist.get_rank()))}
    finally:
        if old is None:
            os.environ.pop(CANN_ENV, None)
        else:
            os.environ[CANN_ENV] = old


def test_graph_send_recv_below_cann_8_6_is_refused_at_trace_time(rank_pools: Any) -> None:
    pool = rank_pools.get(2, **EMULATE)
    for out in pool.run_ok(body_cann_floor, "8.5.0", timeout=TIMEOUT):
        assert out["eager_ok"], out
        assert out["outer"] == "UnsupportedCollective", out
        assert "needs CANN >= 8.6.0, and CANN 8.5.0 is installed (graph mode)" in out["err"], out
    for out in pool.run_ok(body_cann_floor, "8.6.0", timeout=TIMEOUT):
        assert out == {"outer": "", "err": "", "eager_ok": True}, out


def test_graph_p2p_floor_is_in_the_table() -> None:
    table = ascend_table()
    for op in (C.SEND, C.RECV):
        entry = table.entry(op, Mode.GRAPH)
        assert entry.min_sdk == ("CANN", "8.6.0") and "npu_fx_compiler.py:846-851" in entry.note
        for version, level in (("8.5.0", Level.UNSUPPORTED), ("8.6.0", Level.NATIVE), ("9.0.0", Level.NATIVE),
                               ("8.6.RC1", Level.UNSUPPORTED)):
            got = table.resolve(op, mode=Mode.GRAPH, dtype=torch.float32, sdk_versions={"CANN": version}).level
            assert got is level, (op, version)
        assert table.entry(op).min_sdk is None  # eager send/recv have no such floor
    assert table.resolve(C.SEND, mode=Mode.GRAPH, dtype=torch.float32).level is Level.NATIVE  # version unknown


# ------------------------------------------------------------------------------------ (c) isend / irecv


def _exchange(x: torch.Tensor) -> torch.Tensor:
    peer = 1 - dist.get_rank()
    got = torch.empty_like(x)
    sent = xccl.isend(x, peer)
    received = xccl.irecv(got, peer)
    sent.wait()
    received.wait()
    return got


def body_isend() -> tuple[str, str]:
    return _outcome(lambda: _xccl_compile(_exchange)(torch.arange(4.0) + dist.get_rank()))


def test_isend_irecv_are_refused_at_trace_time(rank_pools: Any) -> None:
    for outer, err in rank_pools.get(2, **EMULATE).run_ok(body_isend, timeout=TIMEOUT):
        assert outer == "UnsupportedCollective", (outer, err)
        assert "no lowering for xccl.isend" in err, err
    assert "isend/irecv are not graph ops here" in ascend_table().entry(C.SEND, Mode.GRAPH).note


# -------------------------------------------------------------------- (d) torchair.get_npu_backend(), directly


def _sum(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    xccl.all_reduce(y)
    return y


def _avg(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    xccl.all_reduce(y, op=dist.ReduceOp.AVG)
    return y


def _bf16(x: torch.Tensor) -> torch.Tensor:
    y = x.to(torch.bfloat16)
    xccl.all_reduce(y)
    return y


def body_tutorial_backend() -> dict[str, Any]:
    """Each program compiled the tutorial way: ``torch.compile(fn, backend=torchair.get_npu_backend())``."""
    x = torch.arange(4.0) + dist.get_rank()
    out: dict[str, Any] = {}
    for name, fn in (("sum", _sum), ("avg", _avg), ("bf16", _bf16), ("pair", _pair)):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=sim_npu_backend(), fullgraph=True)
        result: list[torch.Tensor] = []
        outer, err = _outcome(lambda c=compiled, r=result: r.append(c(x)))  # type: ignore[misc]
        out[name] = (outer, err, bool(result) and bool(torch.equal(result[0], fn(x))))
    return out


def test_torchairs_own_backend_compiles_standard_collectives_and_names_xccl_compile_for_the_rest(
    rank_pools: Any,
) -> None:
    for out in rank_pools.get(2, **EMULATE).run_ok(body_tutorial_backend, timeout=TIMEOUT):
        for name in ("sum", "avg", "bf16"):
            assert out[name] == ("", "", True), (name, out[name])
        outer, err, _ = out["pair"]
        assert outer == "BackendCompilerFailed" and err.startswith("UnsupportedCollective"), out["pair"]
        assert "compile with xccl.compile(model)" in err and ("xccl.send" in err or "xccl.recv" in err), err
