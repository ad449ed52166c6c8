"""xccl's fused ops on simulated Ascend, at 2 and 4 real ranks: the native (simulated MC2) kernels against the
unfused reference in float16/bfloat16, the portable fallback in float32, and documented constraints violated
through the public API under each fallback policy."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import xccl_ascend

import xccl
from xccl.collectives._groups import register, state_of
from xccl.collectives._state import GROUPS, PROCESS

SIM = {"XCCL_SIMULATE": "ascend"}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def operand(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * rank + salt)
    return torch.randn(shape, generator=gen).to(dtype)


def close(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest error relative to the reference's largest magnitude."""
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12))


def run_ops(dtype: torch.dtype, m: int, k: int, n: int, group: Any = None, ranks: list[int] | None = None) -> dict[str, float]:
    """The three fused ops on ``group``; each rank's error against the float64 unfused reference."""
    members = ranks if ranks is not None else list(range(xccl.get_world().world_size))
    me, w = members.index(xccl.get_world().rank), len(members)
    a = [operand(r, (m, k), dtype, 1) for r in members]
    b = [operand(r, (k, n), dtype, 2) for r in members]
    prod = sum(x.double() @ y.double() for x, y in zip(a, b, strict=True))
    out = {}
    got = xccl.mm_reduce_scatter(a[me], b[me], group)
    out["mm_reduce_scatter"] = close(got, prod.chunk(w)[me])
    y, gathered = xccl.all_gather_mm(a[me], b[me], group)
    out["all_gather_mm"] = close(y, torch.cat(a).double() @ b[me].double())
    out["all_gather_mm gathered"] = float(not torch.equal(gathered, torch.cat(a)))
    got = xccl.mm_all_reduce(a[me], b[me], group)
    out["mm_all_reduce"] = close(got, prod)
    return out


