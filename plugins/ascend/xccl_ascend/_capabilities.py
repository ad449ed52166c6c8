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
* torch_npu's own uneven all_gather / reduce_scatter back xccl's uneven API natively; ``all_to_all_v`` is
  emulated (all_to_all_single with the matrix's split sizes, which HCCL honours): torch_npu 2.13.0 exports no
  ``all_to_all_vc``. Where the installed build has it (the development branches v2.7.1 and v2.9.0-v2.12.0; no
  release branch), the runtime's probe makes the entry native
  (:data:`ALL_TO_ALL_VC`, ``AscendRuntime.capabilities``);
* the MC2 fused kernels back xccl's fused API; their constraints (``_constraints``) are checked per call, and a
  violation falls back to the portable version under the fallback policy.

Graph mode: what TorchAir compiles and GE takes (``_torchair``, ``_torchair_lower``). Standard collectives enter
the graph as ``_c10d_functional`` ops, which TorchAir converts from torch 2.3.1 (``min_torch`` (2, 3, 1)); xccl's
own graph ops (send/recv, the uneven and fused ops, all_to_all_v) are lowered to the ops TorchAir emits for the
same calls. The seeds' floors apply on top (send/recv, reduce_scatter_tensor and the uneven ops from 2.6), and
send/recv need CANN 8.6.0 (``min_sdk``). Reduce ops are GE's (sum, min, max, product; avg as sum then a divide);
dtypes are those the HCCL operator's IR prototype lists, the eager dtypes it lacks cast in the graph where a
conversion is exact (:func:`_ir_dtypes`); reduce, gather, scatter, barrier and the non-blocking point-to-point ops
have no graph form TorchAir converts. Each claim's source is in :data:`GRAPH_SOURCES` and the entry's note; the
simulation checks every compiled graph against TorchAir's vocabulary and GE's dtype lists.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Final

import torch

from xccl.plugin import PORTABLE, CapabilityTable, Collective, Level, Support, table_from

from . import _constraints as cons
from ._releases import Release
from ._torchair import GRAPH_P2P_CANN, vocabulary

__all__ = [
    "ALL_TO_ALL_VC", "FLOAT8_DTYPES", "GRAPH_REDUCE_OPS", "WIDE_DTYPES", "release_table", "GRAPH_SOURCES", "MOVED_DTYPES", "NO_PRODUCT_DTYPES", "REDUCED_DTYPES",
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

#: all_to_all_v on torch_npu 2.13.0: no all_to_all_vc in that release.
_ALL_TO_ALL_V: Final = Support(
    Level.EMULATED, via="all_to_all_single",
    note="torch_npu 2.13.0 exports no torch_npu.distributed.all_to_all_vc (Ascend/pytorch@462f4e1 "
    "torch_npu/distributed/__init__.py:1-3,28-33; the same at 94c0533 and 46936d1): all_to_all_single with the "
    "matrix's split sizes, which HCCL honours. The runtime probes the installed torch_npu and uses all_to_all_vc "
    "where it exists (builds of the development branches v2.7.1 and v2.9.0-v2.12.0, not their release wheels: Ascend/pytorch@a63ae3a torch_npu/distributed/__init__.py:2,29); "
    "xccl.capabilities() after xccl.init and xccl doctor show which",
)
#: all_to_all_v where the installed torch_npu exports all_to_all_vc (the runtime's probe found it).
ALL_TO_ALL_VC: Final = dataclasses.replace(
    _MOVING, note="torch_npu.distributed.all_to_all_vc, found in the installed torch_npu by the runtime's probe "
    "(count matrix the same on every rank; no in-place; Ascend/pytorch@a63ae3a torch_npu/distributed/__init__.py:2,29)",
)


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
        C.ALL_TO_ALL_V: _ALL_TO_ALL_V,
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
    since: tuple[int, ...]
    #: How it reaches GE: xccl's graph form, what TorchAir converts it with.
    form: str
    sources: tuple[str, ...]
    #: The HCCL operator it becomes and the IR input (or output) that carries its data: the dtypes of the entry
    #: are what that operator's IR prototype lists (TorchAir passes dtypes through, GE checks them).
    ir: tuple[str, str] | None = None
    #: Oldest CANN that runs it in a graph.
    min_sdk: tuple[str, str] | None = None


def _standard(since: tuple[int, ...], form: str, ir: tuple[str, str], *sources: str) -> _GraphClaim:
    return _GraphClaim(since, form, (*sources, _GATE, "seed 000 table 1"), ir)


_V231: Final = (2, 3, 1)
_A2A: Final = (f"{_TA}_utils/__init__.py:463 (default decomposition of _c10d_functional.all_to_all_single)",
               f"{_GC}experimental/hcom_alltoall.py:69 (npu_define.all_to_all_single_npu -> HcomAllToAll/AllToAllV)")
_A2A_IR: Final = ("HcomAllToAllV", "input send_data")  # HcomAllToAll (even splits, CANN >= 8.2.RC1): the same list
_AR: Final = ("HcomAllReduce", "input x")
_AG: Final = ("HcomAllGather", "input x")
_RS: Final = ("HcomReduceScatter", "input x")
_P2P_CANN: Final = f"{_TA}npu_fx_compiler.py:846-851 (_process_send_recv: CANN >= 8.6.0, below it only a logged error)"
_NO_ISEND: Final = (
    "isend/irecv are not graph ops here: TorchAir has none (no isend/irecv anywhere in its source), and its "
    "HcomSend/HcomReceive run in program order and block, so a symmetric isend/irecv exchange lowered to them "
    "would deadlock; the graph form raises UnsupportedCollective while tracing: use send/recv"
)
_GRAPH_CLAIMS: Final[Mapping[Collective, _GraphClaim]] = {
    C.ALL_REDUCE: _standard(_V231, "_c10d_functional.all_reduce -> HcomAllReduce", _AR, f"{_C10D}:83", _REDUCE_SOURCE),
    C.ALL_REDUCE_COALESCED: _standard(
        _V231, "one _c10d_functional.all_reduce per tensor -> HcomAllReduce", _AR, f"{_C10D}:83", _REDUCE_SOURCE),
    C.ALL_GATHER: _standard(_V231, "_c10d_functional.all_gather_into_tensor, sliced -> HcomAllGather", _AG,
                            f"{_C10D}:98"),
    C.ALL_GATHER_COALESCED: _standard(
        _V231, "one _c10d_functional.all_gather_into_tensor per tensor -> HcomAllGather", _AG, f"{_C10D}:98"),
    C.ALL_GATHER_INTO_TENSOR: _standard(_V231, "_c10d_functional.all_gather_into_tensor -> HcomAllGather", _AG,
                                        f"{_C10D}:98"),
    C.REDUCE_SCATTER: _standard(
        (2, 6), "_c10d_functional.reduce_scatter_tensor over the concatenated list -> HcomReduceScatter", _RS,
        f"{_C10D}:113", _REDUCE_SOURCE, _SEED_2_6),
    C.REDUCE_SCATTER_TENSOR: _standard((2, 6), "_c10d_functional.reduce_scatter_tensor -> HcomReduceScatter", _RS,
                                       f"{_C10D}:113", _REDUCE_SOURCE, _SEED_2_6),
    C.ALL_TO_ALL: _standard(_V231, "_c10d_functional.all_to_all_single over the concatenated list", _A2A_IR, *_A2A),
    C.ALL_TO_ALL_SINGLE: _standard(_V231, "_c10d_functional.all_to_all_single", _A2A_IR, *_A2A),
    C.ALL_TO_ALL_SINGLE_UNEVEN: _standard(_V231, "_c10d_functional.all_to_all_single with split sizes", _A2A_IR,
                                          *_A2A),
    C.ALL_TO_ALL_V: _standard(
        _V231, "xccl::all_to_all_v lowered to _c10d_functional.all_to_all_single with this rank's counts", _A2A_IR,
        *_A2A),
    C.BROADCAST: _standard(_V231, "_c10d_functional.broadcast -> HcomBroadcast", ("_HcomBroadcast", "input x"),
                           f"{_C10D}:130"),
    C.SEND: _GraphClaim((2, 6), "xccl::send lowered to npu_define._send -> HcomSend", (
        f"{_GC}experimental/hcom_send_recv.py:51", _P2P_CANN, _SEED_2_6,
        "seed 000 note: send and recv in pairs; several in one graph need the StableRDFS order (xccl sets it)"),
        ("HcomSend", "input x"), ("CANN", GRAPH_P2P_CANN)),
    C.RECV: _GraphClaim((2, 6), "xccl::recv lowered to npu_define._recv -> HcomReceive", (
        f"{_GC}experimental/hcom_send_recv.py:125", _P2P_CANN, _SEED_2_6,
        "seed 000 note: send and recv in pairs; several in one graph need the StableRDFS order (xccl sets it)"),
        ("HcomReceive", "output y"), ("CANN", GRAPH_P2P_CANN)),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: _GraphClaim(
        (2, 6), "xccl::all_gather_into_tensor_uneven lowered to npu_define.allgather_in_tensor_uneven -> HcomAllGatherV",
        (f"{_GC}experimental/hcom_allgather.py:155", _SEED_2_6), ("HcomAllGatherV", "input x")),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: _GraphClaim(
        (2, 6), "xccl::reduce_scatter_tensor_uneven lowered to npu_define.reduce_scatter_tensor_uneven -> "
        "HcomReduceScatterV", (f"{_GC}experimental/hcom_reducescatter.py:81", _REDUCE_SOURCE, _SEED_2_6),
        ("HcomReduceScatterV", "input x")),
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
#: What a moved dtype travels as where the IR prototype lacks it: a dtype it converts to and back exactly (TorchAir
#: has no converter for a bit-cast view, ``aten.view.dtype``, so the graph converts): bool as uint8 (the same
#: bytes), a float as the narrowest wider float the prototype lists (bfloat16 as float32, float8 as float16: twice
#: the bytes on the wire).
_MOVE_AS: Final = (torch.uint8, torch.float16, torch.float32, torch.float64)


def _move_cast(dtype: torch.dtype, listed: frozenset[torch.dtype]) -> torch.dtype | None:
    for target in _MOVE_AS:
        if target in listed and (dtype == torch.bool if target == torch.uint8 else
                                 dtype.is_floating_point and target.itemsize > dtype.itemsize):
            return target
    return None

#: How a reduction takes a dtype the IR prototype lacks: bool and uint8 as int32, as eager mode casts them (a bool
#: sum is then a max: logical or); bfloat16 through float32 (exact on the way in, one rounding on the way back, twice
#: the bytes on the wire; a reduction in float32 is at least as accurate as HCCL's in bfloat16). int64 has no exact
#: cast, so it is refused rather than silently narrowed.
GRAPH_REDUCE_CASTS: Final[Mapping[torch.dtype, torch.dtype]] = {
    torch.bool: torch.int32, torch.uint8: torch.int32, torch.bfloat16: torch.float32,
}


def _names(dtypes: Any) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def _ir_dtypes(op: Collective, claim: _GraphClaim, eager: Support) -> Support:
    """The graph entry of an HCCL collective: the dtypes of its operator's IR prototype, casts for the rest."""
    v = vocabulary()  # 150 kB of JSON, read when the table is first built
    ge, io = claim.ir  # type: ignore[misc]
    listed = v.dtypes_of(ge, io)
    where = f"{ge}'s IR prototype [{v.cite_ir(ge)}]"
    if op.reduces:
        wanted = REDUCED_DTYPES | frozenset(_CAST)
        dtypes = listed & REDUCED_DTYPES
        casts = {d: c for d, c in GRAPH_REDUCE_CASTS.items() if d in wanted - dtypes and c in dtypes}  # in order
        how = "converted, and back; a bool sum is a logical or"
    else:
        wanted = eager.dtypes if eager.dtypes is not None else MOVED_DTYPES
        dtypes = listed & wanted
        casts = {d: c for d in sorted(wanted - dtypes, key=str) if (c := _move_cast(d, dtypes)) is not None}
        how = "converted exactly, and back"
    refused = wanted - dtypes - set(casts)
    note = f"dtypes: {where}"
    if casts:
        moved = ", ".join(f"{_names([d])} as {_names([c])}" for d, c in sorted(casts.items(), key=str))
        note += f"; the graph casts {moved} ({how})"
    if refused:
        note += f"; refused: {_names(refused)} (not in the prototype, no exact cast)"
    reduce_ops = GRAPH_REDUCE_OPS if op.reduces else None
    return Support(
        Level.NATIVE, dtypes=dtypes, reduce_ops=reduce_ops, cast_to=casts,
        dtype_reduce_ops={d: GRAPH_REDUCE_OPS - {"product"} for d in NO_PRODUCT_DTYPES & dtypes} if op.reduces else {},
        world_sizes=eager.world_sizes, min_torch=claim.since, min_sdk=claim.min_sdk, note=note,
    )


def _graph(eager: Mapping[Collective, Support]) -> dict[Collective, Support]:
    """The graph column: what TorchAir converts and GE takes.

    Each HCCL collective takes the dtypes its GE operator's IR prototype lists (the prototypes TorchAir bundles,
    ``auto_generated_ge_raw_ops.py``): the eager dtypes it lacks travel cast where a cast is exact (the graph form
    casts, ``xccl.graph._layers``), and are refused otherwise. Reductions take :data:`GRAPH_REDUCE_OPS` (avg runs
    as sum then a divide, in the graph). Send and receive need CANN 8.6.0 (``min_sdk``).
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
        if claim.ir is None:  # the MC2 operators: their own checks
            out[op] = dataclasses.replace(
                e, min_torch=claim.since,
                note=f"{note}; the MC2 constraints are checked at compile time: where they fail the graph gets the "
                "unfused matmul and collective (a GE graph cannot fall back at run time), under the fallback policy",
            )
            continue
        entry = _ir_dtypes(op, claim, e)
        extra = [f"GE reduces sum/min/max/product ({_REDUCE_SOURCE}), avg as sum then a divide in the graph; no "
                 "product over int16 (CANN)"] if op.reduces else []
        if claim.min_sdk is not None:
            extra.append(f"CANN >= {claim.min_sdk[1]} [{_P2P_CANN}]; {_NO_ISEND}")
        out[op] = dataclasses.replace(entry, note="; ".join([note, entry.note, *extra]))
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


#: The dtypes torch_npu's dtype map gained in its 26.0.0 line (2.7.1/2.8.0 before ``.post4`` lack them).
WIDE_DTYPES: Final = frozenset({torch.uint16, torch.uint32, torch.uint64}) | FLOAT8_DTYPES


def release_table(table: CapabilityTable, npu: Release) -> CapabilityTable:
    """``table`` as the torch_npu release ``npu`` runs it: without PREMUL_SUM (xccl runs it as a local scale then a
    sum) and the wide dtypes where that release's HCCL maps have none (``_releases``)."""
    if npu.premul_sum and npu.wide_dtypes:
        return table
    gone = frozenset() if npu.wide_dtypes else WIDE_DTYPES
    ops = set() if npu.premul_sum else {"premul_sum"}
    why = f"torch_npu {npu.version} ({npu.source})"

    def fewer(sup: Support) -> Support:
        if sup.level is Level.UNSUPPORTED:
            return sup
        return dataclasses.replace(
            sup, dtypes=None if sup.dtypes is None else sup.dtypes - gone,
            reduce_ops=None if sup.reduce_ops is None else sup.reduce_ops - ops,
            dtype_reduce_ops={d: o - ops for d, o in sup.dtype_reduce_ops.items() if d not in gone},
            note=f"{sup.note}; {why}" if sup.note else why)

    return table.with_entries({key: fewer(sup) for key, sup in table.items()})
