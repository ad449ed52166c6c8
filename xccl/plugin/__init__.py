"""The plugin SDK: everything a vendor plugin imports from xccl, and nothing else.

A plugin is a separate distribution with one entry point in the ``xccl.plugins`` namespace whose target is a
:class:`Plugin` (identity, a cheap probe, the capability table, the simulation profile). Its :class:`Runtime`
(device setup, process-group options, communicator names, kernels, graph converters, rank-table formats) is built
only once the plugin is selected. docs/plugin-guide.md walks through a plugin from nothing to conformant;
``examples/plugin-template`` is one that passes the conformance suite (``pytest --xccl-plugin NAME``).

What is here, by concern:

* the contract: :class:`Plugin`, :class:`Runtime`, :class:`ProbeResult`, :data:`PLUGIN_API_VERSION`, and
  :class:`Job` (the job's shape, as xccl hands it to :meth:`Runtime.place`);
* kernels: :class:`KernelContext` (what a kernel sees of its group), :data:`KERNEL_SIGNATURES` (the arguments of
  each kind of kernel) and the protocols that name them, :func:`kernel_problems` (the check the conformance suite
  runs), :func:`c10d_kernel` (the plain c10d call, for kernels that only add a check), :class:`Work` and
  :func:`finish` (a handle for kernels that compose several steps);
* the capability model: :class:`CapabilityTable` built with :func:`table_from` from :class:`Support` entries
  (:class:`Level`, :class:`Mode`, :class:`Collective`; :class:`Prefer` marks a native op that runs faster as a
  composition, by size and world size), :data:`PORTABLE` (the emulations any backend gets),
  :func:`graph_entries` (a graph column for plugins without converters), reduce-op names, vendor SDK versions
  (:func:`version_key`, :func:`version_below`: the order ``Support.min_sdk`` floors are compared in);
* discovery: :class:`Registry`, :class:`PluginInfo`, :class:`Status`, :func:`plugins`;
* the vendor's run-time behaviour as data (:class:`VendorRuntime`: :class:`Completion`, :class:`Watchdog` and
  :class:`ErrorHandling`, :class:`LazyConnect`, :class:`CommMemory`, :class:`TorchPatch`, :class:`VendorFault`
  and :class:`Fault`), which xccl acts on and the simulation reproduces;
* the job: :func:`job_env` returns a :class:`JobEnv` (rank, world size, local rank and size, node, rendezvous
  address and which launcher said so: torchrun, Slurm, LSF, Kubeflow, MPI); :class:`Job` is what xccl places a
  runtime for (:meth:`Runtime.place`);
* the CPU simulation: :class:`SimProfile` and the simulated process group, and the simulated SDK's patches of
  ``torch.distributed`` (:func:`install_patches`, :func:`remove_patches`);
* rank tables: :class:`RankTableFormat` (a plugin's format for ``xccl rank-table``), the JSON reading kit that
  reports every defect as a :class:`~xccl.RankTableError` with its JSON path;
* the errors a plugin raises, and :func:`warn_at_user` for warnings that name the user's line.
"""

