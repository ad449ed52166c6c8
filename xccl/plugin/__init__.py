"""The plugin SDK: what a vendor plugin imports from xccl, and nothing else.

A plugin is a separate distribution with one entry point in the ``xccl.plugins`` namespace whose target is a
:class:`Plugin` (identity, a cheap probe, the capability table, the simulation profile, the vendor's run-time
behaviour). Its :class:`Runtime` (device setup, process-group options, communicator names, kernels, graph
converters) is built only once the plugin is selected, and ``xccl.init`` checks both against the contract then.
``xccl new-plugin NAME`` writes a plugin that passes the conformance kit. docs/plugin-guide.md documents every name
below, by concern: the contract, kernels, the capability table, the CPU simulation, the vendor's run-time behaviour,
the cost model, the job, the registry, rank tables, graph compilers, and the errors a plugin raises.

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
from ._graph_checks import GraphCheck, NodeProblem, report_graph_check
from ._graph_column import PORTABLE, graph_entries
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
from ._sim_stream import SimStream, simulated_stream
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
    "SimStream",
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
    "simulated_stream",
    "table_from",
    "version_below",
    "warn_at_user",
]
