"""Sophgo SCCL's capability table, from Sophgo's support table and its source (manifest section B3).

Sophgo's tutorial marks send/recv and reduce_scatter ✖ and everything else ✓. The source of
``ProcessGroupSCCL`` (torch-tpu main @ fe9b478) differs in three places, and the table follows what each op
really does:

* ``all_to_all`` ✓ in the doc, but only ``alltoall_base`` (``all_to_all_single``) is implemented; the list form
  is left to the c10d base class, which raises. -> emulated through ``all_to_all_single``.
* ``all_to_all_single`` ignores split sizes and always splits evenly: uneven splits give wrong results silently.
  -> native for even splits, emulated by padding for uneven ones.
* send/recv ✖ in the doc, but ``scclSend``/``scclRecv`` are implemented. The table follows the documentation
  (emulated through a host-side gloo group) until the native path is verified on hardware.

Reductions: SUM, PRODUCT, MIN, MAX are native; AVG is SUM then a divide; PREMUL_SUM (which SCCL refuses,
``ProcessGroupSCCL.cpp:370-371``) is a local scale then SUM. Dtypes: SCCL's eight: ``scclDataType_t`` has no
float64 (``third_party/sccl/include/sccl.h:10-27``) and ``toSCCLDtype`` raises "Invalid scalar type" for it
(``ProcessGroupSCCL.cpp:87-117``). Ops that only move bytes carry float64 exactly as int64; reductions over float64
gather its bits (as int64) and reduce them locally in rank order: exact and identical on every rank, never rounded
through float32 (DeepSpeed ZeRO-3 all_reduces its gradient norm in float64).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Final

import torch

from xccl.plugin import PORTABLE, CapabilityTable, Collective, Level, Support, table_from

__all__ = ["NATIVE_REDUCE_OPS", "SCCL_DTYPES", "sophgo_table"]

C = Collective

#: Dtypes ProcessGroupSCCL maps to SCCL types; any other raises "Invalid scalar type".
SCCL_DTYPES: Final = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}
)
#: Reduce ops SCCL implements; AVG, PREMUL_SUM and the bitwise ops raise.
NATIVE_REDUCE_OPS: Final = frozenset({"sum", "product", "min", "max"})
#: Reduce ops the all_to_all + local reduction emulation computes (bitwise ops left out: they would fail on
#: floats only after the exchange; AVG is computed directly).
_EMULATED_REDUCE_OPS: Final = NATIVE_REDUCE_OPS | {"avg"}
#: float64 moves bit-exactly as int64 (same size: the cast is a free view).
_MOVE_F64: Final = {torch.float64: torch.int64}
#: The fused ops: no vendor kernel, the portable pipelined versions.
_MM: Final = frozenset({C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE})
#: Source of every claim below.
_SOURCE: Final = "torch-tpu fe9b478 ProcessGroupSCCL"

_F64_REDUCE: Final = (
    "float64 (not in scclDataType_t, sccl.h:10-27): reduced exactly by xccl, its bits gathered as int64 and reduced "
    "locally in rank order (world size x the bytes; cheap for the scalars ZeRO-3 reduces in float64)"
)
#: The composition that reduces float64, per reducing op with a native SCCL kernel.
_F64_VIA: Final = {torch.float64: "all_gather"}
_SMALL_INT_HINT: Final = (
    "[inferred, unverified on hardware] Sophgo's DeepSpeed adaptor casts bool/int8/uint8/int64 to int32 before "
    "reduce/all_reduce, which hints that SCCL's reduction kernels may not cover those types although "
    "ProcessGroupSCCL accepts them"
)


def _moving(note: str) -> Support:
    """A native op that only moves bytes: SCCL's dtypes, float64 carried as int64."""
    return Support(Level.NATIVE, dtypes=SCCL_DTYPES, cast_to=_MOVE_F64, note=note)


def _reducing(note: str) -> Support:
    """A native reduction: SCCL's dtypes and reduce ops; float64 gathered and reduced locally."""
    return Support(
        Level.NATIVE,
        dtypes=SCCL_DTYPES,
        reduce_ops=NATIVE_REDUCE_OPS,
        dtype_via=_F64_VIA,
        note=f"{note}; AVG as SUM then a local divide; PREMUL_SUM ('Cannot use ReduceOp.PREMUL_SUM with SCCL', "
        f"ProcessGroupSCCL.cpp:370-371) as a local scale then SUM; {_F64_REDUCE}",
    )


def _reduce_scatter(via: str, note: str) -> Support:
    # Emulated entries leave dtypes open: the composition's own collectives resolve each dtype (float64 moves
    # as int64 and is reduced locally in float64, exactly).
    return Support(
        Level.EMULATED,
        via=via,
        reduce_ops=_EMULATED_REDUCE_OPS,
        dtype_reduce_ops={torch.bool: NATIVE_REDUCE_OPS},
        note=note,
    )


