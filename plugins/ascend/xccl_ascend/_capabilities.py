"""Ascend's capability table: HCCL through torch_npu 2.13.0 (manifest A2-A5) and TorchAir (seeds 000/001).

Eager mode (manifest A3, ``ProcessGroupHCCL.cpp``):

* every standard collective is a C++ override of ProcessGroupHCCL, so all are native; ``recvAnysource`` is not;
* dtypes: HCCL moves bool, uint8, int8, int16, int32, int64, float16, float32, float64 and bfloat16 (its dtype
  map); it *reduces* only int8/16/32/64, float16, float32 and bfloat16 (``checkSupportedDataType``). all_reduce
  casts bool and uint8 to int32 itself; the other reductions get the same cast from xccl (bool as max/min, which
  is or/and, uint8 wrapping like uint8 arithmetic). float64 reductions are unsupported (only Ascend 950 has them):
  there is no exact cast;
* reduce ops: sum, product, min, max; avg is done by HCCL as sum then a divide, on floats only (the divide is an
  in-place true division, which integer tensors refuse), integers get xccl's sum + truncating divide;
  premul_sum on floats only; band/bor/bxor raise "Cannot use ReduceOp.BAND with HCCL";
* ``torch.distributed.gather`` is replaced by torch_npu (gotcha 12) with an all_gather plus a
  ``broadcast_object_list``: xccl calls the c10d op, so on Ascend a gather moves the whole gathered tensor to every
  rank (world size times the bytes of a true gather) unless the compatible implementation is enabled on 910B/910_93;
* torch_npu's own uneven all_gather / reduce_scatter and ``all_to_all_vc`` back xccl's uneven API natively;
* the MC2 fused kernels back xccl's fused API; their constraints (``_constraints``) are checked per call, and a
  violation falls back to the portable version under the fallback policy.

Graph mode (TorchAir's converters, seeds 000/001): the ops of TorchAir's list, with the oldest PyTorch on which
each enters the graph as ``min_torch``. send/recv enter only from 2.6; reduce_scatter_tensor and the uneven ops
are marked unsupported in the 2.1 table and supported from 2.6 (2.2-2.5 are not documented, so 2.6 is the floor).
xccl's own graph path decides what it compiles; these entries say what TorchAir accepts, and the simulation
verifies them only where xccl's graph path covers them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Final

import torch

from xccl.plugin import CapabilityTable, Collective, Level, Support, table_from

__all__ = ["MOVED_DTYPES", "REDUCED_DTYPES", "ascend_table"]

C = Collective
#: Every dtype HCCL carries (``kScalarTypeToHcclDataType``); bool travels as uint8.
MOVED_DTYPES: Final = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.bfloat16,
})
#: Dtypes HCCL reduces (``checkSupportedDataType``).
REDUCED_DTYPES: Final = frozenset({
    torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16,
})
_FLOATS: Final = (torch.float16, torch.float32, torch.bfloat16)
_BASE_OPS: Final = frozenset({"sum", "product", "min", "max"})
_FLOAT_OPS: Final = _BASE_OPS | {"avg", "premul_sum"}
_CAST: Final[Mapping[torch.dtype, torch.dtype]] = {torch.bool: torch.int32, torch.uint8: torch.int32}

_REDUCING_NOTE: Final = (
    "reduces int8/16/32/64, float16/32, bfloat16; bool and uint8 through an int32 cast (bool sum = or); no "
    "float64; avg (sum then divide) and premul_sum on floats only; band/bor/bxor: 'Cannot use ReduceOp.BAND with HCCL'"
)


def _reducing(*, native_cast: bool = False, float_ops: frozenset[str] = _FLOAT_OPS, note: str = _REDUCING_NOTE) -> Support:
    dtypes = REDUCED_DTYPES | (frozenset(_CAST) if native_cast else frozenset())
    return Support(
        Level.NATIVE,
        dtypes=dtypes,
        reduce_ops=_BASE_OPS,
        dtype_reduce_ops={d: float_ops for d in _FLOATS},
        cast_to={} if native_cast else _CAST,
        note=note,
    )


_MOVING: Final = Support(Level.NATIVE, dtypes=MOVED_DTYPES)
_FUSED_NOTE: Final = (
    "constraints checked per call (float16/bfloat16, 2-D, 256 <= k < 65535, world size per product line, "
    "reduce_op 'sum', comm_turn 0, no bias, one domain per model on A2); a violation falls back to the portable "
    "version under the fallback policy"
)


def _eager() -> dict[Collective, Support]:
    return {op: _MOVING for op in C} | {
        C.ALL_REDUCE: _reducing(native_cast=True, note=_REDUCING_NOTE + "; all_reduce casts bool/uint8 itself"),
        C.ALL_REDUCE_COALESCED: _reducing(note="ProcessGroupHCCL::allreduce_coalesced; " + _REDUCING_NOTE),
        C.ALL_GATHER_COALESCED: Support(
            Level.EMULATED, via="all_gather",
            note="ProcessGroupHCCL does not override allgather_coalesced (the c10d base class raises): one "
            "all_gather per tensor",
        ),
        C.RECV_ANY_SOURCE: Support(
            Level.UNSUPPORTED,
            note="ProcessGroupHCCL::recvAnysource raises 'ProcessGroupHCCL does not support recv'; pass src",
        ),
        C.REDUCE: _reducing(),
        C.REDUCE_SCATTER: _reducing(),
        C.REDUCE_SCATTER_TENSOR: _reducing(),
        C.REDUCE_SCATTER_TENSOR_UNEVEN: _reducing(
            float_ops=_BASE_OPS,
            note="torch_npu.distributed.reduce_scatter_tensor_uneven; sum/product/min/max (avg through xccl's sum "
            "then divide); same dtypes as reduce_scatter",
        ),
        C.ALL_GATHER_INTO_TENSOR_UNEVEN: dataclasses.replace(
            _MOVING, note="torch_npu.distributed.all_gather_into_tensor_uneven"
        ),
        C.ALL_TO_ALL_V: dataclasses.replace(
            _MOVING, note="torch_npu.distributed.all_to_all_vc (count matrix the same on every rank; no in-place)"
        ),
        C.ALL_TO_ALL_SINGLE_UNEVEN: dataclasses.replace(_MOVING, note="HCCL honours all_to_all_single split sizes"),
        C.GATHER: Support(
            Level.EMULATED, via="all_gather",
            note="torch_npu replaces torch.distributed.gather with an all_gather (gotcha 12; Ascend/pytorch "
            "torch_npu/distributed/distributed_c10d.py _gather): HCCL's own gather runs only with the compatible "
            "implementation on 910B/910_93, so xccl gathers the same way, kept on the root",
        ),
        C.BARRIER: Support(Level.NATIVE),
        C.MM_REDUCE_SCATTER: Support(Level.NATIVE, note="torch_npu.npu_mm_reduce_scatter_base; " + _FUSED_NOTE),
        C.ALL_GATHER_MM: Support(Level.NATIVE, note="torch_npu.npu_all_gather_base_mm; " + _FUSED_NOTE),
        C.MM_ALL_REDUCE: Support(
            Level.NATIVE,
            note="torch_npu.npu_mm_all_reduce_base; Atlas A2 only, world size 1/2/4/8, x1 (m, k) or (b, s, k); "
            + _FUSED_NOTE,
        ),
    }


#: Seed 000 (PyTorch >= 2.6) and seed 001 (PyTorch 2.1): op -> oldest torch on which TorchAir puts it in a graph.
_GRAPH_SINCE: Final[Mapping[Collective, tuple[tuple[int, int], str]]] = {
    C.ALL_REDUCE: ((2, 1), ""),
    C.ALL_GATHER: ((2, 1), ""),
    C.ALL_GATHER_INTO_TENSOR: ((2, 1), ""),
    C.ALL_TO_ALL: ((2, 1), ""),
    C.ALL_TO_ALL_SINGLE: ((2, 1), ""),
    C.ALL_TO_ALL_SINGLE_UNEVEN: ((2, 1), "all_to_all_single with split sizes"),
    C.BROADCAST: ((2, 1), ""),
    C.REDUCE_SCATTER_TENSOR: ((2, 6), "not in the PyTorch 2.1 table (seed 001); 2.2-2.5 undocumented"),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: ((2, 6), "not in the PyTorch 2.1 table (seed 001); 2.2-2.5 undocumented"),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: ((2, 6), "not in the PyTorch 2.1 table (seed 001); 2.2-2.5 undocumented"),
    C.SEND: ((2, 6), "send and recv in pairs; with several in one graph TorchAir needs the StableRDFS order"),
    C.RECV: ((2, 6), "send and recv in pairs; with several in one graph TorchAir needs the StableRDFS order"),
    C.MM_REDUCE_SCATTER: ((2, 1), "graph mode documented (seed 004)"),
    C.ALL_GATHER_MM: ((2, 1), "graph mode documented (manifest A4)"),
    C.MM_ALL_REDUCE: ((2, 1), "graph mode documented (manifest A4)"),
}
_GRAPH_NOTE: Final = "TorchAir converter; verified in simulation only where xccl's graph path covers it"


def _graph(eager: Mapping[Collective, Support]) -> dict[Collective, Support]:
    out: dict[Collective, Support] = {}
    for op in C:
        since = _GRAPH_SINCE.get(op)
        if since is None:
            out[op] = Support(Level.UNSUPPORTED, note="not among TorchAir's graph collectives (seeds 000/001)")
            continue
        version, remark = since
        note = f"{_GRAPH_NOTE}; {remark}" if remark else _GRAPH_NOTE
        out[op] = dataclasses.replace(eager[op], min_torch=version, note=note)
    return out


_NOTES: Final = (
    "Versions: torch_npu 2.13.0 (manifest A), TorchAir graph support by PyTorch version (seeds 000/001).",
    "HCCL reduces a bool SUM as MAX (logical or); xccl casts bool/uint8 reductions to int32 where HCCL does not.",
    "torch.distributed.gather on NPU is torch_npu's all_gather-based replacement (gotcha 12).",
    "Fused MC2 kernels: product line from get_device_name() (Ascend910B* = Atlas A2, Ascend910_93* = A3); in "
    "simulation from XCCL_SIM_ASCEND_SOC (default A2).",
    "xccl.comm_name(group) is collective on Ascend: HCCL creates the communicator on first use, so every rank of "
    "the group must call it; xccl's fused ops do.",
)


@functools.cache
def ascend_table() -> CapabilityTable:
    """The table, built once."""
    eager = _eager()
    return table_from("ascend", eager, _graph(eager), notes=_NOTES)
