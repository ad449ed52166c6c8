"""Every documented constraint of the MC2 kernels, each violated once (the checks both runtimes run)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from xccl_ascend import ProductLine, _constraints, product_line
from xccl_ascend._constraints import (
    RULES,
    DomainTracker,
    FusedCall,
    check_all_gather_mm,
    check_mm_all_reduce,
    check_mm_reduce_scatter,
)

from xccl import ConstraintViolation, InvalidArgument

H = torch.float16
A2 = FusedCall("mm_reduce_scatter", "Ascend910B1", 2)
A3 = dataclasses.replace(A2, device_name="Ascend910_9391")


def mats(m: int = 128, k: int = 512, n: int = 64, dtype: torch.dtype = H, b_dtype: torch.dtype | None = None):  # type: ignore[no-untyped-def]
    return torch.zeros(m, k, dtype=dtype), torch.zeros(k, n, dtype=b_dtype or dtype)


def violated(check: Callable[..., None], call: FusedCall, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> ConstraintViolation:
    with pytest.raises(ConstraintViolation) as err:
        check(call, a, b, **kw)
    assert err.value.backend == "ascend" and err.value.op == call.op
    return err.value


@pytest.mark.parametrize(
    ("device", "line"),
    [("Ascend910B1", ProductLine.A2), ("Ascend910B4-1", ProductLine.A2), ("Ascend910_9391", ProductLine.A3),
     ("Ascend910ProA", ProductLine.OTHER), ("Ascend310P3", ProductLine.OTHER)],
)
def test_product_line(device: str, line: ProductLine) -> None:
    assert product_line(device) is line


def test_valid_calls_pass() -> None:
    a, b = mats()
    check_mm_reduce_scatter(A2, a, b, bias=torch.zeros(64, dtype=H))
    check_all_gather_mm(dataclasses.replace(A3, world_size=16), a, b)
    check_mm_all_reduce(dataclasses.replace(A2, world_size=1), torch.zeros(2, 3, 512, dtype=torch.bfloat16),
                        torch.zeros(512, 8, dtype=torch.bfloat16), bias=torch.ones(8, dtype=torch.bfloat16))
    check_mm_reduce_scatter(dataclasses.replace(A2, cann_version="8.0.0"), *mats(k=256))
    check_mm_reduce_scatter(A2, mats()[0], mats()[1].t().contiguous().t())  # x2 may be a transposed view


CASES: list[tuple[str, Callable[..., None], FusedCall, tuple[torch.Tensor, torch.Tensor], dict[str, Any], str]] = [
    ("product line", check_mm_reduce_scatter, dataclasses.replace(A2, device_name="Ascend910ProA"), mats(), {}, "runs on Atlas A2"),
    ("world size", check_mm_reduce_scatter, dataclasses.replace(A2, world_size=16), mats(), {}, "takes [2, 4, 8]"),
    ("world size", check_all_gather_mm, dataclasses.replace(A3, world_size=64), mats(), {}, "takes [2, 4, 8, 16, 32]"),
    ("world size", check_mm_reduce_scatter, dataclasses.replace(A3, world_size=12), mats(m=120), {}, "takes [2, 4, 8, 16, 32]"),
    ("CANN >= 8.0.RC2", check_mm_reduce_scatter, dataclasses.replace(A2, cann_version="8.0.RC1"), mats(), {}, "CANN 8.0.RC1"),
    ("topology", check_mm_reduce_scatter, dataclasses.replace(A2, ranks=(0, 8), local_world_size=8), mats(), {}, "spans 2 servers"),
    ("comm_turn", check_mm_reduce_scatter, dataclasses.replace(A2, comm_turn=1), mats(), {}, "only 0"),
    ("dtype", check_mm_reduce_scatter, A2, mats(dtype=torch.float32), {}, "x1 is torch.float32"),
    ("dtype", check_mm_reduce_scatter, A2, mats(b_dtype=torch.bfloat16), {}, "must match"),
    ("dtype", check_all_gather_mm, A2, mats(dtype=torch.int8), {}, "quantisation scales"),
    ("2-D inputs", check_mm_reduce_scatter, A2, (torch.zeros(2, 64, 512, dtype=H), mats()[1]), {}, "must both be 2-D"),
    ("k range", check_mm_reduce_scatter, A2, mats(k=255), {}, "k=255"),
    ("k range", check_all_gather_mm, A2, mats(k=65535), {}, "256 <= k < 65535"),
    ("m divisible by world size", check_mm_reduce_scatter, dataclasses.replace(A2, world_size=4), mats(m=130), {}, "m=130"),
    ("reduce_op", check_mm_reduce_scatter, A2, mats(), {"reduce_op": "max"}, "only 'sum'"),
    ("bias", check_mm_reduce_scatter, A2, mats(), {"bias": torch.ones(64, dtype=H)}, "non-zero bias"),
    ("bias", check_all_gather_mm, A2, mats(), {"bias": torch.zeros(63, dtype=H)}, "1-D of size 64"),
    ("gather_index", check_all_gather_mm, A2, mats(), {"gather_index": 1}, "gather_index=1"),
    ("x1 not transposed", check_mm_reduce_scatter, A2, (torch.zeros(512, 128, dtype=H).t(), mats()[1]), {}, "not contiguous"),
    ("non-empty", check_all_gather_mm, A2, mats(m=0), {}, "is empty"),
    ("product line", check_mm_all_reduce, A3, mats(), {}, "Atlas A2 (Ascend910B*) only"),
    ("world size", check_mm_all_reduce, dataclasses.replace(A2, world_size=16), mats(), {}, "takes [1, 2, 4, 8]"),
    ("2-D inputs", check_mm_all_reduce, A2, (torch.zeros(1, 1, 2, 512, dtype=H), mats()[1]), {}, "(b, s, k)"),
    ("bias", check_mm_all_reduce, A2, mats(), {"bias": torch.zeros(64, dtype=torch.float32)}, "1-D of size 64"),
    ("reduce_op", check_mm_all_reduce, A2, mats(), {"reduce_op": "avg"}, "only 'sum'"),
    ("size limits", check_mm_all_reduce, A2,
     (torch.empty(2**31, 1, dtype=H, device="meta"), torch.empty(1, 1, dtype=H, device="meta")), {}, "2**31 - 1"),
]


@pytest.mark.parametrize(("constraint", "check", "call", "tensors", "kw", "detail"), CASES,
                         ids=[f"{c[1].__name__.removeprefix('check_')}:{c[0]}" for c in CASES])
def test_each_constraint(
    constraint: str, check: Callable[..., None], call: FusedCall, tensors: tuple[torch.Tensor, torch.Tensor],
    kw: dict[str, Any], detail: str,
) -> None:
    err = violated(check, call, *tensors, **kw)
    assert err.constraint == constraint
    assert detail in err.detail
    assert err.detail.startswith("torch_npu.npu_")


def test_not_a_matmul_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="inner dimensions differ"):
        check_mm_reduce_scatter(A2, torch.zeros(128, 512, dtype=H), torch.zeros(256, 64, dtype=H))


def test_one_domain_per_model_on_a2() -> None:
    tracker = DomainTracker()
    tracker.check(A2, "npu_mm_reduce_scatter_base", "1")
    tracker.claim(A2, "1", "hcom_a")
    tracker.check(A2, "npu_all_gather_base_mm", "1")  # the same domain again is fine
    with pytest.raises(ConstraintViolation) as err:
        tracker.check(A2, "npu_all_gather_base_mm", "2")
    assert err.value.constraint == "one communication domain per model" and "hcom_a" in err.value.detail
    tracker.check(A3, "npu_all_gather_base_mm", "2")  # A3 has no such rule
    tracker.reset()
    tracker.check(A2, "npu_all_gather_base_mm", "2")


def test_kernel_check_on_meta_tensors() -> None:
    """``kernel.check`` as xccl's fused graph pass calls it: meta tensors, shapes only."""
    from xccl_ascend import plugin
    from xccl_ascend._runtime import AscendRuntime
    from xccl_ascend._sdk_sim import SimSdk

    from xccl import Collective

    kernels = AscendRuntime(plugin, simulate=True, sdk=SimSdk({})).kernels()
    meta = {"dtype": H, "device": "meta"}
    a, b = torch.empty(8, 512, **meta), torch.empty(512, 64, **meta)  # type: ignore[arg-type]
    kernels[Collective.MM_REDUCE_SCATTER].check(a, b, 2, reduce_op="sum", bias=None)  # type: ignore[attr-defined]
    kernels[Collective.ALL_GATHER_MM].check(torch.empty(512, 8, **meta).t(), b, 4, gather_output=True)  # type: ignore[arg-type, attr-defined]
    with pytest.raises(ConstraintViolation, match="k range"):
        kernels[Collective.ALL_GATHER_MM].check(a[:, :128], b[:128], 2, gather_output=False)  # type: ignore[attr-defined]
    with pytest.raises(ConstraintViolation) as err:
        kernels[Collective.MM_REDUCE_SCATTER].check(a, b, 2, reduce_op="sum", bias=torch.empty(64, **meta))  # type: ignore[arg-type, attr-defined]
    assert err.value.constraint == "bias"
    kernels[Collective.MM_ALL_REDUCE].check(a, b, 8, bias=torch.empty(64, **meta))  # type: ignore[arg-type, attr-defined]
    with pytest.raises(ConstraintViolation, match="world size"):
        kernels[Collective.MM_ALL_REDUCE].check(a, b, 16, bias=None)  # type: ignore[attr-defined]