from ..errors import (
    BackendUnavailable,
    ConstraintViolation,
    InitError,
    InvalidArgument,
    RankTableError,
    UnsupportedCollective,
    XcclError,
)
from ._c10d import c10d_kernel
from ._capabilities import (
    AGREED_SIZE,
    ALL_DTYPES,
    ALL_REDUCE_OPS,
    COMPLEX_DTYPES,
    COMPLEX_REDUCE_OPS,
    NATIVE,
    REAL_DTYPES,
    UNSUPPORTED,
    CapabilityTable,
    Collective,
    Level,
    Mode,
    Prefer,
    Resolution,
    Support,
    reduce_op_name,
    reduce_op_of,
    table_from,
)
from ._contract import PLUGIN_API_VERSION, Plugin, ProbeResult, Runtime
from ._entries import PORTABLE
from ._graph_column import GRAPH_FORMS, graph_entries
from ._job import Job
from ._jobenv import JobEnv, job_env
from ._kernels import (
    KERNEL_SIGNATURES,
    AllGatherMMKernel,
    AllToAllVKernel,
    CollectiveKernel,
    KernelContext,
    MMAllReduceKernel,
    MMReduceScatterKernel,
    UnevenAllGatherKernel,
    UnevenReduceScatterKernel,
    kernel_problems,
    kernels_problems,
)
from ._ranktable import (
    INTEGER,
    RankTableFormat,
    StrPath,
    any_string,
    as_object,
    check_device_ids,
    check_ranks,
    describe,
    dump,
    is_ipv4,
    json_type,
    load_rank_table,
    non_negative,
    nonempty_list,
    optional_ipv4,
    read_json,
    require,
)
from ._registry import PluginInfo, Registry, Status, default_registry, plugins
from ._sim import (
    NATIVE_OP_KEYS,
    REDUCE_OP_NAMES,
    SimProfile,
    SimulatedProcessGroup,
    SimulatedVendorError,
    base_class_message,
    register_simulated_backend,
    simulated_backend_of,
    simulated_group_of,
)
from ._sim_runtime import install_patches, installed_patches, remove_patches
from ._vendor_runtime import (
    CommMemory,
    Completion,
    ErrorHandling,
    Fault,
    LazyConnect,
    TorchPatch,
    VendorFault,
    VendorRuntime,
    Watchdog,
)
from ._versions import version_below, version_key
from ._warn import user_stacklevel, warn_at_user
from ._work import Work, finish

__all__ = [
    "AGREED_SIZE",
    "ALL_DTYPES",
    "ALL_REDUCE_OPS",
    "INTEGER",
    "COMPLEX_DTYPES",
    "COMPLEX_REDUCE_OPS",
    "GRAPH_FORMS",
    "KERNEL_SIGNATURES",
    "NATIVE",
    "NATIVE_OP_KEYS",
    "PLUGIN_API_VERSION",
    "PORTABLE",
    "REAL_DTYPES",
    "REDUCE_OP_NAMES",
    "UNSUPPORTED",
    "AllGatherMMKernel",
    "AllToAllVKernel",
    "BackendUnavailable",
    "CapabilityTable",
    "CommMemory",
    "Completion",
    "Collective",
    "CollectiveKernel",
    "ConstraintViolation",
    "ErrorHandling",
    "Fault",
    "InitError",
    "InvalidArgument",
    "JobEnv",
    "Job",
    "KernelContext",
    "LazyConnect",
    "Level",
    "MMAllReduceKernel",
    "MMReduceScatterKernel",
    "Mode",
    "Plugin",
    "PluginInfo",
    "Prefer",
    "ProbeResult",
    "RankTableError",
    "RankTableFormat",
    "Registry",
    "Resolution",
    "Runtime",
    "SimProfile",
    "SimulatedProcessGroup",
    "SimulatedVendorError",
    "StrPath",
    "Status",
    "Support",
    "TorchPatch",
    "UnevenAllGatherKernel",
    "UnevenReduceScatterKernel",
    "UnsupportedCollective",
    "VendorFault",
    "VendorRuntime",
    "Watchdog",
    "Work",
    "XcclError",
    "any_string",
    "as_object",
    "base_class_message",
    "c10d_kernel",
    "check_device_ids",
    "check_ranks",
    "default_registry",
    "describe",
    "dump",
    "finish",
    "graph_entries",
    "install_patches",
    "installed_patches",
    "is_ipv4",
    "job_env",
    "json_type",
    "kernel_problems",
    "kernels_problems",
    "load_rank_table",
    "non_negative",
    "nonempty_list",
    "optional_ipv4",
    "plugins",
    "read_json",
    "reduce_op_name",
    "reduce_op_of",
    "register_simulated_backend",
    "remove_patches",
    "require",
    "simulated_backend_of",
    "simulated_group_of",
    "table_from",
    "version_below",
    "version_key",
    "user_stacklevel",
    "warn_at_user",
]
