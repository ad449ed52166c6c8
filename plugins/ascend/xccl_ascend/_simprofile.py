"""HCCL as xccl's simulation layer enforces it: which c10d methods exist, dtypes, reduce ops, options.

The table follows ``ProcessGroupHCCL.hpp`` (manifest A3): every standard collective is overridden; ``recvAnysource``
raises; ``allgather_coalesced`` is not overridden, so it raises c10d's base-class message. Per call
(:func:`check_call`), what the dtype lists cannot say: HCCL reduces fewer dtypes than it moves
(``checkSupportedDataType``, after the int32 cast of bool/uint8 that allreduce and reduce make), its ``prod``
refuses int16 and bfloat16 on Atlas A2/A3, and float8 moves on Ascend 950 only. xccl's capability table keeps all
of these from the group; the profile refuses them when a script calls the group directly, as HCCL would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import torch

from xccl.plugin import SimProfile

from ._capabilities import FLOAT8_DTYPES, MOVED_DTYPES, NO_PRODUCT_DTYPES, REDUCED_DTYPES, WIDE_DTYPES
from ._hccl_config import torch_check
from ._releases import Release, release

__all__ = ["SimHcclOptions", "check_call", "check_options", "hccl_profile"]

LOG = logging.getLogger("xccl.ascend")

_IMPLEMENTED: Final = (
    "allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_into_tensor_coalesced",
    "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base",
    "broadcast", "reduce", "gather", "scatter", "barrier", "send", "recv",
)


@dataclass
class SimHcclOptions:
    """Stands in for ``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options`` in simulation (same fields)."""

    #: HCCL communicator options; see :data:`xccl_ascend.HCCL_CONFIG_KEYS`.
    hccl_config: dict[str, int | str] = field(default_factory=dict)
    op_timeout: int | None = None
    #: Overwritten by torch_npu's creator in the real backend (gotcha 10); kept for the same shape.
    is_high_priority_stream: bool = False
    global_ranks_in_group: list[int] = field(default_factory=list)
    group_id: str = ""


def check_options(pg_options: object | None, group_rank: int, group_size: int) -> None:
    """What torch_npu's creator and ``createHcclCommConfigWithOptions`` do with ``pg_options``.

    Anything that is not an Options object is replaced by fresh Options (so its settings are lost, which the
    simulation logs); ``hccl_config`` values of the wrong type fail HCCL's ``TORCH_CHECK`` (on hardware at the
    first collective, here at group creation).

    Raises:
        RuntimeError: "Value type of <key> should be int." / "... should be string." (see
            :func:`~xccl_ascend._hccl_config.torch_check`).
        TypeError: a value no alternative of ``hccl_config``'s variant can hold.
    """
    if pg_options is None:
        return
    if not isinstance(pg_options, SimHcclOptions):
        LOG.warning(
            "pg_options of type %s is not ProcessGroupHCCL.Options: HCCL builds fresh Options and ignores it "
            "(group rank %d of %d)", type(pg_options).__name__, group_rank, group_size,
        )
        return
    torch_check(pg_options.hccl_config)


#: The simulated chip (``_sdk_sim.SIM_SOC_ENV``; read here without importing ``_sdk_sim``, which imports this
#: module): only an ``Ascend950*`` chip moves float8.
SOC_ENV: Final = "XCCL_SIM_ASCEND_SOC"
#: The chip name each short name of ``XCCL_SIM_ASCEND_SOC`` stands for.
_CHIPS: Final = {"A2": "Ascend910B1", "A3": "Ascend910_9391"}


def sim_device_name(env: Mapping[str, str] | None = None) -> str:
    """The simulated chip name from ``XCCL_SIM_ASCEND_SOC`` (default A2)."""
    raw = (os.environ if env is None else env).get(SOC_ENV, "").strip() or "A2"
    return _CHIPS.get(raw.upper(), raw)

#: Reductions that cast bool and uint8 to int32 before ``checkSupportedDataType`` (ProcessGroupHCCL.cpp's
#: allreduce, allreduce_coalesced and reduce; torch_npu 2.13 ``:4734-4737``).
_CASTS_TO_INT32: Final = frozenset({"allreduce", "allreduce_coalesced", "reduce"})
#: ``kHcclDataTypeToStringMap`` (HCCLUtils.cpp), the names torch_npu's messages use.
_SERIAL: Final = {
    torch.bool: "at::kByte/at::kBool", torch.uint8: "at::kByte/at::kBool", torch.int8: "at::kChar",
    torch.int16: "at::kShort", torch.int32: "at::kInt", torch.int64: "at::kLong", torch.float16: "at::kHalf",
    torch.float32: "at::kFloat", torch.float64: "at::kDouble", torch.bfloat16: "at::kBFloat16",
    torch.uint16: "at::ScalarType::UInt16", torch.uint32: "at::ScalarType::UInt32",
    torch.uint64: "at::ScalarType::UInt64", torch.float8_e4m3fn: "at::ScalarType::Float8_e4m3fn",
    torch.float8_e5m2: "at::ScalarType::Float8_e5m2",
}


def check_call(method: str, dtype: torch.dtype, reduce_op: str | None) -> str | None:
    """What HCCL refuses in one call of ``method`` over ``dtype`` (reducing with ``reduce_op``), or None.

    Float8 on a chip before Ascend 950 (CANN lists float8 for Atlas 350 only); a reduction over a dtype
    ``checkSupportedDataType`` refuses, with its message; ``prod`` over int16 or bfloat16 on Atlas A2/A3 (CANN's
    HcclAllReduce / HcclReduceScatter pages; on the hardware HCCL itself fails when the op runs).
    """
    chip = os.environ.get(SOC_ENV, "").strip() or "A2"
    if dtype in FLOAT8_DTYPES and not chip.startswith("Ascend950"):
        return (f"HCCL {method}: {_SERIAL[dtype]} is moved on Atlas 350 (Ascend950) only (CANN's HCCL data types); "
                f"the simulated chip is {chip} ({SOC_ENV})")
    if reduce_op is None:
        return None
    reduced = torch.int32 if dtype in (torch.bool, torch.uint8) and method in _CASTS_TO_INT32 else dtype
    if reduced not in REDUCED_DTYPES:
        return f"HCCL {method}: Unsupported data type {_SERIAL.get(dtype, str(dtype))}"
    if reduce_op == "product" and reduced in NO_PRODUCT_DTYPES:
        return (f"HCCL {method}: \"prod\" does not support {_SERIAL[reduced]} on Atlas A2/A3 (CANN HcclAllReduce / "
                "HcclReduceScatter; on the hardware HCCL fails when the op runs): reduce in int32 or float32")
    if reduce_op == "premul_sum" and not reduced.is_floating_point:
        return "PreMulSum Data type must be half, float, bfloat16 or double"
    return None


def hccl_profile(npu: Release | None = None) -> SimProfile:
    """The profile registered as the ``hccl`` backend in simulation, for the torch_npu release ``npu`` (default: the
    one in force, ``_releases``): 2.7.1 and 2.8.0 before their 26.0.0 line map no PREMUL_SUM and no wide dtypes."""
    npu = npu or release()
    ops: dict[str, str | None] = dict.fromkeys(_IMPLEMENTED)
    ops["recv_anysource"] = "ProcessGroupHCCL does not support recv"
    return SimProfile(
        backend="hccl",
        vendor_name="ProcessGroupHCCL",
        native_ops=ops,
        dtypes=frozenset(MOVED_DTYPES - (frozenset() if npu.wide_dtypes else WIDE_DTYPES)),
        reduce_ops=frozenset({"sum", "product", "min", "max", "avg"} | ({"premul_sum"} if npu.premul_sum else set())),
        reduce_op_messages={} if npu.premul_sum else {"premul_sum": "Unhandled ReduceOp"},
        uneven_all_to_all=True,
        check_options=check_options,
        check_call=check_call,
    )
