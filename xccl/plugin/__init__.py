"""The plugin SDK: what a vendor plugin imports from xccl, and nothing else.

A plugin is a separate distribution with one entry point in the ``xccl.plugins`` namespace whose target is a
:class:`Plugin` (identity, a cheap probe, the capability table, the simulation profile, the vendor's run-time
behaviour). Its :class:`Runtime` (device setup, process-group options, communicator names, kernels, graph
converters) is built only once the plugin is selected, and ``xccl.init`` checks both against the contract then.
``xccl new-plugin NAME`` writes a plugin that passes the conformance kit; docs/plugin-guide.md documents every name
below. What is here, by concern:

* the contract: :class:`Plugin`, :class:`Runtime`, :class:`ProbeResult`, :data:`PLUGIN_API_VERSION`;
* kernels: :class:`KernelContext` (what a kernel sees of its group), :data:`KERNEL_SIGNATURES` (the arguments of
  each kind of kernel), :func:`c10d_kernel` (the plain c10d call, for kernels that only add a check), :class:`Work`
  and :func:`finish` (a handle for kernels that compose several steps);
* the capability table: :class:`CapabilityTable` built with :func:`table_from` from :class:`Support` entries
  (:class:`Level`, :class:`Mode`, :class:`Collective`; :class:`Prefer` and :data:`AGREED_SIZE` for a native op
  that runs faster as a composition), :data:`PORTABLE` (the emulations any backend gets), :func:`graph_entries`
  (a graph column derived from the eager one), :data:`ALL_DTYPES`, reduce-op names (:func:`reduce_op_name`,
  :func:`reduce_op_of`), :func:`version_below` (how ``Support.min_sdk`` floors compare);
* the CPU simulation: :class:`SimProfile`, :func:`simulated_backend_of`, :func:`simulated_group_of` (the gloo
  group under a simulated one, for a simulated SDK's own functions), and the simulated SDK's patches of
  ``torch.distributed`` (:func:`install_patches`, :func:`remove_patches`, :func:`installed_patches`);
* the vendor's run-time behaviour as data: :class:`VendorRuntime` (:class:`Completion`, :class:`Watchdog` and
  :class:`ErrorHandling`, :class:`LazyConnect`, :class:`CommMemory`, :class:`TorchPatch`, :class:`VendorFault`
  and :class:`Fault`), which xccl acts on and the simulation reproduces;
* the communication cost model as data (``xccl preflight`` prices calls with it): :class:`CostModel` of
  :class:`LinkCost` per op and link kind, nccl-tests' :func:`bus_factor` (:data:`BUS_FACTOR`), and
  :func:`cost_rows` (the model as docs/fidelity.md's rows);
* the job: :func:`job_env` returns a :class:`JobEnv` (rank, world size, local rank and size, node, rendezvous
  address, and which launcher said so); :class:`Job` is what xccl places a runtime for (:meth:`Runtime.place`);
* running a plugin without packaging it: :class:`Registry` (``Registry.from_plugins(MyPlugin())``);
* rank tables: :class:`RankTableFormat` (a plugin's format for ``xccl rank-table``) and the JSON reading kit that
  reports every defect as a :class:`RankTableError` with its JSON path (:func:`load_rank_table`,
  :func:`read_json`, :func:`as_object`, :func:`require`, :func:`nonempty_list`, :func:`json_type`,
  :func:`describe`, :func:`non_negative`, :func:`any_string`, :func:`optional_ipv4`, :func:`is_ipv4`,
  :func:`check_ranks`, :func:`check_device_ids`, :func:`dump`, :data:`INTEGER`, :data:`StrPath`);
* graph compilers: :func:`report_graph_check` (what a vendor's compiler found in a graph: :class:`GraphCheck`,
  :class:`NodeProblem`), which ``xccl preflight`` reports per compiled region;
* the errors a plugin raises, and :func:`warn_at_user` for warnings that name the user's line.

Everything else of the package is xccl's own: the discovery listing (``xccl.plugins()``, ``xccl.PluginInfo``), the
simulated process group, the kernel protocols and checks (``xccl.init`` runs them).
"""

from ..errors import (
    BackendUnavailable,
    ConstraintViolation,
    InitError,
    InvalidArgument,
    RankTableError,
    UnsupportedCollective,
)
from ..ops._warn import warn_at_user
from ._c10d import c10d_kernel
from ._capabilities import (
    AGREED_SIZE,
    ALL_DTYPES,
    CapabilityTable,
    Collective,
    Level,
    Mode,
    Prefer,
    Support,
    reduce_op_name,
    reduce_op_of,
    table_from,
)
from ._contract import PLUGIN_API_VERSION, Plugin, ProbeResult, Runtime
from ._cost import BUS_FACTOR, CostModel, LinkCost, bus_factor, cost_rows
from ._entries import PORTABLE
from ._graph_checks import GraphCheck, NodeProblem, report_graph_check
from ._graph_column import graph_entries
from ._job import Job
from ._jobenv import JobEnv, job_env
from ._kernels import KERNEL_SIGNATURES, KernelContext
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
from ._registry import Registry
from ._sim import SimProfile, simulated_backend_of, simulated_group_of
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
from ._versions import version_below
from ._work import Work, finish

__all__ = [
    "AGREED_SIZE",
    "ALL_DTYPES",
    "BUS_FACTOR",
    "INTEGER",
    "KERNEL_SIGNATURES",
    "PLUGIN_API_VERSION",
    "PORTABLE",
    "BackendUnavailable",
    "CapabilityTable",
    "Collective",
    "CommMemory",
    "Completion",
    "ConstraintViolation",
    "CostModel",
    "ErrorHandling",
    "Fault",
    "GraphCheck",
    "InitError",
    "InvalidArgument",
    "Job",
    "JobEnv",
    "KernelContext",
    "LazyConnect",
    "LinkCost",
    "Level",
    "Mode",
    "NodeProblem",
    "Plugin",
    "Prefer",
    "ProbeResult",
    "RankTableError",
    "RankTableFormat",
    "Registry",
    "Runtime",
    "SimProfile",
    "StrPath",
    "Support",
    "TorchPatch",
    "UnsupportedCollective",
    "VendorFault",
    "VendorRuntime",
    "Watchdog",
    "Work",
    "any_string",
    "as_object",
    "bus_factor",
    "cost_rows",
    "c10d_kernel",
    "check_device_ids",
    "check_ranks",
    "describe",
    "dump",
    "finish",
    "graph_entries",
    "install_patches",
    "installed_patches",
    "is_ipv4",
    "job_env",
    "json_type",
    "load_rank_table",
    "non_negative",
    "nonempty_list",
    "optional_ipv4",
    "read_json",
    "reduce_op_name",
    "reduce_op_of",
    "remove_patches",
    "report_graph_check",
    "require",
    "simulated_backend_of",
    "simulated_group_of",
    "table_from",
    "version_below",
    "warn_at_user",
]
