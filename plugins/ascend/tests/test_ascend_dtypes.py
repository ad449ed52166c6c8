"""HCCL's dtypes as the table, the simulated group and 2 real ranks see them: what it moves beyond gloo's dtypes
(uint16/32/64, int16, float8 on Ascend 950 only), what it reduces, and ``prod``, which CANN refuses over int16 and
bfloat16 on Atlas A2/A3."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from xccl_ascend._capabilities import MOVED_DTYPES
from xccl_ascend._sdk_sim import SIM_SOC_ENV
from xccl_ascend._simprofile import SOC_ENV, check_call

import xccl
from xccl import Collective as C
from xccl import Level
from xccl.plugin import ALL_DTYPES
from xccl.runtime import vendor_group

TABLE = xccl.capabilities("ascend")
#: torch_npu 2.13.0, the release these tests read (on torch 2.8 the simulation is 2.8.0's: test_ascend_releases.py).
SIM = {"XCCL_SIMULATE": "ascend", "XCCL_SIM_TORCH_NPU": "2.13.0"}
R = xccl.ReduceOp
#: torch_npu 2.13's kScalarTypeToHcclDataType beyond gloo's dtypes.
NEW = (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2)
F8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.mark.parametrize("dtype", NEW)
@pytest.mark.parametrize("op", [C.ALL_GATHER_INTO_TENSOR, C.ALL_GATHER, C.BROADCAST, C.ALL_TO_ALL_SINGLE, C.SEND,
                                C.SCATTER, C.ALL_GATHER_INTO_TENSOR_UNEVEN, C.ALL_TO_ALL_V])
def test_hccl_moves_the_unsigned_and_float8_dtypes(op: C, dtype: torch.dtype) -> None:
    # all_to_all_v on torch_npu 2.13.0 (no all_to_all_vc) is all_to_all_single with split sizes, which moves them.
    want = Level.EMULATED if op is C.ALL_TO_ALL_V else Level.NATIVE
    assert TABLE.resolve(op, dtype=dtype).level is want


@pytest.mark.parametrize("dtype", NEW)
@pytest.mark.parametrize("op", [C.ALL_REDUCE, C.REDUCE_SCATTER_TENSOR, C.REDUCE])
def test_but_reduces_none_of_them(op: C, dtype: torch.dtype) -> None:
    assert TABLE.resolve(op, dtype=dtype, reduce_op="sum").level is Level.UNSUPPORTED


@pytest.mark.parametrize("op", [C.ALL_REDUCE, C.REDUCE_SCATTER_TENSOR, C.REDUCE_SCATTER, C.REDUCE,
                                C.ALL_REDUCE_COALESCED, C.REDUCE_SCATTER_TENSOR_UNEVEN])
@pytest.mark.parametrize("dtype", [torch.int16, torch.bfloat16])
def test_no_prod_over_int16_or_bfloat16(op: C, dtype: torch.dtype) -> None:
    """CANN HcclAllReduce / HcclReduceScatter: "prod" does not support int16, bfp16 on Atlas A2 and A3."""
    res = TABLE.resolve(op, dtype=dtype, reduce_op="product")
    assert res.level is Level.UNSUPPORTED and "'product' is not supported" in res.reason
    assert TABLE.resolve(op, dtype=dtype, reduce_op="max").level is Level.NATIVE
    assert TABLE.resolve(op, dtype=torch.float32, reduce_op="product").level is Level.NATIVE
    assert "no product over int16 or bfloat16" in TABLE.entry(op).note


def test_every_claimed_dtype_is_one_xccl_knows() -> None:
    assert set(ALL_DTYPES) >= MOVED_DTYPES
    assert SOC_ENV == SIM_SOC_ENV  # the profile reads the simulated chip from the SDK's variable


@pytest.mark.parametrize(
    ("method", "dtype", "redop", "chip", "message"),
    [
        ("_allgather_base", torch.float8_e4m3fn, None, "A2", "moved on Atlas 350 (Ascend950) only"),
        ("broadcast", torch.float8_e5m2, None, "A3", "the simulated chip is A3 (XCCL_SIM_ASCEND_SOC)"),
        ("_allgather_base", torch.float8_e4m3fn, None, "Ascend950PR_9599", None),
        ("_allgather_base", torch.uint64, None, "A2", None),
        ("allreduce", torch.uint16, "sum", "A2", "HCCL allreduce: Unsupported data type at::ScalarType::UInt16"),
        ("allreduce", torch.float64, "sum", "A2", "HCCL allreduce: Unsupported data type at::kDouble"),
        ("allreduce", torch.uint8, "sum", "A2", None),  # allreduce casts uint8 to int32 first
        ("_reduce_scatter_base", torch.uint8, "sum", "A2", "HCCL _reduce_scatter_base: Unsupported data type "
         "at::kByte/at::kBool"),
        ("allreduce", torch.bfloat16, "product", "A2", '"prod" does not support at::kBFloat16 on Atlas A2/A3'),
        ("reduce_scatter", torch.int16, "product", "A3", '"prod" does not support at::kShort'),
        ("allreduce", torch.bfloat16, "max", "A2", None),
        ("allreduce", torch.int32, "premul_sum", "A2", "PreMulSum Data type must be half, float, bfloat16 or double"),
    ],
)
def test_simulated_hccl_refuses_per_call(
    method: str, dtype: torch.dtype, redop: str | None, chip: str, message: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIM_SOC_ENV, chip)
    got = check_call(method, dtype, redop)
    assert got is None if message is None else message in (got or "")


# ------------------------------------------------------------------------------------------------- 2 real ranks


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _data(rank: int, dtype: torch.dtype, rows: int = 2) -> torch.Tensor:
    t = torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3) + 10 * rank + 1
    return t.to(torch.float32).to(dtype) if dtype.is_floating_point else t.to(dtype)


def body_moves() -> dict[str, str]:
    """Every new dtype through xccl on the simulated HCCL world, bit for bit; float8 on A2 and on Ascend 950."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    out: dict[str, str] = {}

    def moves(dt: torch.dtype) -> str:
        ins = [_data(i, dt) for i in range(n)]
        big = torch.empty((2 * n, 3), dtype=dt)
        xccl.all_gather_into_tensor(big, ins[r])
        t = ins[r].clone()
        xccl.broadcast(t, src=n - 1)
        flat = torch.empty(2 * 3, dtype=dt)
        xccl.all_to_all_single(flat, ins[r].reshape(-1))
        want = torch.cat([ins[i].reshape(-1)[3 * r : 3 * r + 3] for i in range(n)])
        ok = _same_bits(big, torch.cat(ins)) and _same_bits(t, ins[n - 1]) and _same_bits(flat, want)
        return "ok" if ok else f"wrong: {big.tolist()} {t.tolist()} {flat.tolist()}"

    for dt in (torch.uint16, torch.uint32, torch.uint64, torch.int16):
        out[str(dt)] = moves(dt)
    for chip in ("A2", "Ascend950PR_9599"):
        os.environ[SIM_SOC_ENV] = chip
        try:
            for dt in F8:
                try:
                    out[f"{dt} {chip}"] = moves(dt)
                except Exception as exc:  # the test compares types and messages
                    out[f"{dt} {chip}"] = f"{type(exc).__name__}: {exc}"
        finally:
            del os.environ[SIM_SOC_ENV]
    return out


