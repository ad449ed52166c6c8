"""Where each of the plugin's claims about Ascend comes from, and whether the simulation enforces it.

``scripts/gen_fidelity.py`` renders this into ``docs/fidelity.md``, with a row for every capability-table entry
(sources from :data:`ENTRY_SOURCES` and from citations in the entry's note) and one for every claim of
:data:`CLAIMS` (the MC2 constraints come from :data:`xccl_ascend._constraints.RULES`). Upstream files are cited at
the commit they were read at: torch_npu at tag ``compatibility_release-pytorch2.13.0`` (462f4e1, the release line of
the wheel the manifest describes), op-plugin master @ 517f2e7; CANN pages by URL; "manifest" is
``shared/vendor-api/MANIFEST.md`` section A (read in the torch_npu 2.13.0 wheel), "seed NNN" the files under
``shared/seeds/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from xccl.plugin import Collective, Level, Mode, Support, cost_rows

from ._capabilities import GRAPH_SOURCES
from ._constraints import RULES
from ._cost import HCCL_TEST

__all__ = ["CLAIMS", "ENTRY_SOURCES", "GRAPH_CLAIMS", "HARDWARE", "SUMMARY", "Claim", "entry_simulation"]

#: What the sources are, for the ledger's section.
SUMMARY: Final = (
    "torch_npu is cited at tag compatibility_release-pytorch2.13.0 (462f4e1, the release line of the 2.13.0 wheel "
    "the manifest describes), op-plugin at master 517f2e7, CANN by page; seed 004 is npu_mm_reduce_scatter_base's "
    "documentation, seeds 000/001 TorchAir's graph collectives."
)

C = Collective
_PT: Final = "Ascend/pytorch@462f4e1 "
PGH: Final = _PT + "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp"
HPP: Final = _PT + "torch_npu/csrc/distributed/ProcessGroupHCCL.hpp"
UTILS: Final = _PT + "torch_npu/csrc/distributed/HCCLUtils.cpp:52-68 (kScalarTypeToHcclDataType)"
C10D: Final = _PT + "torch_npu/distributed/distributed_c10d.py"
TYPES: Final = _PT + "third_party/hccl/inc/hccl/hccl_types.h"
_CANN: Final = "https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/"
CANN_ALLREDUCE: Final = f"CANN HcclAllReduce {_CANN}850/API/hcclapiref/hcclcpp_07_0020.html"
CANN_REDUCESCATTER: Final = f"CANN HcclReduceScatter {_CANN}900beta1/API/hcclapiref/hcclcpp_07_0024.html"
CANN_ALLGATHER: Final = f"CANN HcclAllGather {_CANN}900beta2/API/hcclapiref/hcclcpp_07_0023.html"
TNPU_PROD: Final = "Ascend/pytorch@9e73e70 docs/zh/api/native_api/pytorch_2-12-0/torch-distributed.md:571"
REDUCE_CHECK: Final = f"{PGH}:173-187 (checkSupportedDataType)"
REDUCE_OPS: Final = f"{PGH}:84-170 (hcclOp, getHcclReduceOp)"


@final
@dataclass(frozen=True, slots=True)
class Claim:
    """One claim about the vendor that xccl relies on."""

    #: What it is about, e.g. ``"hccl_config: hccl_job_id"``.
    topic: str
    #: What xccl holds to be true.
    claim: str
    #: Where it is written (repository@commit path:lines, seed, manifest section, URL).
    sources: tuple[str, ...]
    #: How xccl enforces it: "checked" (by xccl before the call, the same code on the hardware and in
    #: simulation), "simulated" (the simulated vendor refuses or behaves the same), "not simulated", with detail.
    simulation: str


def _sources(rule: str, *about: str) -> tuple[str, ...]:
    """The sources of the MC2 rule named ``rule`` that mention any of ``about``."""
    found = next(r for r in RULES if r.name == rule).sources
    return tuple(s for s in found if any(a in s for a in about))


def _pgh(method: str, line: int) -> str:
    return f"{PGH}:{line} (ProcessGroupHCCL::{method})"


#: Sources of every entry: the eager column's here, the graph column's from the table's own ``GRAPH_SOURCES``
#: (the generator adds what the entries' notes cite).
ENTRY_SOURCES: Final[Mapping[tuple[Collective, Mode], tuple[str, ...]]] = {
    **{(op, Mode.GRAPH): tuple(srcs) for op, srcs in GRAPH_SOURCES.items()},
    **{(op, Mode.EAGER): srcs for op, srcs in {
        C.ALL_REDUCE: (_pgh("allreduce", 4691), f"{PGH}:4734-4737 (bool/uint8 cast to int32)", REDUCE_CHECK, REDUCE_OPS,
                       UTILS, CANN_ALLREDUCE, TNPU_PROD),
        C.ALL_REDUCE_COALESCED: (_pgh("allreduce_coalesced", 4959), REDUCE_CHECK, REDUCE_OPS, CANN_ALLREDUCE),
        C.ALL_GATHER: (_pgh("allgather", 5463), UTILS, CANN_ALLGATHER),
        C.ALL_GATHER_COALESCED: (f"{HPP}:590-795 (the overrides: no allgather_coalesced)",),
        C.ALL_GATHER_INTO_TENSOR: (_pgh("_allgather_base", 5786), UTILS, CANN_ALLGATHER),
        C.REDUCE_SCATTER: (_pgh("reduce_scatter", 5843), REDUCE_CHECK, CANN_REDUCESCATTER, TNPU_PROD),
        C.REDUCE_SCATTER_TENSOR: (_pgh("_reduce_scatter_base", 6081), REDUCE_CHECK, CANN_REDUCESCATTER, TNPU_PROD),
        C.ALL_TO_ALL: (_pgh("alltoall", 7089), UTILS),
        C.ALL_TO_ALL_SINGLE: (_pgh("alltoall_base", 6874), UTILS),
        C.ALL_TO_ALL_SINGLE_UNEVEN: (f"{_pgh('alltoall_base', 6874)}: split sizes passed to HCCL's AlltoAllV",),
        C.BROADCAST: (_pgh("broadcast", 4905), UTILS),
        C.REDUCE: (_pgh("reduce", 5033), REDUCE_CHECK, CANN_ALLREDUCE),
        C.GATHER: (f"{C10D}:167-279 (_gather: all_gather unless the compatible implementation on 910B/910_93)",
                   "manifest gotcha 12"),
        C.SCATTER: (_pgh("scatter", 6540), UTILS),
        C.BARRIER: (_pgh("barrier", 6227),),
        # ProcessGroupHCCL does not override monitoredBarrier, and torch refuses monitored_barrier on any backend
        # but gloo: xccl's runs over the rendezvous store.
        C.MONITORED_BARRIER: (f"{HPP} (no monitoredBarrier override)",
                              "torch 2.13 torch/distributed/distributed_c10d.py:5418-5419 (monitored_barrier: 'only "
                              "implemented for GLOO backend')"),
        C.SEND: (_pgh("send", 6771), UTILS),
        C.RECV: (_pgh("recv", 6807), UTILS),
        C.RECV_ANY_SOURCE: (f"{PGH}:6869-6872 (recvAnysource raises)",),
        C.ALL_GATHER_INTO_TENSOR_UNEVEN: (f"{C10D}:439 (_all_gather_into_tensor_uneven)",
                                          _pgh("_allgather_base_uneven", 5437), "manifest A2 (:421)"),
        C.REDUCE_SCATTER_TENSOR_UNEVEN: (f"{C10D}:406 (_reduce_scatter_tensor_uneven)",
                                         _pgh("_reduce_scatter_base_uneven", 5327), "manifest A2 (:388)",
                                         CANN_REDUCESCATTER),
        C.ALL_TO_ALL_V: (f"{_PT}torch_npu/distributed/__init__.py:1-3,28-33 (no all_to_all_vc at 462f4e1, 94c0533 "
                         "and 46936d1)", "Ascend/pytorch@a63ae3a (branch v2.12.0) torch_npu/distributed/__init__.py:2,29",
                         "Ascend/pytorch@da74682 (branch v2.9.0) torch_npu/distributed/distributed_c10d.py:456-522",
                         "manifest A2 (a 2.13.0 wheel with all_to_all_vc, which the public 2.13.0 tags do not match)"),
        C.MM_REDUCE_SCATTER: (*_sources("world size", "seed 004", "reduce_scatter"), "manifest A4"),
        C.ALL_GATHER_MM: (*_sources("world size", "all_gather"), "manifest A4"),
        C.MM_ALL_REDUCE: (*_sources("product line", "all_reduce"), "manifest A4"),
    }.items()},
}

_CHECKED: Final = "checked: by xccl before any call, the same code on the hardware and in simulation"
_FUSED: Final = frozenset({C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE})
_UNEVEN: Final = frozenset({C.ALL_GATHER_INTO_TENSOR_UNEVEN, C.REDUCE_SCATTER_TENSOR_UNEVEN, C.ALL_TO_ALL_V})


def entry_simulation(op: Collective, mode: Mode, support: Support) -> str | None:
    """How the simulation covers the graph column and the eager torch_npu extras (the rest: the generator's default)."""
    if op is C.ALL_TO_ALL_V and mode is Mode.EAGER:
        return ("checked and simulated: the runtime probes the installed torch_npu (hasattr) and uses all_to_all_vc "
                "only where it exists; the simulated release is XCCL_SIM_TORCH_NPU (default 2.13.0, whose call raises "
                "torch_npu's AttributeError)")
    if support.level is not Level.NATIVE:
        return None
    if mode is Mode.GRAPH:
        return ("simulated: compiled as TorchAir would be, every node checked against TorchAir's converter "
                "vocabulary and the HCCL operators against GE's IR dtype lists and CANN floor "
                "(xccl_ascend._torchair_sim), then run on CPU; GE's own passes are not simulated")
    if op in _FUSED:
        return ("checked: the MC2 constraints (below), by xccl before the call; simulated: SimSdk computes the matmul "
                "and the collective on CPU and finds the group by its hcom name, as the kernel does")
    if op in _UNEVEN:
        return "simulated: SimSdk gives torch_npu's semantics through padding or split sizes on the simulated group"
    return None
_BOTH: Final = "checked and simulated: xccl refuses it first; the simulated group refuses it too"
_TA: Final = "Ascend/torchair@fced8842d149 python/torchair/"
_RAW: Final = f"{_TA}_ge_concrete_graph/auto_generated_ge_raw_ops.py"
_FX: Final = f"{_TA}npu_fx_compiler.py"
#: The graph-mode behaviours of TorchAir and GE the simulation reproduces (item 6 of issue 20).
GRAPH_CLAIMS: Final[tuple[Claim, ...]] = (
    Claim("graph dtypes: HCCL operators' IR", "GE takes the dtypes an HCCL operator's IR prototype lists: "
          "HcomAllReduce, HcomReduceScatter(V) float32/float16/int32/int16/int8 (no int64, bfloat16, bool, uint8); "
          "HcomAllGather, _HcomBroadcast, HcomAllToAll(V), HcomSend/Receive no bool, bfloat16 or float8 "
          "(HcomAllGatherV has bfloat16); TorchAir's converters pass the dtype through unchecked",
          (f"{_RAW}:24351 (HcomAllReduce)", f"{_RAW}:24567 (HcomReduceScatter)", f"{_RAW}:24610 (HcomReduceScatterV)",
           f"{_RAW}:24257 (HcomAllGather)", f"{_RAW}:24298 (HcomAllGatherV)", f"{_RAW}:24392 (_HcomBroadcast)",
           f"{_RAW}:24889 (HcomAllToAllV)", f"{_RAW}:24940 (HcomAllToAll)", f"{_RAW}:24660 (HcomSend)",
           f"{_RAW}:24696 (HcomReceive)",
           f"{_TA}_ge_concrete_graph/ge_converter/c10d_functional/c10d_functional.py:83-143 (no dtype check)"),
          "simulated: the simulated GE refuses the node with the prototype's list; checked: the graph column takes "
          "the lists, the graph forms cast what is missing where a cast is exact (bool as uint8 or int32, bfloat16 "
          "as float32, float8 as float16) and refuse int64 reductions while tracing"),
    Claim("graph send/recv: CANN floor", "send and recv in a graph need CANN 8.6.0; TorchAir only logs 'not "
          "supported in graph, you need upgrade cann version' below it, and only for npu_define._send/_recv in the "
          "Dynamo graph (xccl's are still xccl.send there)", (f"{_FX}:832-851 (_process_send_recv)",),
          "checked: the graph column's min_sdk, against the CANN the runtime found, raises at trace time; "
          "simulated: XCCL_SIM_CANN_VERSION (default the CANN Ascend pairs with the simulated torch_npu: "
          "Ascend/pytorch@b48e648 COMPATIBILITY.en.md, 8.3.RC1 for 2.7.1 and 2.8.0, 9.0.0 taken for 2.13.0, which it "
          "pairs with none; @462f4e1 README.md:65-71 is TorchNPU 2.10.0.post2's install example, not 2.13's)"),
    Claim("graph isend/irecv", "TorchAir has no non-blocking point-to-point (no isend/irecv in its source); its "
          "HcomSend/HcomReceive block in program order", (f"{_TA} (no isend/irecv)",
          f"{_TA}_ge_concrete_graph/ge_converter/experimental/hcom_send_recv.py:51-141"),
          "checked: the graph forms raise UnsupportedCollective while tracing (Runtime.graph_ops has no "
          "isend/irecv/wait); simulated: the simulated TorchAir has no converter for them either"),
    Claim("TorchAir's own backend", "torch.compile(backend=torchair.get_npu_backend()) applies TorchAir's "
          "decompositions and the caller's only, converts registered targets (public register_fx_node_ge_converter) "
          "and normalize_reduceop_type has no avg",
          (f"{_FX}:890 (get_npu_backend)", f"{_TA}__init__.py:49 (register_fx_node_ge_converter)",
           f"{_TA}_ge_concrete_graph/utils.py:179 (normalize_reduceop_type)"),
          "simulated: xccl_ascend.sim_npu_backend(); checked: graphs of standard collectives compile (avg and casts "
          "are done in the graph), xccl's own ops meet converters xccl registers that raise UnsupportedCollective "
          "naming xccl.compile"),
    Claim("bundled TorchAir", "torch_npu 2.13 bundles TorchAir at 76ce3004 (submodule third_party/torchair/torchair), "
          "which is not public; the vocabulary and IR prototypes are read at fced8842",
          ("Ascend/pytorch@462f4e1 .gitmodules:8-10, third_party/torchair/torchair (submodule commit 76ce3004)",),
          "not simulated: unverifiable without the hardware (docs/fidelity.md, first hour on real hardware)"),
)

_COST_SIMULATION: Final = ("not simulated: xccl preflight predicts from these figures (an unknown one makes the prediction say so); calibrate() replaces them with a fit of the team's own measurements")


def _cost_claims() -> tuple[Claim, ...]:
    """A claim per generation and link kind of the published cost model (``_cost.MODELS``), ops grouped by figure."""
    from ._cost import MODELS

    return tuple(Claim(subject, text, sources, _COST_SIMULATION) for model in MODELS
                 for subject, text, sources in cost_rows(model))

#: Claims beyond the table's entries.
CLAIMS: Final[tuple[Claim, ...]] = (
    Claim("dtypes moved", "HCCL moves bool, uint8, int8, int16, uint16, int32, uint32, int64, uint64, float16, "
          "bfloat16, float32, float64 and float8_e4m3fn/e5m2 (torch_npu's map)", (UTILS, CANN_ALLGATHER),
          "simulated: the simulated group takes them (gloo carries those it lacks as same-width views, bit for bit)"),
    Claim("dtypes moved: float8", "float8 moves on Atlas 350 (Ascend 950) only: CANN's HCCL data types list it for no "
          "other product", (CANN_ALLGATHER, "Ascend/pytorch@da74682 commit ae014f4 '[950] Add 950 support' adds the "
          "float8 map entries"),
          "simulated: refused unless XCCL_SIM_ASCEND_SOC names an Ascend950 chip; not in the table, which has no "
          "product line (xccl passes float8 on, the hardware refuses it)"),
    Claim("dtypes reduced", "reductions take int8/16/32/64, float16/32 and bfloat16 only; allreduce and reduce cast "
          "bool/uint8 to int32 first", (REDUCE_CHECK, f"{PGH}:4734-4737", CANN_ALLREDUCE), _BOTH),
    Claim("prod over int16 / bfloat16", "'prod' does not support int16 or bfloat16 on Atlas A2 and A3 (HCCL fails "
          "inside when the op runs; torch_npu does not check it)", (CANN_ALLREDUCE, CANN_REDUCESCATTER, TNPU_PROD),
          _BOTH),
    Claim("reduce ops", "sum, product, min, max; avg as sum then divide (floats); premul_sum on floats; band/bor/bxor "
          "raise 'Cannot use ReduceOp.BAND with HCCL'; sum over bool runs as max", (REDUCE_OPS,), _BOTH),
    Claim("hccl_config: binding", "values bind to std::variant<uint32_t, uint64_t, int32_t, std::string>, first "
          "alternative that fits: an int below 2**32 is a uint32", (f"{HPP}:475",
          "pybind11 3.0.4 (torch 2.13 include) pybind11/stl.h:626-635 variant_caster::load"),
          "checked (validate_hccl_config) and simulated (torch_check at group creation)"),
    Claim("hccl_config: hccl_job_id", "read as uint64 only: a job id below 2**32 fails 'Value type of hccl_job_id "
          "should be int.' at the first collective", (f"{PGH}:3881-3887",),
          "checked (InvalidArgument: pass a value >= 2**32) and simulated (torch_check)"),
    Claim("hccl_config: uint32 keys", "hccl_buffer_size, qos_*, hccl_sdma_qos, hccl_op_expansion_mode, "
          "hccl_world_rank_id read as uint32 only", (f"{PGH}:3818-3880",), "checked and simulated"),
    Claim("hccl_config: hccl_exec_timeout", "int32, or a uint32 up to INT32_MAX ('exceeds INT32_MAX(2147483647)'); "
          "negative values warn", (f"{PGH}:3889-3904",), "checked and simulated"),
    Claim("hccl_config: group_name", "copied into hcclUdi (user-defined information), truncated to 127 characters "
          "with a warning; not the communicator's name", (f"{PGH}:3826-3839", f"{TYPES}:107 (UDI_MAX_LENGTH)"),
          "checked (a warning) and simulated (torch_npu's warning)"),
    Claim("hccl_config: string limits", "hccl_algo 1599, hccl_retry_enable 49, hccl_retry_params and "
          "hccl_buffer_name 127 characters; longer ones truncated with a warning",
          (f"{PGH}:3906-3962", f"{TYPES}:105-110"), "checked (a warning) and simulated (a warning)"),
    Claim("communicator name", "get_hccl_comm_name returns 'group_name_' + torch's group name where CANN supports "
          "HCCL_COMM_CONFIG_COMM_NAME", (f"{PGH}:1132", f"{PGH}:3803-3811"),
          "simulated: SimSdk.comm_name, collective like HCCL's communicator creation"),
    Claim("product line", "get_device_name(): Ascend910B* is Atlas A2, Ascend910_93* is A3, Ascend950* the 950",
          (f"{_PT}torch_npu/csrc/core/npu/NpuVariables.cpp:13-58",),
          "simulated: XCCL_SIM_ASCEND_SOC (A2, A3 or a chip name)"),
    Claim("visible devices", "ASCEND_RT_VISIBLE_DEVICES: ascending comma-separated ids renumbered 0..n-1; parsing "
          "stops at the first other character; empty means none", ("manifest A1 (npu/__init__.py:418)",),
          "simulated: XCCL_SIM_ASCEND_DEVICES filtered by the same parser"),
    Claim("torch_npu release: all_to_all_vc", "torch_npu.distributed.all_to_all_vc (binding alltoallvc) exists on "
          "the development branches v2.7.1 and v2.9.0 to v2.12.0 only: not on v2.8.0, on no release branch "
          "(-7.2.0, -7.3.0, -26.0.0, -26.1.0 of 2.7.1 to 2.12.0), in none of the 2.13.0 tags",
          (f"{_PT}torch_npu/distributed/__init__.py:1-3,28-33", "Ascend/pytorch@94c0533 torch_npu/distributed/__init__.py",
           "Ascend/pytorch@46936d1 torch_npu/distributed/__init__.py",
           "Ascend/pytorch@adc41e6 (branch v2.7.1) torch_npu/distributed/__init__.py:4,32",
           "Ascend/pytorch@da74682 (branch v2.9.0) torch_npu/distributed/__init__.py:2",
           "Ascend/pytorch@cf90439 (branch v2.10.0) torch_npu/distributed/__init__.py:2",
           "Ascend/pytorch@0b74b65 (branch v2.11.0) torch_npu/distributed/__init__.py:2",
           "Ascend/pytorch@a63ae3a (branch v2.12.0) torch_npu/distributed/__init__.py:2,29",
           "Ascend/pytorch@c419498 (branch v2.8.0) torch_npu/distributed/__init__.py (no all_to_all_vc)",
           "Ascend/pytorch@42d8c46 (branch v2.12.0-26.1.0) torch_npu/distributed/__init__.py (no all_to_all_vc)"),
          "simulated: XCCL_SIM_TORCH_NPU selects the release (a version is a release wheel, 'v2.12.0' the development "
          "branch); checked: the runtime's probe refines the table"),
    Claim("backend name checks", "torch_npu's _AllGatherBase.backward accepts only nccl, xccl and hccl; TorchAir "
          "records a group for cache and export only if get_backend(pg) == 'hccl'; torch_npu's profiler only if "
          "str(backend).lower() == 'hccl'",
          (f"{_PT}torch_npu/distributed/nn/functional.py:8-30", f"{_PT}torch_npu/profiler/profiler_interface.py:378-380",
           "Ascend/torchair@fced8842 python/torchair/_ge_concrete_graph/hcom_utils.py:29-31",
           "Ascend/torchair@fced8842 python/torchair/ge/_ge_graph.py:794-796"),
          "simulated: torch_npu's backward with its check (a patch); checked: xccl's name compares equal to 'hccl' "
          "(xccl.BackendName), which meets the first two; the profiler's str().lower() check is not met"),
    *(Claim(f"MC2 constraint: {r.name}", "; ".join(f"{k}: {v}" for k, v in r.rule.items()), r.sources,
            _CHECKED + ("; the simulated kernels also make op-plugin's own world-size check" if r.name == "world size"
                        else ""))
      for r in RULES),
    *GRAPH_CLAIMS,
    *_cost_claims(),
    Claim("HCCL Test bandwidth unit", "alg_bandwidth is data_size / avg_time in 2**30 bytes per second, though "
          "labelled GB/s (the docs' example prints 64 MiB in 2630.20 us as 23.76245 and 32 MiB in 1714.85 us as "
          "18.22317); nccl-tests' and xccl bench's GB/s are 10**9", (f"{HCCL_TEST} (Result Description, example)",),
          "checked: tests/test_cost_model.py reads the docs' example; calibrate() fits avg_time and data_size, not the "
          "bandwidth column"),
    Claim("world sizes of all_gather_into_tensor and reduce_scatter_tensor", "torch_npu 2.13's documentation: "
          "world_size 3, 5, 6 and 7 are not supported (whether HCCL refuses them is not in the source read)",
          (f"{_PT}docs/zh/api/native_api/pytorch_2-13-0/torch-distributed.md:300-301,339-341",),
          "checked: a warning once per group of such a size at its first all_gather_into_tensor or "
          "reduce_scatter_tensor, before anything is sent (the plugin's kernels, on the hardware and in simulation "
          "alike); not refused"),
    Claim("dtypes of reduce_scatter and all_to_all", "torch_npu 2.13's documentation lists bfloat16, float16, "
          "float32, int8 and int32 for reduce_scatter(_tensor), float32 only for all_to_all(_single); its code "
          "(checkSupportedDataType, HcclAlltoAllV) takes more, so the table follows the code",
          (f"{_PT}docs/zh/api/native_api/pytorch_2-13-0/torch-distributed.md:319,339,359,379", REDUCE_CHECK),
          "checked: a warning once per group, op and dtype outside the documented ones, before anything is sent; "
          "not refused (whether HCCL computes them right: the first hour)"),
    Claim("lazy connect: point-to-point", "a plain send/recv connects a communicator of its own for the pair of "
          "ranks (P2P_HCCL_BUFFSIZE != 0, not coalescing); batch_isend_irecv is a collective on the group's "
          "communicator, and sends and receives under coalescing (torch_npu's batch path from CANN 9.0 on A2/A3) use "
          "the group's communicator: the first batch connects the whole group",
          (f"{PGH}:4428-4439 (pointToPoint)", f"{PGH}:4771-4783 (batch_isend_irecv_inner: collective)",
           f"{PGH}:6260-6375 (startCoalescing, endCoalescing)"),
          "simulated: a batch (GroupRuntime.coalescing) connects the group, every member must arrive within the "
          "connect timeout, and its sends return no work before the batch ends; the pair communicator is not "
          "simulated (a plain send/recv connects nothing)"),
    Claim("work future", "WorkHCCL's future (getFuture) is created and marked completed when the op is enqueued, "
          "under the HCCL streams' guard, with the op's outputs as its value: waiting on it orders the caller's "
          "stream behind the collective, and it never carries an HCCL failure; endCoalescing's holds an empty list, "
          "and a send or recv under coalescing gets none",
          (f"{PGH}:1104-1107 (getFuture)", f"{PGH}:4150-4157, :4371-4378, :4624-4632 (future_ marked completed at "
           "enqueue)", f"{PGH}:6342-6348 (endCoalescing)"),
          "partly simulated: a lost peer's failure never reaches the simulated future (it fails with EI0002 after "
          "HCCL_EXEC_TIMEOUT, where the hardware's next synchronisation would); otherwise it completes when the "
          "host-side op does, and for an op gloo gives no future (reduce_scatter_tensor) its value is every tensor of "
          "the call, the input included (xccl.plugin._work.future_of). A future complete at enqueue would have DDP "
          "read a bucket not yet reduced: the simulation computes on the host"),
    Claim("lost peer", "a collective stuck on a dead peer tells the host nothing: WorkHCCL::wait only orders the "
          "current stream, and EI0002 comes after HCCL_EXEC_TIMEOUT (1836 s by default), at the next stream "
          "synchronisation; HcclGetCommAsyncError reports RDMA error CQEs only; stop_device (aclrtDeviceTaskAbort) "
          "aborts the device's tasks, after which waits fail with FORCE STOP until restart_device",
          (f"{PGH}:996-1007, :1083-1094 (wait)", f"{PGH}:2100-2118 (HcclGetCommAsyncError)",
           "Ascend/pytorch@082cb38 torch_npu/npu/_recovery.py (stop_device, restart_device)",
           "../shared/vendor-api/RUNTIME-AUDIT-3.md L2, L6"),
          "simulated (xccl.plugin._sim_stream): gloo's 'connection closed' does not reach the host; the simulated "
          "stream holds the collective and everything behind it until HCCL_EXEC_TIMEOUT, then EI0002; the simulated "
          "stop_device fails them with FORCE STOP (tests/test_sim_stream.py). xccl's sentinel hears of the "
          "loss as the lost rank's process ends (its connections reset): its look names the lost rank and stops the "
          "device within a second, with or without a call of xccl's waiting, and so releases a host blocked outside "
          "xccl (a .item()) (tests/test_health.py)"),
    Claim("HCCL_CONNECT_TIMEOUT range", "an integer in [120, 7200], default 120; from CANN 8.2 the wait is 20 s longer",
          ("CANN https://www.hiascend.com/document/detail/zh/canncommercial/850/maintenref/envvar/envref_07_0149.html",),
          "checked and simulated: a value outside is taken as the nearest bound, with a warning (whether HCCL clamps "
          "or refuses it: first-hour checklist); the 20 s are not simulated; XCCL_SIM_CONNECT_TIMEOUT shortens the "
          "simulated wait for tests"),
    Claim("memory per communicator: 2 x HCCL_BUFFSIZE", "each communicator takes two buffers of HCCL_BUFFSIZE (one to "
          "send, one to receive): 400 MB by default; a group's hccl_config['hccl_buffer_size'] replaces "
          "HCCL_BUFFSIZE for its communicator; torch_npu refuses HCCL_BUFFSIZE <= 0 ('HCCL_BUFFSIZE should be "
          "positive.') when it creates a communicator",
          ("CANN https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/maintenref/envvar/"
           "envref_07_0080.html", f"{PGH}:3818-3824",
           _PT + "torch_npu/csrc/core/npu/register/OptionsManager.cpp:541-553 (GetHcclBufferSize)"),
          "checked: xccl.runtime.communicators() reports 2 x the group's size; simulated: a refused HCCL_BUFFSIZE "
          "fails the group's connect with torch_npu's message; the memory itself is not simulated"),
    Claim("adaptor frames", "a user's dist.gather, batch_isend_irecv (torch_npu's replacements, in "
          "torch_npu.distributed) and, after TorchAir's patch_for_hcom, dist.all_reduce, all_gather, "
          "all_gather_into_tensor, broadcast, all_to_all(_single) run the vendor's Python frames before the "
          "collective reaches the process group: they are not the user's call site",
          (_PT + "torch_npu/_init/patches/distributed_patches.py:26-62 (_PUBLIC_API_ALIASES)",
           "Ascend/torchair@fced8842 python/torchair/__init__.py:53-70 (patch_for_hcom)"),
          "simulated: the simulated torch_npu's replacements (xccl_ascend._torch_npu_sim) sit where torch_npu's do; "
          "Plugin.adaptor_modules names torch_npu, torchair and xccl_ascend, and the flight recorder, warnings and "
          "xccl preflight name the user's line above them (tests/test_preflight.py, tests/test_flight.py)"),
    Claim("the torch_npu release", "torch_npu pairs one release with each torch; 2.7.1 and 2.8.0 (and .post1) read "
          "the watchdog's mode from HCCL_ASYNC_ERROR_HANDLING only and take 0 or 1 (0-3 from .post2), map no "
          "PREMUL_SUM ('Unhandled ReduceOp') and no uint16/32/64 or float8 (both from .post4), and leave "
          "_AllGatherBase.backward to torch; every other claim here is 2.13.0's, and 2.9 to 2.12 are taken as 2.13.0 "
          "(not read)",
          ("Ascend/pytorch@9ae698c (tag v7.2.0-pytorch2.7.1), @def4860 (v7.2.0-pytorch2.8.0): torch_npu/csrc/core/"
           "npu/register/OptionsManager.cpp:203-213, OptionsManager.h:58, csrc/distributed/ProcessGroupHCCL.cpp:"
           "131-154, csrc/distributed/HCCLUtils.cpp:71-82, __init__.py:184-197",
           "Ascend/pytorch@3be71f4, @729dda3 (7.3.0 tags) OptionsManager.h:59; @d99d6cd, @f3ecfe4 (26.0.0 tags)",
           "Ascend/pytorch@9e73e70 COMPATIBILITY.en.md:24-33 (wheel to branch and CANN)",
           "the 7.3.x docs docs/zh/native_apis/pytorch_2-8-0/torch-distributed.md:49,56 (world sizes 3, 5, 6, 7)"),
          "simulated: the release in force (XCCL_SIM_TORCH_NPU, else the installed torch_npu, else the one paired "
          "with torch: 2.8.0 on torch 2.8; xccl_ascend._releases) decides the simulated group's reduce ops and dtypes "
          "(hccl_profile), the table (AscendRuntime.capabilities: premul_sum runs as a scale then a sum), the "
          "watchdog's variable and modes (xccl leaves TearDown where 2 is refused) and the patches "
          "(plugins/ascend/tests/test_ascend_releases.py)"),
)

_RANKS2: Final = "torchrun --standalone --nproc-per-node 2"
#: What only the hardware can settle, in the order to try it on the first Ascend machine, each with the command that
#: settles it (the ledger's "First hour on hardware").
HARDWARE: Final = (
    ("whether the installed torch_npu exports all_to_all_vc (the manifest read a 2.13.0 wheel that has it, the "
     "public 2.13.0 tags do not): xccl probes it either way", "xccl doctor | grep all_to_all_vc"),
    ("xccl's watchdog policy on real HCCL: mode 2 is in force and its watchdog only logs (no abort, no exception; "
     "does the process live when an event query fails, ProcessGroupHCCL.cpp:849-857?), a peer late by less than "
     "HCCL_EXEC_TIMEOUT kills no process, a later one reaches Python as CollectiveTimeout inside xccl's call (or "
     "only at the next stream synchronisation, which the check then reports), the world is connected at "
     "xccl.init, torch_npu's patches are in place (HCCL_CONNECT_TIMEOUT within CANN's [120, 7200]: the suite's "
     "late-rank connect checks need 2 s and skip; the connect item below settles them)",
     "HCCL_EXEC_TIMEOUT=4 HCCL_CONNECT_TIMEOUT=120 pytest --xccl-plugin ascend -k test_vendor_runtime"),
    ("HCCL_CONNECT_TIMEOUT outside CANN's [120, 7200] (xccl and the simulation take the nearest bound, with a "
     "warning): rank 1 is 200 s late to a new group's first collective; rank 0 fails with EI0006 after 2 s (HCCL "
     "honours 2), 120 s (it clamps; 140 s on CANN >= 8.2, whose wait is 20 s longer) or at once (it refuses), and "
     "the CollectiveTimeout names rank 1",
     "HCCL_CONNECT_TIMEOUT=2 torchrun --standalone --nproc-per-node 2 --no-python python -c \"import atexit, time, "
     "torch, xccl, torch.distributed as d; w = xccl.init(); g = d.new_group(); s = time.time(); "
     "atexit.register(lambda: print(w.rank, 'after', round(time.time() - s), 's')); time.sleep(200 * w.rank); "
     "d.all_reduce(torch.ones(1, device=w.device), group=g)\""),
    ("device memory one more HCCL communicator takes (2 x HCCL_BUFFSIZE, 400 MB), and that xccl.runtime.connect "
     "creates it",
     f"{_RANKS2} --no-python python -c \"import torch, torch_npu, xccl, torch.distributed as d; w = xccl.init(); "
     "f = torch.npu.mem_get_info()[0]; g = d.new_group(); xccl.runtime.connect(g); "
     "print(w.rank, (f - torch.npu.mem_get_info()[0]) >> 20, 'MB')\""),
    ("a world shrunk in place after rank 1 (not the last) is lost: what the survivors' next step raises at the "
     "synchronisation inside the try, and after how long (the script prints type and seconds; torch_npu's "
     "RuntimeError with EI0002 after HCCL_EXEC_TIMEOUT instead of PeerFailure means only the vendor spoke, a "
     "traceback from the watchdog's thread that it can throw there in any mode), whether the teardown returns, and "
     "then whether HCCL builds the survivors' communicator from the rank table xccl wrote beside RANK_TABLE_FILE "
     "(renumbered, the lost device left out) and computes right; a survivor's device memory before the loss and "
     "after the shrink (a communicator HcclCommDestroy refused as in use keeps 2 x HCCL_BUFFSIZE); with the watch "
     "off, whether EI0002 comes after HCCL_EXEC_TIMEOUT; with SHRINK_ABORT too. The command writes a report to "
     "send back",
     "RANK_TABLE_FILE=rank_table.json HCCL_EXEC_TIMEOUT=60 xccl doctor --first-hour --vendor ascend"),
    ("torch_npu's own _AllGatherBase.backward accepts xccl's world (its backend-name check)",
     f"{_RANKS2} --no-python python -c \"import torch, xccl; from torch.distributed.nn import functional as F; "
     "w = xccl.init(); x = torch.ones(2, device=w.device, requires_grad=True); "
     "F._all_gather_base(torch.empty(4, device=w.device), x).sum().backward(); print(w.rank, x.grad)\""),
    ("torch_npu's gather bypasses xccl, its batch_isend_irecv with CANN >= 9.0 on A2/A3 coalesces the group's own "
     "send/recv through xccl's dispatch (the sends return no work inside HCCL's coalescing), and the whole "
     "conformance suite on NPUs",
     "pytest --xccl-plugin ascend --xccl-world-sizes 2,8"),
    ("the first batch_isend_irecv of a group connects the whole group's communicator (a collective on it; the "
     "simulation requires every member): ranks 0 and 1 exchange on a new 3-rank group whose rank 2 is 200 s late; "
     "EI0006 after 120 s (140 s on CANN >= 8.2) on ranks 0 and 1 confirms it, 'ok' at once refutes it",
     "HCCL_CONNECT_TIMEOUT=120 torchrun --standalone --nproc-per-node 3 --no-python python -c \"import atexit, time, "
     "torch, xccl, torch.distributed as d; w = xccl.init(); g = d.new_group(); t = torch.ones(1, "
     "device=w.device); s = time.time(); atexit.register(lambda: print(w.rank, 'after', round(time.time() - s), "
     "'s')); time.sleep(200 * (w.rank == 2)); p = 1 - w.rank; w.rank < 2 and [x.wait() for x in "
     "d.batch_isend_irecv([d.P2POp(d.isend, t, p, g), d.P2POp(d.irecv, torch.empty_like(t), p, g)])]; "
     "t.cpu(); print(w.rank, 'ok')\""),
    ("a plain send/recv connects only a communicator of its own for the pair (not simulated): ranks 0 and 1 "
     "exchange at once on a new 3-rank group whose rank 2 is 200 s late, and each takes about 2 x "
     "P2P_HCCL_BUFFSIZE (40 MB) more device memory",
     "torchrun --standalone --nproc-per-node 3 --no-python python -c \"import time, torch, torch_npu, xccl, "
     "torch.distributed as d; w = xccl.init(); g = d.new_group(); t = torch.ones(1, device=w.device); "
     "f = torch.npu.mem_get_info()[0]; time.sleep(200 * (w.rank == 2)); s = time.time(); "
     "d.send(t, 1, g) if w.rank == 0 else d.recv(t, 0, g) if w.rank == 1 else None; torch.npu.synchronize(); "
     "print(w.rank, round(time.time() - s), 's', (f - torch.npu.mem_get_info()[0]) >> 20, 'MB')\""),
    ("all_gather_into_tensor and reduce_scatter_tensor on 6 ranks, which torch_npu 2.13's documentation excludes "
     "(3, 5, 6, 7; xccl warns once per group): an error, wrong values or right ones (rank r: o = [0, 0, 1, 1, ..., "
     "5, 5], r = [6r, 6r])",
     "torchrun --standalone --nproc-per-node 6 --no-python python -c \"import torch, xccl, torch.distributed as d; "
     "w = xccl.init(); x = torch.full((2,), float(w.rank), device=w.device); o = torch.empty(12, device=w.device); "
     "d.all_gather_into_tensor(o, x); r = torch.empty(2, device=w.device); d.reduce_scatter_tensor(r, o); "
     "print(w.rank, o.cpu().tolist(), r.cpu().tolist())\""),
    ("where a collective's failure surfaces (not simulated: the simulated wait() blocks the host): xccl.all_reduce "
     "returns once the stream waits, and HCCL's EI0002 after HCCL_EXEC_TIMEOUT reaches Python at the next "
     "synchronisation (here t.cpu()), outside xccl's typed errors: 'returned after 0 s' then a RuntimeError",
     "HCCL_EXEC_TIMEOUT=10 torchrun --standalone --nproc-per-node 2 --no-python python -c \"import time, torch, "
     "xccl; w = xccl.init(); t = torch.ones(4, device=w.device); time.sleep(40 * w.rank); s = time.time(); "
     "xccl.all_reduce(t); print(w.rank, 'returned after', round(time.time() - s), 's'); print(w.rank, "
     "t.cpu().tolist(), 'after', round(time.time() - s), 's')\""),
    ("HCCL_OP_EXPANSION_MODE=AIV caps the execution timeout at 1091 s (CANN envref_07_0078; xccl's policy and "
     "World.collective_timeout read HCCL_EXEC_TIMEOUT only): rank 0 fails after about 1091 s, not 1500",
     "HCCL_OP_EXPANSION_MODE=AIV HCCL_EXEC_TIMEOUT=1500 torchrun --standalone --nproc-per-node 2 --no-python python "
     "-c \"import atexit, time, torch, xccl; w = xccl.init(); print(w.rank, 'xccl bound', w.collective_timeout); "
     "t = torch.ones(1, device=w.device); s = time.time(); atexit.register(lambda: print(w.rank, 'after', "
     "round(time.time() - s), 's')); time.sleep(1300 * w.rank); xccl.all_reduce(t); t.cpu()\""),
    ("a group's hccl_config['hccl_exec_timeout'] bounds its collectives (ProcessGroupHCCL.cpp:3889-3904; CANN: "
     "the communicator's setting wins), which xccl's policy does not read: rank 0 fails after about 20 s while "
     "xccl's bound says 1836 s",
     "torchrun --standalone --nproc-per-node 2 --no-python python -c \"import atexit, time, torch, xccl, "
     "xccl_ascend; xccl_ascend.set_hccl_config({'hccl_exec_timeout': 20}); w = xccl.init(); print(w.rank, "
     "'xccl bound', w.collective_timeout); t = torch.ones(1, device=w.device); s = time.time(); "
     "atexit.register(lambda: print(w.rank, 'after', round(time.time() - s), 's')); time.sleep(60 * w.rank); "
     "xccl.all_reduce(t); t.cpu()\""),
    ("TORCH_HCCL_BLOCKING_WAIT=1 forces watchdog mode 0 and makes wait() block the host and raise there "
     "(ProcessGroupHCCL.cpp:1036-1063, :1205-1215), which xccl's policy does not read: xccl.all_reduce returns "
     "after about 40 s (it blocks) instead of at once",
     "TORCH_HCCL_BLOCKING_WAIT=1 torchrun --standalone --nproc-per-node 2 --no-python python -c \"import time, "
     "torch, xccl; w = xccl.init(); t = torch.ones(1, device=w.device); xccl.all_reduce(t); t.cpu(); "
     "time.sleep(40 * w.rank); s = time.time(); xccl.all_reduce(t); print(w.rank, 'returned after', "
     "round(time.time() - s), 's')\""),
    ("the TorchAir torch_npu 2.13 bundles (76ce3004, not public) against the vocabulary xccl derived at fced8842: "
     "a diff, or a missing anchor, shows what differs",
     "mkdir -p /tmp/ta/python && ln -s $(python -c 'import torch_npu, os; print(os.path.dirname(torch_npu.__file__))')"
     "/dynamo/torchair /tmp/ta/python/torchair && XCCL_TORCHAIR_CHECKOUT=/tmp/ta pytest "
     "plugins/ascend/tests/test_ascend_torchair.py -k derives"),
    ("GE's own dtype checks (does GE take bf16 or bool HCCL operators the IR prototypes omit?), the typed error "
     "through TorchAir's own backend, the CANN floor of graph send/recv, program order under StableRDFS without "
     "xccl's order joins: a 'conservative' cell means a dtype can move to native, 'WRONG' that the column "
     "over-claims (run it on a CANN below 8.6.0 too)",
     f"{_RANKS2} scripts/probe_torchair.py --json torchair.json"),
    ("a mixed-vendor world with an Ascend island (docs/mixed.md): the host staging of a group that spans islands "
     "(NPU tensors copied to the host and back around the gloo steps, never exercised in simulation, where every "
     "tensor is on the CPU); here with a CPU island on a second host, started the same way with XCCL_VENDOR=cpu "
     "and --node-rank 1: every rank prints [6.0, 6.0, 6.0, 6.0]",
     "XCCL_HETEROGENEOUS=1 torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr HOST "
     "--master-port 29500 --no-python python -c \"import torch, xccl, torch.distributed as d; w = xccl.init(); "
     "t = torch.ones(4, device=w.device) * (w.rank % 2 + 1); d.all_reduce(t); print(w.rank, w.plugin, "
     "t.cpu().tolist())\""),
)