@pytest.mark.parametrize("check", [check_mm_reduce_scatter, check_all_gather_mm])
def test_a3_takes_32_ranks_and_a2_stops_at_8(check: Callable[..., None]) -> None:
    """Seed 004 and op-plugin's docs and kernels: A3 runs 2, 4, 8, 16 or 32 ranks; A2 2, 4 or 8."""
    a, b = mats(m=128)
    for size in (2, 4, 8, 16, 32):
        check(dataclasses.replace(A3, world_size=size), a, b)
    for size in (2, 4, 8):
        check(dataclasses.replace(A2, world_size=size), a, b)
    assert violated(check, dataclasses.replace(A2, world_size=16), a, b).constraint == "world size"


def test_rules_name_every_checked_constraint() -> None:
    """RULES (what the docs and the ledger render) lists exactly the constraints the checks raise, with sources."""
    source = Path(_constraints.__file__).read_text(encoding="utf-8")
    raised = set(re.findall(r'violation\(\s*kernel,\s*"([^"]+)"', source))
    assert raised == {r.name for r in RULES}
    assert all(r.sources and r.rule for r in RULES)
    kernels = {"npu_mm_reduce_scatter_base", "npu_all_gather_base_mm", "npu_mm_all_reduce_base"}
    assert all(set(r.rule) <= kernels for r in RULES)
    assert "A3: 2, 4, 8, 16, 32" in _constraints.describe("npu_all_gather_base_mm")