def _eager() -> dict[Collective, Support]:
    no_fused = "no fused kernel on Sophgo (manifest B4: no MC2 equivalent)"
    return {
        **{op: dataclasses.replace(sup, note=f"{sup.note}; {no_fused}") if op in _MM else sup
           for op, sup in PORTABLE.items()},
        C.ALL_REDUCE: _reducing(f"{_SOURCE}: allreduce"),
        C.REDUCE: _reducing(f"{_SOURCE}: reduce"),
        C.BROADCAST: _moving(f"{_SOURCE}: broadcast; float64 moved as int64"),
        C.ALL_GATHER: _moving(
            f"{_SOURCE}: allgather; every tensor of tensor_list must have the same shape (checked before "
            "communicating; unequal shapes take the fallback policy: all_gather_into_tensor_uneven of the "
            "flattened tensors); float64 moved as int64"
        ),
        C.ALL_GATHER_INTO_TENSOR: _moving(f"{_SOURCE}: _allgather_base; float64 moved as int64"),
        C.GATHER: _moving(f"{_SOURCE}: gather (non-root ranks pass no list); float64 moved as int64"),
        C.SCATTER: _moving(f"{_SOURCE}: scatter (non-root ranks pass no list); float64 moved as int64"),
        C.ALL_TO_ALL_SINGLE: _moving(
            f"{_SOURCE}: alltoall_base, even splits only (SCCL ignores split sizes); float64 moved as int64"
        ),
        C.BARRIER: Support(Level.NATIVE, note=f"{_SOURCE}: an all_reduce of one float on the device"),
        C.REDUCE_SCATTER_TENSOR: _reduce_scatter(
            "all_to_all",
            "SCCL has no ReduceScatter (no scclReduceScatter; _reduce_scatter_base is left to the c10d base "
            "class, which raises): all_to_all_single + local reduction, the bytes of a ring reduce_scatter; "
            "float64 exact (moved as int64, reduced locally)",
        ),
        C.REDUCE_SCATTER: _reduce_scatter(
            "reduce_scatter_tensor",
            "doc ✖; ProcessGroupSCCL::reduce_scatter raises 'ProcessGroupSCCL does not support reduce_scatter': "
            "inputs concatenated, then the reduce_scatter_tensor emulation",
        ),
        C.ALL_TO_ALL: Support(
            Level.EMULATED,
            via="all_to_all_single",
            note="doc ✓, but ProcessGroupSCCL implements only all_to_all_single; the list form is left to the "
            "c10d base class, which raises: concatenated, one all_to_all_single",
        ),
        C.ALL_TO_ALL_SINGLE_UNEVEN: Support(
            Level.EMULATED,
            via="padding",
            note="SCCL ignores split sizes and splits evenly (wrong results, no error): every chunk padded to "
            "the largest, one even all_to_all_single",
        ),
        C.SEND: _p2p("send"),
        C.RECV: _p2p("recv"),
        C.RECV_ANY_SOURCE: Support(
            Level.EMULATED, via="host_gloo",
            note="SCCL has no receive from any source (recvAnysource is left to the c10d base class, which raises); "
            "point-to-point goes through the host-side gloo group, which has one",
        ),
        C.ALL_REDUCE_COALESCED: Support(
            Level.EMULATED, via="all_reduce", reduce_ops=_EMULATED_REDUCE_OPS,
            note=f"{_SOURCE}: allreduce_coalesced is not overridden (the c10d base class raises): the tensors "
            "flattened into one buffer per dtype, one all_reduce each",
        ),
        C.ALL_GATHER_COALESCED: Support(
            Level.EMULATED, via="all_gather",
            note=f"{_SOURCE}: allgather_coalesced is not overridden (the c10d base class raises): one all_gather per "
            "tensor",
        ),
    }


def _p2p(op: str) -> Support:
    return Support(
        Level.EMULATED,
        via="host_gloo",
        note=f"doc ✖, but the source implements {op} (scclSend/scclRecv: one contiguous tensor, tag ignored); "
        "xccl follows the documentation and stages point-to-point through host memory over a gloo group until "
        "the native path is verified on hardware",
    )


_GRAPH_NOTE: Final = (
    "Graph mode: every op is unsupported until it has been verified to compile through xccl's graph path on "
    "simulated SCCL; Sophgo has no TorchAir equivalent (torch_tpu.dynamo is an MLIR/bmodel compiler, manifest B4)."
)


def _graph() -> dict[Collective, Support]:
    return {op: Support(Level.UNSUPPORTED, note="graph mode not verified on Sophgo yet") for op in C}


@functools.cache
def sophgo_table() -> CapabilityTable:
    """The table (built once)."""
    return table_from(
        "sophgo",
        _eager(),
        _graph(),
        notes=(
            "Sources: Sophgo's distributed tutorial (support table) and torch-tpu main @ fe9b478 "
            "(csrc/distributed/c10d/ProcessGroupSCCL); where they differ each entry says which it follows.",
            "SCCL creates and destroys a communicator for every op, and its async work handles are complete at "
            "once (the op is queued on the current TPU stream).",
            "Sophgo documents SCCL for the TPUs of one machine (单机多卡).",
            f"Reductions over bool, int8, uint8, int64: {_SMALL_INT_HINT}.",
            "Tensors must be on the tpu device (CPU tensors in simulation).",
            _GRAPH_NOTE,
        ),
    )
