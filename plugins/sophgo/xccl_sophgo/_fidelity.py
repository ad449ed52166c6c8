"""Where each of the plugin's claims about Sophgo comes from, and whether the simulation enforces it.

``scripts/gen_fidelity.py`` renders this into ``docs/fidelity.md``: a row for every capability-table entry (sources
from :data:`ENTRY_SOURCES`) and one for every claim of :data:`CLAIMS`. Sophgo's repository is cited at the commit
it was read at (sophgo/torch-tpu main @ fe9b478); "manifest" is ``shared/vendor-api/MANIFEST.md`` section B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from xccl.plugin import Collective, Mode, cost_rows

__all__ = ["CLAIMS", "ENTRY_SOURCES", "HARDWARE", "SUMMARY", "Claim"]

#: What the sources are, for the ledger's section.
SUMMARY: Final = (
    "Sophgo's torch-tpu is cited at main fe9b478: ProcessGroupSCCL's source, torch_tpu/tpu/utils.py and the tutorial "
    "(docs/quick_start/source_zh/03_Tutorial.rst); the C2C check and ring are in the closed libtpudnn. That source is "
    "torch-tpu's build for torch 2.8.0 (setup.py:39, version 2.8.0.post1; envsetup.sh:18-32 (its scripts folder) takes torch "
    "2.1.0 or 2.8.0), and ProcessGroupSCCL has no torch-version guard (its port to 2.8, commit 26908004, changed its "
    "base class for every build): the simulation is that build on every torch, and CI runs it on torch 2.8.0."
)

C = Collective
_TT: Final = "sophgo/torch-tpu@fe9b478 "
PG: Final = _TT + "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.cpp"
OVERRIDES: Final = _TT + "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.hpp:75-142 (the methods it overrides)"
TUTORIAL: Final = _TT + "docs/quick_start/source_zh/03_Tutorial.rst"
SUPPORT_TABLE: Final = f"{TUTORIAL}:18-45 (SCCL support table)"
UTILS: Final = _TT + "torch_tpu/tpu/utils.py"
ADAPTOR: Final = _TT + "torch_tpu/accelerator/adaptor/torch_adaptor/distributed.py"
DTYPES: Final = f"{PG}:87-116 (toSCCLDtype)"
REDUCE_OPS: Final = f"{PG}:345-380 (toSCCLReduceOp)"
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
_COST_SIMULATION: Final = ("not simulated: xccl preflight predicts from these figures (an unknown one makes the prediction say so); calibrate() replaces them with a fit of the team's own measurements")


def _cost_claims() -> tuple[Claim, ...]:
    """A claim per generation and link kind of the published cost model (``_cost.MODELS``), ops grouped by figure."""
    from ._cost import MODELS

    return tuple(Claim(subject, text, sources, _COST_SIMULATION) for model in MODELS
                 for subject, text, sources in cost_rows(model))


CLAIMS: Final[tuple[Claim, ...]] = (
    Claim("dtypes", "float32, float16, bfloat16, int8, uint8, int32, int64, bool; any other raises 'Invalid scalar "
          "type' (float64 moves as int64 through xccl)", (DTYPES,), _SIM),
    Claim("reduce ops", "sum, product, min, max; every other op raises its own message, 'Cannot use ReduceOp.<OP> "
          "with SCCL' (BAND, BOR, BXOR, PREMUL_SUM, AVG: one message each; xccl runs AVG as SUM and a divide)",
          (f"{PG}:345-380 (toSCCLReduceOp)",), _SIM + " (SimProfile.reduce_op_messages)"),
    Claim("methods", "ProcessGroupSCCL overrides broadcast, allreduce, reduce, allgather, _allgather_base, gather, "
          "scatter, reduce_scatter (raises), alltoall_base, send, recv, barrier; the rest raise c10d's 'Backend SCCL "
          "does not support ...' (getBackendName() is 'SCCL')", (OVERRIDES, f"{PG}:708-712",
          _TT + "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.hpp:23,65-66 (SCCL_BACKEND_NAME, getBackendName)"),
          _SIM),
    Claim("all_to_all_single split sizes", "ignored: SCCL always splits evenly, so uneven splits compute garbage "
          "without an error", (f"{PG}:714-743",), "checked (xccl pads uneven splits) and simulated (the simulated "
          "group refuses uneven splits rather than compute garbage)"),
    Claim("all_gather equal sizes", "the list all_gather takes equal-sized tensors only", (_pg("allgather", 468),
          "manifest B3"), "checked: xccl's kernel raises ConstraintViolation before communicating; the "
          "fallback policy then raises it (error) or gathers via all_gather_into_tensor_uneven (warn, emulate)"),
    Claim("options", "the creator takes ProcessGroupSCCLOptions& (no None) and requires len(chip_map) >= group size "
          "('chip map size must be same with the nranks')",
          (f"{PG}:792-796 (createProcessGroupSCCL)", "manifest gotcha 6"),
          "simulated: check_sccl_options raises the creator's errors, with its words"),
    Claim("chip map: groups", "libsccl gets only the group's size, its rank and the map (scclCommInitRank); the "
          "tutorial's maps give one chip per rank, in ring order; Sophgo's own code gives every sub-group the node's "
          "(or world's) whole map. [inferred: a map of the group's size gives group rank i chip_map[i]; a longer "
          "map is the node's ring, on which libsccl finds each member by its chip]",
          (f"{PG}:235-246 (getSCCLcomm)", f"{TUTORIAL}:81-94,229",
           "sophgo/vllm-tpu@b010f67 vllm_tpu/hack/distributed.py (GroupCoordinator.__init__: set_chip_map per group)",
           f"{ADAPTOR}:102-116 (new_group inherits the world's chip_map)"),
          "checked: every group xccl makes gets its node's whole map (a group across nodes its members' chips); "
          "simulated: a map of the group's size must be a C2C ring holding this rank's chip at its group rank, a "
          "longer one a ring holding it anywhere (TP groups of 4 on the 8-chip ring drive chips 0,2,6,7: no ring). "
          "How libsccl reads a sub-group's map is the first thing to check on hardware"),
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
    Claim("chip map: LOCAL_WORLD_SIZE", "set_chip_map reads the node's size from LOCAL_WORLD_SIZE only (default 1: a "
          "given map is then taken unchecked and no map gives [0, 1]) and CHIP_MAP before its argument; mpirun sets "
          "no LOCAL_WORLD_SIZE", (f"{UTILS}:193-213 (set_chip_map)",),
          "simulated (the simulated set_chip_map reads the same variables) and checked: the runtime sets "
          "LOCAL_WORLD_SIZE (and clears CHIP_MAP) for the call, from the job xccl knows, then restores them"),
    Claim("chip map: CHIP_MAP", "set_device(local_rank) selects CHIP_MAP[local_rank], CHIP_MAP being comma-separated "
          "chip ids", (f"{UTILS}:142-160 (map_local_rank_to_device_idx, set_device)", "manifest gotcha 7"),
          "checked (a list literal is refused) and simulated (SimulatedTpu.set_device)"),
    Claim("rank table", "version '1.0', node_list[*].device_list[*] with device_id and rank (local_rank, "
          "device_ip optional)", (f"{TUTORIAL}:162-207 (rank table template and fields)", "manifest B2 (Rank table)"),
          "checked: xccl parses and validates the table (Sophgo's reader is broken, manifest gotcha 7)"),
    Claim("one machine", "Sophgo documents SCCL for the TPUs of one machine (单机多卡)", (f"{TUTORIAL}:12-13",),
          "not simulated: a group spanning nodes logs a warning"),
    Claim("torch adaptor", "`import torch_tpu.accelerator` loads the torch adaptor unless ENABLE_TORCH_ADAPTOR=0, "
          "DISABLE_ADAPTOR=1 or DS_DISABLE_TPU=1 (environ_flag defaults to 1); it replaces init_process_group by a "
          "wrapper that passes backend='sccl' whatever it is given, new_group (a one-rank group on gloo), "
          "all_reduce/reduce (bool, int8, uint8, int64 as int32; float64 as float32) and the one-rank cases of "
          "broadcast, all_gather_into_tensor, isend, irecv",
          (f"{ADAPTOR}:83-97,102-133", f"{_TT}torch_tpu/accelerator/adaptor/__init__.py:1-3",
           f"{_TT}torch_tpu/accelerator/utils.py (environ_flag)"),
          "simulated: the init_process_group rewrite (ENABLE_TORCH_ADAPTOR=1 stands for the import; "
          "xccl_sophgo._adaptor_sim); checked: xccl.init raises InitError naming the replacement when the world is "
          "not on its backend; the other replacements are declared (Plugin.vendor_runtime), not simulated"),
    Claim("completion", "WorkSCCL::isCompleted() and wait() return true at once for every op, barrier included (an "
          "all_reduce of one uninitialised float queued on the current TPU stream): nothing holds the host after a "
          "collective; a copy to the host synchronises the stream first, so data read on the host is right",
          (f"{PG}:183-191 (WorkSCCL)", f"{PG}:745-782 (barrier)",
           f"{_TT}torch_tpu/csrc/core/TPUDeviceManager.cpp:413-431 (CopyDeviceToHost)"),
          "simulated (Completion.AT_ONCE: a barrier's wait returns before the peers arrived; data ops wait for gloo, "
          "is_completed() reports True) and checked: xccl's barrier (xccl.barrier, dist.barrier on xccl's groups) "
          "also waits on the host-side gloo group, or reads an all_reduce back on a group xccl did not create; the "
          "conformance suite checks that no rank leaves a barrier before the last entered"),
    Claim("communicator per op", "every op creates a communicator (scclCommInitRank with the group's chip map) and "
          "destroys it right after enqueueing the op; whether the destroy waits for the op is not in the source",
          (f"{PG}:131-154 (collective)", f"{PG}:235-246 (getSCCLcomm)", "manifest B3"),
          "not simulated [inferred: the hardware decides; first-hour checklist]"),
    Claim("no timeout", "ProcessGroupSCCL stores the group's timeout and uses it nowhere, and has no watchdog: a "
          "collective whose peer never arrives waits forever, unless the closed libsccl has a timeout of its own",
          (f"{PG}:792-806 (createProcessGroupSCCL: options.timeout set, never read)", f"{PG}:183-191 (WorkSCCL)"),
          "simulated for a lost peer (xccl.plugin._sim_stream): the collective and whatever needs values behind it "
          "wait forever (tests/test_sim_stream.py); not simulated for a live peer that never arrives: the simulated "
          "group's gloo raises after the group's timeout (CollectiveTimeout); xccl's host barrier is bounded on the "
          "hardware too (first-hour checklist)"),
    Claim("adaptor frames", "with torch_tpu's torch adaptor (on by default once torch_tpu.accelerator is imported), "
          "dist.broadcast, reduce, all_reduce, all_gather_into_tensor, isend and irecv are wrappers of "
          "torch_tpu.accelerator.adaptor.torch_adaptor.distributed: their frames are not the user's call site",
          ("sophgo/torch-tpu@fe9b478 torch_tpu/accelerator/adaptor/torch_adaptor/distributed.py:122-131",),
          "checked: Plugin.adaptor_modules names torch_tpu and xccl_sophgo (whose _adaptor_sim stands in for the "
          "adaptor), and the flight recorder, warnings and xccl preflight name the user's line above them; the "
          "adaptor's collective wrappers themselves are not simulated (only its init_process_group rewrite)"),
    *_cost_claims(),
)

#: What only the hardware can settle, in the order to try it on the first Sophgo machine, each with the command that
#: settles it (the ledger's "First hour on hardware").
HARDWARE: Final = (
    ("how libsccl reads a sub-group's chip map (xccl gives every group on one node the node's whole map, as Sophgo's "
     "own code does; inferred): TP x DP groups on one node compute right",
     "RANK_TABLE_FILE=rank_table.json torchrun --standalone --nproc-per-node 8 examples/sophgo_tp_dp.py (then 4)"),
    ("SCCL destroys its communicator right after queuing each op (ProcessGroupSCCL.cpp:146-150): whether async "
     "results stay right, every op sync and async against references, and that no rank leaves a barrier early",
     "pytest --xccl-plugin sophgo --xccl-world-sizes 2,4,8"),
    ("a lost chip (xccl refuses an in-place shrink on Sophgo: SCCL has no timeout, no error path and no abort): what "
     "a survivor's next all_reduce and the stream synchronisation after it do when rank 1 (not the last) is killed, "
     "bounded by an outer timeout, with xccl's health watch off and on (`xccl doctor --first-hour --vendor sophgo` "
     "writes a report of both, and of the refused shrink); then that torchrun's restart brings every rank back on "
     "live chips and the restarted job computes right",
     "timeout 300 torchrun --standalone --nproc-per-node 4 --max-restarts 1 --no-python python -c \"import os, time, "
     "torch, torch_tpu, xccl; w = xccl.init(vendor='sophgo'); t = torch.ones(1, device=w.device); xccl.all_reduce(t); "
     "r = int(os.environ['TORCHELASTIC_RESTART_COUNT']); os.kill(os.getpid(), 9) if w.rank == 1 and r == 0 else None; "
     "s = time.time(); xccl.all_reduce(t); torch_tpu.tpu.synchronize(); print(w.rank, r, t.item(), time.time() - s)\""),
    ("whether importing torch_tpu.accelerator turns the torch adaptor on by default (False means it patched)",
     "python -c \"import torch_tpu.accelerator, torch.distributed as d; "
     "print(d.init_process_group is d.distributed_c10d.init_process_group)\""),
    ("the driver's 4-chip ring (the simulation assumes [0, 1, 3, 2])",
     "LOCAL_WORLD_SIZE=4 python -c \"import torch_tpu; o = torch_tpu.ProcessGroupSCCLOptions(); "
     "torch_tpu.tpu.set_chip_map(o); print(o.chip_map)\""),
    ("the mpirun path (LOCAL_WORLD_SIZE set for set_chip_map from Open MPI's variables)",
     "mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python examples/sophgo_all_reduce.py"),
    ("whether anything bounds a collective whose peer is missing (ProcessGroupSCCL has no timeout and no watchdog; "
     "the simulation's gloo raises after the group's timeout): rank 1 is 600 s late to an all_reduce on a group "
     "with timeout=60; 'after 60 s' with an error means libsccl times out, 'after 600 s' that rank 0 waited for it",
     "ENABLE_TORCH_ADAPTOR=0 torchrun --standalone --nproc-per-node 2 --no-python python -c \"import atexit, time, "
     "torch, torch_tpu, xccl; w = xccl.init(vendor='sophgo', timeout=60); t = torch.ones(1, device=w.device); "
     "xccl.all_reduce(t); torch_tpu.tpu.synchronize(); time.sleep(600 * w.rank); s = time.time(); "
     "atexit.register(lambda: print(w.rank, 'after', round(time.time() - s), 's')); xccl.all_reduce(t); "
     "torch_tpu.tpu.synchronize(); print(w.rank, t.cpu().tolist())\""),
)
