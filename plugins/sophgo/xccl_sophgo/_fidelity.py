"""Where each of the plugin's claims about Sophgo comes from, and whether the simulation enforces it.

``scripts/gen_fidelity.py`` renders this into ``docs/fidelity.md``: a row for every capability-table entry (sources
from :data:`ENTRY_SOURCES`) and one for every claim of :data:`CLAIMS`. Sophgo's repository is cited at the commit
it was read at (sophgo/torch-tpu main @ fe9b478); "manifest" is ``shared/vendor-api/MANIFEST.md`` section B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from xccl.plugin import Collective, Mode

__all__ = ["CLAIMS", "ENTRY_SOURCES", "SUMMARY", "Claim"]

#: What the sources are, for the ledger's section.
SUMMARY: Final = (
    "Sophgo's torch-tpu is cited at main fe9b478: ProcessGroupSCCL's source, torch_tpu/tpu/utils.py and the tutorial "
    "(docs/quick_start/source_zh/03_Tutorial.rst); the C2C check and ring are in the closed libtpudnn."
)

C = Collective
_TT: Final = "sophgo/torch-tpu@fe9b478 "
PG: Final = _TT + "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.cpp"
OVERRIDES: Final = _TT + "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.hpp:75-142 (the methods it overrides)"
TUTORIAL: Final = _TT + "docs/quick_start/source_zh/03_Tutorial.rst"
SUPPORT_TABLE: Final = f"{TUTORIAL}:18-45 (SCCL support table)"
UTILS: Final = _TT + "torch_tpu/tpu/utils.py"
DTYPES: Final = f"{PG}:87-116 (toSCCLDtype)"
REDUCE_OPS: Final = f"{PG}:345-370 (toSCCLReduceOp)"
C_API: Final = "manifest B3 (third_party/sccl/include/sccl.h: no ReduceScatter)"
TORCH_MONITORED: Final = ("torch 2.13 torch/distributed/distributed_c10d.py:5418-5419 (monitored_barrier: 'only "
                          "implemented for GLOO backend')")
NO_FUSED: Final = "manifest B4 (no MC2 equivalent; torch_tpu.dynamo is an MLIR/bmodel compiler, no TorchAir)"


@final
@dataclass(frozen=True, slots=True)
class Claim:
    """One claim about the vendor that xccl relies on."""

    #: What it is about, e.g. ``"chip map: ring"``.
    topic: str
    #: What xccl holds to be true.
    claim: str
    #: Where it is written (repository@commit path:lines, manifest section, inference).
    sources: tuple[str, ...]
    #: How xccl enforces it: "checked", "simulated", "not simulated", with detail.
    simulation: str


def _pg(method: str, line: int) -> str:
    return f"{PG}:{line} (ProcessGroupSCCL::{method})"


_EAGER: Final[Mapping[Collective, tuple[str, ...]]] = {
    C.ALL_REDUCE: (_pg("allreduce", 383), DTYPES, REDUCE_OPS, SUPPORT_TABLE),
    C.ALL_REDUCE_COALESCED: (OVERRIDES,),
    C.ALL_GATHER: (_pg("allgather", 468), "manifest B3 (the list version needs equal sizes)", SUPPORT_TABLE),
    C.ALL_GATHER_COALESCED: (OVERRIDES,),
    C.ALL_GATHER_INTO_TENSOR: (_pg("_allgather_base", 544), SUPPORT_TABLE),
    C.REDUCE_SCATTER: (f"{PG}:708-712 (reduce_scatter raises)", SUPPORT_TABLE, C_API),
    C.REDUCE_SCATTER_TENSOR: (OVERRIDES, C_API),
    C.ALL_TO_ALL: (OVERRIDES, SUPPORT_TABLE),
    C.ALL_TO_ALL_SINGLE: (f"{PG}:714-743 (alltoall_base: counts unused, output.numel() split evenly)",),
    C.ALL_TO_ALL_SINGLE_UNEVEN: (f"{PG}:714-743 (alltoall_base ignores outputCounts/inputCounts)",),
    C.BROADCAST: (_pg("broadcast", 319), SUPPORT_TABLE),
    C.REDUCE: (_pg("reduce", 424), REDUCE_OPS, SUPPORT_TABLE),
    C.GATHER: (_pg("gather", 576), SUPPORT_TABLE),
    C.SCATTER: (_pg("scatter", 645), SUPPORT_TABLE),
    C.BARRIER: (_pg("barrier", 746), SUPPORT_TABLE),
    # Not among ProcessGroupSCCL's overrides (only ProcessGroupSCCLHost has one, :1716); torch itself refuses
    # monitored_barrier on any backend but gloo: xccl's runs over the rendezvous store.
    C.MONITORED_BARRIER: (OVERRIDES, TORCH_MONITORED),
    C.SEND: (_pg("send", 263), SUPPORT_TABLE),
    C.RECV: (_pg("recv", 291), SUPPORT_TABLE),
    C.RECV_ANY_SOURCE: (OVERRIDES,),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: (OVERRIDES, C_API),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: (OVERRIDES, C_API),
    C.ALL_TO_ALL_V: (OVERRIDES, C_API),
    C.MM_REDUCE_SCATTER: (NO_FUSED,),
    C.ALL_GATHER_MM: (NO_FUSED,),
    C.MM_ALL_REDUCE: (NO_FUSED,),
}

#: Sources of every entry: the eager column from Sophgo's source and tutorial; the graph column is unsupported
#: because Sophgo has no TorchAir-like converter layer and xccl's graph path is not verified on simulated SCCL.
ENTRY_SOURCES: Final[Mapping[tuple[Collective, Mode], tuple[str, ...]]] = {
    **{(op, Mode.EAGER): srcs for op, srcs in _EAGER.items()},
    **{(op, Mode.GRAPH): (NO_FUSED,) for op in Collective},
}

_SIM: Final = "simulated: ProcessGroupSCCL's profile (xccl_sophgo._simulation) raises what SCCL raises"
_RING: Final = ("checked before the process group exists (xccl_sophgo._chipmap): on the hardware torch_tpu decides, "
                "in simulation the documented SG2260 board (xccl_sophgo._c2c)")

#: Claims beyond the table's entries.
CLAIMS: Final[tuple[Claim, ...]] = (
    Claim("dtypes", "float32, float16, bfloat16, int8, uint8, int32, int64, bool; any other raises 'Invalid scalar "
          "type' (float64 moves as int64 through xccl)", (DTYPES,), _SIM),
    Claim("reduce ops", "sum, product, min, max; band/bor/bxor raise 'Cannot use ReduceOp.BAND with SCCL'; avg and "
          "premul_sum are not mapped", (REDUCE_OPS,), _SIM),
    Claim("methods", "ProcessGroupSCCL overrides broadcast, allreduce, reduce, allgather, _allgather_base, gather, "
          "scatter, reduce_scatter (raises), alltoall_base, send, recv, barrier; the rest raise c10d's 'Backend sccl "
          "does not support ...'", (OVERRIDES, f"{PG}:708-712"), _SIM),
    Claim("all_to_all_single split sizes", "ignored: SCCL always splits evenly, so uneven splits compute garbage "
          "without an error", (f"{PG}:714-743",), "checked (xccl pads uneven splits) and simulated (the simulated "
          "group refuses uneven splits rather than compute garbage)"),
    Claim("all_gather equal sizes", "the list all_gather takes equal-sized tensors only", (_pg("allgather", 468),
          "manifest B3"), "checked: xccl's kernel raises ConstraintViolation before communicating"),
    Claim("options", "the creator takes ProcessGroupSCCLOptions& (no None) and requires len(chip_map) >= group size",
          (f"{PG}:792-796 (createProcessGroupSCCL)", "manifest gotcha 6"),
          "simulated: check_sccl_options raises the creator's errors"),
    Claim("chip map: ring", "SCCL runs a ring over C2C links: a node's chip map must list directly linked chips in "
          "ring order; torch_tpu.tpu.set_chip_map replaces an invalid map by the driver's ring",
          (f"{TUTORIAL}:81-94", f"{UTILS}:193-229 (set_chip_map)", "manifest B2"), _RING),
    Claim("chip map: SG2260 board", "the 8-chip board's links: the ring 0-2-6-7-3-1-5-4 and 0-1, 2-3; recommended "
          "eight-chip map [0,2,6,7,3,1,5,4]; four-chip rings such as [7,6,2,3], [1,0,2,3], [1,0,4,5]",
          (f"{_TT}docs/quick_start/assets/3_c2c_topology.png", f"{TUTORIAL}:81-94"),
          "simulated: the simulated node's topology; which four-chip ring the driver recommends is not documented "
          "[inferred: [0,1,3,2]]"),
    Claim("chip map: defaults", "no map and 1 or 2 ranks on the node: [0, 1], unchecked; 1 rank: a given map is "
          "taken as it is; otherwise the ring", (f"{UTILS}:204-213",), _RING),
    Claim("chip map: CHIP_MAP", "set_device(local_rank) selects CHIP_MAP[local_rank], CHIP_MAP being comma-separated "
          "chip ids", (f"{UTILS}:142-160 (map_local_rank_to_device_idx, set_device)", "manifest gotcha 7"),
          "checked (a list literal is refused) and simulated (SimulatedTpu.set_device)"),
    Claim("rank table", "version '1.0', node_list[*].device_list[*] with device_id and rank (local_rank, "
          "device_ip optional)", (f"{TUTORIAL}:162-207 (rank table template and fields)", "manifest B2 (Rank table)"),
          "checked: xccl parses and validates the table (Sophgo's reader is broken, manifest gotcha 7)"),
    Claim("one machine", "Sophgo documents SCCL for the TPUs of one machine (单机多卡)", (f"{TUTORIAL}:12-13",),
          "not simulated: a group spanning nodes logs a warning"),
    Claim("async work", "every op creates and destroys a communicator; Work.wait() returns at once (the op is queued "
          "on the TPU stream)", ("manifest B3",), "not simulated"),
)