def body_prod() -> dict[str, str]:
    """prod over bfloat16: refused by xccl's table before anything is sent, and by the simulated HCCL group."""
    out: dict[str, str] = {}
    for name, call in {
        "xccl bf16 prod": lambda: xccl.all_reduce(torch.ones(2, dtype=torch.bfloat16), R.PRODUCT),
        "group bf16 prod": lambda: dist.all_reduce(torch.ones(2, dtype=torch.bfloat16), dist.ReduceOp.PRODUCT,
                                                   group=vendor_group()),
        "group uint16 sum": lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint16), group=vendor_group()),
        "group f32 prod": lambda: dist.all_reduce(torch.ones(2), dist.ReduceOp.PRODUCT, group=vendor_group()),
    }.items():
        try:
            call()
            out[name] = "ran"
        except Exception as exc:  # the test compares types and messages
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def test_new_dtypes_move_bit_exactly_on_the_simulated_group(rank_pools: Any) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_moves, timeout=120)
    for o in outs:
        for dt in ("torch.uint16", "torch.uint32", "torch.uint64", "torch.int16"):
            assert o[dt] == "ok", (dt, o[dt])
        for dt in F8:
            assert o[f"{dt} Ascend950PR_9599"] == "ok"  # an fp8 all_gather HCCL accepts passes
            assert o[f"{dt} A2"].startswith("SimulatedVendorError: HCCL _allgather_base: at::ScalarType::Float8_")
            assert "moved on Atlas 350 (Ascend950) only" in o[f"{dt} A2"]


def test_prod_over_bfloat16_is_refused(rank_pools: Any) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_prod)
    assert outs[0] == outs[1]
    o = outs[0]
    assert o["xccl bf16 prod"].startswith("UnsupportedCollective: all_reduce is not supported on ascend: reduce op "
                                          "'product'")
    assert o["group bf16 prod"].startswith('SimulatedVendorError: HCCL allreduce: "prod" does not support '
                                           "at::kBFloat16")
    assert o["group uint16 sum"] == ("SimulatedVendorError: HCCL allreduce: Unsupported data type "
                                     "at::ScalarType::UInt16")
    assert o["group f32 prod"] == "ran"