def warned(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``fn``, returning its result and the fallback warnings it issued (dedup state cleared first)."""
    GROUPS.warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(x.message) for x in caught if type(x.message).__name__ == "ConstraintFallbackWarning"]


def body_values(dtype: torch.dtype) -> dict[str, Any]:
    xccl_ascend.reset_mc2_domain()
    errors, warns = warned(lambda: run_ops(dtype, m=4 * xccl.get_world().world_size, k=256, n=16))
    return {"errors": errors, "warnings": warns}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_native_kernels_match_reference(rank_pools: Any, world_size: int, dtype: torch.dtype) -> None:
    outs = rank_pools.get(world_size, env=SIM).run_ok(body_values, dtype, timeout=120)
    for o in outs:
        assert o["warnings"] == []  # the simulated MC2 kernels ran: no constraint failed
        assert o["errors"]["all_gather_mm gathered"] == 0.0
        assert max(o["errors"].values()) < TOL[dtype], o["errors"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_float32_falls_back_and_matches(rank_pools: Any, world_size: int) -> None:
    outs = rank_pools.get(world_size, env=SIM).run_ok(body_values, torch.float32, timeout=120)
    for o in outs:
        assert max(o["errors"].values()) < TOL[torch.float32], o["errors"]
        assert len(o["warnings"]) == 3 and all("constraint 'dtype'" in m for m in o["warnings"]), o["warnings"]


# ------------------------------------------------------------------------------- constraints via the public API


_POLICY_GROUPS: dict[str, Any] = {}


def policy_group(fallback: str) -> Any:
    """A group over the whole world dispatched under another fallback policy (xccl's group registry is the seam,
    as in xccl's own fused tests), so one pool serves every policy."""
    if fallback not in _POLICY_GROUPS:
        group = xccl.new_group()
        register(group, PROCESS.runtime, fallback)
        _POLICY_GROUPS[fallback] = group
    return _POLICY_GROUPS[fallback]


def violations(group: Any) -> dict[str, Callable[[], Any]]:
    """One call per documented constraint that the public API can reach, each on float16 operands."""
    w = xccl.get_world().world_size
    h = torch.float16
    a, b = operand(0, (2 * w, 256), h, 1), operand(0, (256, 8), h, 2)

    def on_a3(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            os.environ["XCCL_SIM_ASCEND_SOC"] = "A3"
            try:
                return fn()
            finally:
                del os.environ["XCCL_SIM_ASCEND_SOC"]
        return call

    def second_domain() -> Any:
        xccl.mm_all_reduce(a, b)  # the world's domain is claimed first
        return xccl.mm_all_reduce(a, b, group)

    return {
        "dtype": lambda: xccl.mm_reduce_scatter(a.float(), b.float(), group),
        "k range": lambda: xccl.all_gather_mm(operand(0, (2, 128), h, 3), operand(0, (128, 8), h, 4), group),
        "reduce_op": lambda: xccl.mm_reduce_scatter(a, b, group, reduce_op="max"),
        "bias": lambda: xccl.mm_reduce_scatter(a, b, group, bias=torch.ones(8, dtype=h)),
        "product line": on_a3(lambda: xccl.mm_all_reduce(a, b, group)),
        "one communication domain per model": second_domain,
    }


def body_violations(name: str, fallback: str) -> dict[str, Any]:
    group = policy_group(fallback)
    xccl_ascend.reset_mc2_domain()
    try:
        _, warns = warned(violations(group)[name])
        return {"ok": True, "warnings": warns}
    except xccl.ConstraintViolation as exc:
        return {"ok": False, "constraint": exc.constraint, "detail": exc.detail}
    finally:
        xccl_ascend.reset_mc2_domain()


CONSTRAINTS = ["dtype", "k range", "reduce_op", "bias", "product line", "one communication domain per model"]


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_violation_warns_and_falls_back(rank_pools: Any, constraint: str) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_violations, constraint, "warn")
    for o in outs:
        assert o["ok"], o
        assert len(o["warnings"]) == 1 and f"constraint {constraint!r}" in o["warnings"][0], o["warnings"]


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_violation_raises_under_error_policy(rank_pools: Any, constraint: str) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_violations, constraint, "error")
    assert outs[0] == outs[1]
    assert not outs[0]["ok"] and outs[0]["constraint"] == constraint
    assert outs[0]["detail"].startswith("torch_npu.npu_")


def body_world_size() -> dict[str, Any]:
    """A group of 3 ranks: no MC2 kernel takes it; the portable version computes the right values."""
    xccl_ascend.reset_mc2_domain()
    group = xccl.new_group([0, 1, 2])
    if xccl.get_world().rank == 3:
        return {}
    errors, warns = warned(lambda: run_ops(torch.float16, m=6, k=256, n=8, group=group, ranks=[0, 1, 2]))
    return {"errors": errors, "warnings": warns}


def test_world_size_violation_at_four_ranks(rank_pools: Any) -> None:
    outs = rank_pools.get(4, env=SIM).run_ok(body_world_size, timeout=120)
    for o in outs[:3]:
        assert max(o["errors"].values()) < TOL[torch.float16], o["errors"]
        assert len(o["warnings"]) == 3 and all("constraint 'world size'" in m for m in o["warnings"])


def body_comm_name_is_collective() -> dict[str, Any]:
    """The fused kernels fetch the communicator name through xccl.comm_name, on every rank, once per group."""
    xccl_ascend.reset_mc2_domain()
    group = xccl.new_group([0, 1])
    if xccl.get_world().rank > 1:
        return {}
    h = torch.float16
    xccl.mm_all_reduce(operand(0, (2, 256), h, 5), operand(0, (256, 4), h, 6), group)
    xccl_ascend.reset_mc2_domain()
    return {"cached": state_of(group).comm_name}


def test_fused_kernels_fetch_comm_name(rank_pools: Any) -> None:
    outs = rank_pools.get(4, env=SIM).run_ok(body_comm_name_is_collective)
    assert outs[0]["cached"] and outs[0]["cached"] == outs[1]["cached"]
