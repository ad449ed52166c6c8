"""Ascend's capability table: HCCL through torch_npu 2.13.0 (manifest A2-A5) and TorchAir (seeds 000/001).

Eager mode (manifest A3, ``ProcessGroupHCCL.cpp``):

* every standard collective is a C++ override of ProcessGroupHCCL, so all are native; ``recvAnysource`` is not;
* dtypes: HCCL moves bool, uint8, int8, int16, int32, int64, float16, float32, float64, bfloat16, uint16, uint32,
  uint64, float8_e4m3fn and float8_e5m2 (its dtype map, torch_npu 2.13; CANN documents float8 on Atlas 350 /
  Ascend 950 only, and the simulation refuses it on other chips); it *reduces* only int8/16/32/64, float16,
  float32 and bfloat16 (``checkSupportedDataType``), and ``product`` not over int16 or bfloat16 (CANN's
  HcclAllReduce / HcclReduceScatter pages, A2 and A3: refused here, HCCL fails inside at run time). all_reduce
  casts bool and uint8 to int32 itself; the other reductions get the same cast from xccl (bool as max/min, which
  is or/and, uint8 wrapping like uint8 arithmetic). float64 moves (``HCCLUtils.cpp:63``) but is not reduced
  (``checkSupportedDataType``, ``ProcessGroupHCCL.cpp:173-186``, torch_npu 2.13.0 @ 462f4e1; CANN reduces it on
  Ascend 950 only): xccl reduces it exactly, its bits gathered (or exchanged, for reduce_scatter) and reduced
  locally in rank order, identical on every rank (``Support.dtype_via``);
* reduce ops: sum, product, min, max; avg is done by HCCL as sum then a divide, on floats only (the divide is an
  in-place true division, which integer tensors refuse), integers get xccl's sum + truncating divide;
  premul_sum on floats only; band/bor/bxor raise "Cannot use ReduceOp.BAND with HCCL";
* ``torch.distributed.gather`` is replaced by torch_npu (gotcha 12) with an all_gather plus a
  ``broadcast_object_list``: xccl calls the c10d op, so on Ascend a gather moves the whole gathered tensor to every
  rank (world size times the bytes of a true gather) unless the compatible implementation is enabled on 910B/910_93;
* torch_npu's own uneven all_gather / reduce_scatter and ``all_to_all_vc`` back xccl's uneven API natively;
* the MC2 fused kernels back xccl's fused API; their constraints (``_constraints``) are checked per call, and a
  violation falls back to the portable version under the fallback policy.

Graph mode: what TorchAir compiles (``_torchair``, ``_torchair_lower``). Standard collectives enter the graph as
``_c10d_functional`` ops, which TorchAir converts from torch 2.3.1 (``min_torch`` (2, 3)); xccl's own graph ops
(send/recv, the uneven and fused ops, all_to_all_v, the order join) are lowered to the ops TorchAir emits for the
same calls. The seeds' floors apply on top (send/recv, reduce_scatter_tensor and the uneven ops from 2.6). Reduce
ops are GE's (sum, min, max, product; avg as sum then a divide); reduce, gather, scatter, barrier and the
non-blocking point-to-point ops have no graph form TorchAir converts. Each claim's source is in
:data:`GRAPH_SOURCES`; the simulation checks every compiled graph against TorchAir's vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Final

import torch

from xccl.plugin import PORTABLE, CapabilityTable, Collective, Level, Support, table_from

from . import _constraints as cons

__all__ = [
    "FLOAT8_DTYPES", "GRAPH_REDUCE_OPS", "GRAPH_SOURCES", "MOVED_DTYPES", "NO_PRODUCT_DTYPES", "REDUCED_DTYPES",
    "TORCHAIR_COMMIT", "ascend_table",
]

C = Collective
#: Every dtype HCCL carries (``kScalarTypeToHcclDataType``); bool travels as uint8.
MOVED_DTYPES: Final = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.bfloat16,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
})
#: Dtypes CANN moves on Atlas 350 (Ascend 950) only (HcclAllGather / HcclBroadcast pages).
FLOAT8_DTYPES: Final = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
#: Reduced dtypes HCCL's ``prod`` refuses on Atlas A2 and A3 (HcclAllReduce / HcclReduceScatter pages).
NO_PRODUCT_DTYPES: Final = frozenset({torch.int16, torch.bfloat16})
#: Dtypes HCCL reduces (``checkSupportedDataType``).
REDUCED_DTYPES: Final = frozenset({
    torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16,
})
_FLOATS: Final = (torch.float16, torch.float32, torch.bfloat16)
_BASE_OPS: Final = frozenset({"sum", "product", "min", "max"})
_FLOAT_OPS: Final = _BASE_OPS | {"avg", "premul_sum"}
_CAST: Final[Mapping[torch.dtype, torch.dtype]] = {torch.bool: torch.int32, torch.uint8: torch.int32}

_REDUCING_NOTE: Final = (
    "reduces int8/16/32/64, float16/32, bfloat16; bool and uint8 through an int32 cast (bool sum = or); float64 is "
    "moved but not reduced by HCCL (checkSupportedDataType, ProcessGroupHCCL.cpp:173-186 @ 462f4e1): xccl reduces "
    "it exactly, locally in rank order, after exchanging its bits; avg (sum then divide) and premul_sum on floats only; no product over int16 or bfloat16 (CANN: 'prod' "
    "does not support int16, bfp16 on Atlas A2/A3; cast to int32 / float32 first); band/bor/bxor: 'Cannot use "
    "ReduceOp.BAND with HCCL'"
)


def _reducing(via64: str, *, native_cast: bool = False, float_ops: frozenset[str] = _FLOAT_OPS,
              note: str = _REDUCING_NOTE) -> Support:
    """A native HCCL reduction; float64 runs as the composition ``via64`` (its bits exchanged, reduced locally)."""
    dtypes = REDUCED_DTYPES | (frozenset(_CAST) if native_cast else frozenset())
    return Support(
        Level.NATIVE,
        dtypes=dtypes,
        reduce_ops=_BASE_OPS,
        dtype_reduce_ops={d: float_ops for d in _FLOATS}
        | {d: (float_ops if d.is_floating_point else _BASE_OPS) - {"product"} for d in NO_PRODUCT_DTYPES},
        cast_to={} if native_cast else _CAST,
        dtype_via={torch.float64: via64},
        note=note,
    )


_MOVING: Final = Support(Level.NATIVE, dtypes=MOVED_DTYPES)


def _fused(op: str) -> Support:
    """An MC2 kernel: its documented constraints (``_constraints.RULES``) are checked per call."""
    kernel = cons.KERNELS[op]
    return Support(
        Level.NATIVE,
        note=f"torch_npu.{kernel}; constraints checked per call: {cons.describe(kernel)}; a violation falls back "
        "to the portable version under the fallback policy",
    )


def _eager() -> dict[Collective, Support]:
    return {op: _MOVING for op in C} | {
        C.ALL_REDUCE: _reducing("all_gather", native_cast=True,
                                note=_REDUCING_NOTE + "; all_reduce casts bool/uint8 itself"),
        C.ALL_REDUCE_COALESCED: _reducing("all_reduce", note="ProcessGroupHCCL::allreduce_coalesced; " + _REDUCING_NOTE),
        C.ALL_GATHER_COALESCED: Support(
            Level.EMULATED, via="all_gather",
            note="ProcessGroupHCCL does not override allgather_coalesced (the c10d base class raises): one "
            "all_gather per tensor",
        ),
        C.RECV_ANY_SOURCE: Support(
            Level.UNSUPPORTED,
            note="ProcessGroupHCCL::recvAnysource raises 'ProcessGroupHCCL does not support recv'; pass src",
        ),
        C.REDUCE: _reducing("all_gather"),
        C.REDUCE_SCATTER: _reducing("reduce_scatter_tensor"),
        C.REDUCE_SCATTER_TENSOR: _reducing("all_to_all"),
        C.REDUCE_SCATTER_TENSOR_UNEVEN: _reducing(
            "all_to_all_single", float_ops=_BASE_OPS,
            note="torch_npu.distributed.reduce_scatter_tensor_uneven; sum/product/min/max (avg through xccl's sum "
            "then divide); same dtypes as reduce_scatter; no product over int16 or bfloat16 (CANN)",
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
        # HCCL has no monitoredBarrier (the c10d base class raises): xccl's, over HCCL's send/recv.
        C.MONITORED_BARRIER: PORTABLE[C.MONITORED_BARRIER],
        C.MM_REDUCE_SCATTER: _fused("mm_reduce_scatter"),
        C.ALL_GATHER_MM: _fused("all_gather_mm"),
        C.MM_ALL_REDUCE: _fused("mm_all_reduce"),
    }


# ------------------------------------------------------------------------------------------------ graph column
# What compiles on TorchAir. Every claim cites the TorchAir source that converts its graph form (at the commit the
# plugin's vocabulary was derived from, torchair_vocabulary.json) and the seed that documents it; the tests check
# each cited converter against the vocabulary.

#: The TorchAir commit the graph column was checked against (the vocabulary's).
TORCHAIR_COMMIT: Final = "fced8842d149f16b587c2c867d427e4b766831ca"
_TA: Final = f"Ascend/torchair@{TORCHAIR_COMMIT[:12]} python/torchair/"
_GC: Final = f"{_TA}_ge_concrete_graph/ge_converter/"
_C10D: Final = f"{_GC}c10d_functional/c10d_functional.py"
#: TorchAir's ``normalize_reduceop_type``: its GE collectives take SUM, MIN, MAX and PRODUCT; avg and premul_sum
#: raise "ge unsupported reduce type". The graph column says so instead of copying the eager reduce ops.
GRAPH_REDUCE_OPS: Final = frozenset({"sum", "min", "max", "product"})
_REDUCE_SOURCE: Final = f"{_TA}_ge_concrete_graph/utils.py:179-196 (normalize_reduceop_type)"
_GATE: Final = f"{_C10D}:73 (the _c10d_functional converters exist only if torch.__version__ >= '2.3.1')"
_SEED_2_6: Final = "seed 000 (PyTorch >= 2.6 table); absent from seed 001 (PyTorch 2.1); 2.2-2.5 undocumented"


@dataclasses.dataclass(frozen=True)
class _GraphClaim:
    since: tuple[int, int]
    #: How it reaches GE: xccl's graph form, what TorchAir converts it with.
    form: str
    sources: tuple[str, ...]


def _standard(since: tuple[int, int], form: str, *sources: str) -> _GraphClaim:
    return _GraphClaim(since, form, (*sources, _GATE, "seed 000 table 1"))


_A2A: Final = (f"{_TA}_utils/__init__.py:463 (default decomposition of _c10d_functional.all_to_all_single)",
               f"{_GC}experimental/hcom_alltoall.py:69 (npu_define.all_to_all_single_npu -> HcomAllToAll/AllToAllV)")
_GRAPH_CLAIMS: Final[Mapping[Collective, _GraphClaim]] = {
    C.ALL_REDUCE: _standard((2, 3), "_c10d_functional.all_reduce -> HcomAllReduce", f"{_C10D}:83", _REDUCE_SOURCE),
    C.ALL_REDUCE_COALESCED: _standard(
        (2, 3), "one _c10d_functional.all_reduce per tensor -> HcomAllReduce", f"{_C10D}:83", _REDUCE_SOURCE),
    C.ALL_GATHER: _standard((2, 3), "_c10d_functional.all_gather_into_tensor, sliced -> HcomAllGather", f"{_C10D}:98"),
    C.ALL_GATHER_COALESCED: _standard(
        (2, 3), "one _c10d_functional.all_gather_into_tensor per tensor -> HcomAllGather", f"{_C10D}:98"),
    C.ALL_GATHER_INTO_TENSOR: _standard((2, 3), "_c10d_functional.all_gather_into_tensor -> HcomAllGather",
                                        f"{_C10D}:98"),
    C.REDUCE_SCATTER: _standard(
        (2, 6), "_c10d_functional.reduce_scatter_tensor over the concatenated list -> HcomReduceScatter",
        f"{_C10D}:113", _REDUCE_SOURCE, _SEED_2_6),
    C.REDUCE_SCATTER_TENSOR: _standard((2, 6), "_c10d_functional.reduce_scatter_tensor -> HcomReduceScatter",
                                       f"{_C10D}:113", _REDUCE_SOURCE, _SEED_2_6),
    C.ALL_TO_ALL: _standard((2, 3), "_c10d_functional.all_to_all_single over the concatenated list", *_A2A),
    C.ALL_TO_ALL_SINGLE: _standard((2, 3), "_c10d_functional.all_to_all_single", *_A2A),
    C.ALL_TO_ALL_SINGLE_UNEVEN: _standard((2, 3), "_c10d_functional.all_to_all_single with split sizes", *_A2A),
    C.ALL_TO_ALL_V: _standard(
        (2, 3), "xccl::all_to_all_v lowered to _c10d_functional.all_to_all_single with this rank's counts", *_A2A),
    C.BROADCAST: _standard((2, 3), "_c10d_functional.broadcast -> HcomBroadcast", f"{_C10D}:130"),
    C.SEND: _GraphClaim((2, 6), "xccl::send lowered to npu_define._send -> HcomSend", (
        f"{_GC}experimental/hcom_send_recv.py:51", _SEED_2_6,
        "seed 000 note: send and recv in pairs; several in one graph need the StableRDFS order (xccl sets it)")),
    C.RECV: _GraphClaim((2, 6), "xccl::recv lowered to npu_define._recv -> HcomReceive", (
        f"{_GC}experimental/hcom_send_recv.py:125", _SEED_2_6,
        "seed 000 note: send and recv in pairs; several in one graph need the StableRDFS order (xccl sets it)")),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: _GraphClaim(
        (2, 6), "xccl::all_gather_into_tensor_uneven lowered to npu_define.allgather_in_tensor_uneven -> HcomAllGatherV",
        (f"{_GC}experimental/hcom_allgather.py:155", _SEED_2_6)),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: _GraphClaim(
        (2, 6), "xccl::reduce_scatter_tensor_uneven lowered to npu_define.reduce_scatter_tensor_uneven -> "
        "HcomReduceScatterV", (f"{_GC}experimental/hcom_reducescatter.py:81", _REDUCE_SOURCE, _SEED_2_6)),
    C.MM_REDUCE_SCATTER: _GraphClaim(
        (2, 1), "xccl::mm_reduce_scatter lowered to npu.npu_mm_reduce_scatter_base -> MatmulReduceScatter",
        (f"{_GC}custom/matmul_reduce_scatter.py:4", "seed 004 (graph mode documented)")),
    C.ALL_GATHER_MM: _GraphClaim(
        (2, 1), "xccl::all_gather_mm lowered to npu.npu_all_gather_base_mm -> AllGatherMatmul",
        (f"{_GC}custom/all_gather_matmul.py:4", "manifest A4 (graph mode documented)")),
    C.MM_ALL_REDUCE: _GraphClaim(
        (2, 1), "xccl::mm_all_reduce lowered to npu.npu_mm_all_reduce_base -> MatmulAllReduce",
        (f"{_GC}custom/matmul_all_reduce.py:21", "manifest A4 (graph mode documented)")),
}
#: Why the rest is unsupported in graph mode (each with its source).
_GRAPH_UNSUPPORTED: Final[Mapping[Collective, tuple[str, str]]] = {
    op: ("TorchAir has no graph op for it: no converter in its vocabulary for xccl's graph form "
         f"(torch.ops.xccl.{op.value}) nor an HCCL graph op to lower it to; TorchAir's collective list does not "
         "have it", f"seed 000 table 1; {_TA} (torchair_vocabulary.json)")
    for op in (C.REDUCE, C.GATHER, C.SCATTER, C.BARRIER)
} | {
    C.RECV_ANY_SOURCE: ("a graph needs the peer (and HCCL has no receive from any source)",
                        f"{_GC}experimental/hcom_send_recv.py:125 (HcomReceive takes src_rank)"),
}
#: Where each graph-column claim comes from: op -> sources (repository@commit path:line, or a seed).
GRAPH_SOURCES: Final[Mapping[Collective, tuple[str, ...]]] = {
    **{op: claim.sources for op, claim in _GRAPH_CLAIMS.items()},
    **{op: (source,) for op, (_, source) in _GRAPH_UNSUPPORTED.items()},
}


def _graph(eager: Mapping[Collective, Support]) -> dict[Collective, Support]:
    """The graph column: what TorchAir converts, with GE's reduce ops and no eager-only casts.

    Reductions take :data:`GRAPH_REDUCE_OPS` (avg then runs as sum and a divide, the table's rule, which the
    plugin's graph converters apply) over the dtypes HCCL reduces: the bool/uint8 -> int32 casts of eager mode are
    done by torch_npu's and xccl's eager code, which a GE graph does not run. Other ops keep the eager dtypes
    (TorchAir's bundled IR prototypes list fewer, e.g. no bfloat16 for HcomAllGather: unconfirmed against current
    CANN, see docs/vendors/ascend.md).
    """
    out: dict[Collective, Support] = {}
    for op in C:
        claim = _GRAPH_CLAIMS.get(op)
        if claim is None:
            why, source = _GRAPH_UNSUPPORTED.get(op, ("not among TorchAir's graph collectives", "seed 000 table 1"))
            out[op] = Support(Level.UNSUPPORTED, note=f"{why} [{source}]")
            continue
        note = f"graph: {claim.form} [{claim.sources[0]}]"
        e = eager[op]
        if op in (C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE):
            out[op] = dataclasses.replace(
                e, min_torch=claim.since,
                note=f"{note}; the MC2 constraints are checked at compile time: where they fail the graph gets the "
                "unfused matmul and collective (a GE graph cannot fall back at run time), under the fallback policy",
            )
        elif op.reduces:
            out[op] = Support(
                Level.NATIVE, dtypes=REDUCED_DTYPES, reduce_ops=GRAPH_REDUCE_OPS,
                dtype_reduce_ops={d: GRAPH_REDUCE_OPS - {"product"} for d in NO_PRODUCT_DTYPES},
                world_sizes=e.world_sizes, min_torch=claim.since,
                note=f"{note}; GE reduces sum/min/max/product ({_REDUCE_SOURCE}), avg as sum then a divide; no "
                "bool/uint8 (their int32 cast is eager-only); no product over int16/bfloat16 (CANN)",
            )
        else:
            out[op] = Support(Level.NATIVE, dtypes=e.dtypes if e.level is Level.NATIVE else MOVED_DTYPES,
                              world_sizes=e.world_sizes, min_torch=claim.since, note=note)
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
