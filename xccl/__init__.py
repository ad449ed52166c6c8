"""xccl: one vendor-neutral collective-communication API over ``torch.distributed``.

``xccl.init()`` selects a vendor plugin (Ascend HCCL, Sophgo SCCL, CUDA NCCL, CPU gloo, or any installed
third-party one), sets the device and creates the process group with the vendor's options. Every collective then
dispatches to the vendor's native kernel, to an emulation composed of what the vendor has, or fails before any
communication with a typed error. ``xccl.capabilities(name)`` tells which, as data.

Importing xccl imports torch but no vendor SDK: plugins are discovered from entry-point metadata and their SDKs
are imported only once selected.
"""

from torch.distributed import ReduceOp

from .plugin._capabilities import CapabilityTable, Collective, Level, Mode, Resolution, Support, table_from
from .collectives._dispatch import (
    EmulationWarning,
    all_gather,
    all_gather_into_tensor,
    all_gather_into_tensor_uneven,
    all_reduce,
    all_to_all,
    all_to_all_single,
    all_to_all_v,
    barrier,
    broadcast,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    reduce_scatter_tensor_uneven,
    scatter,
    send,
)
from .errors import (
    BackendNotFound,
    BackendUnavailable,
    CollectiveMismatch,
    CollectiveTimeout,
    ConstraintViolation,
    InitError,
    InvalidArgument,
    PeerFailure,
    RankTableError,
    RendezvousTimeout,
    UnsupportedCollective,
    XcclError,
)
from .fused._api import all_gather_mm, mm_all_reduce, mm_reduce_scatter
from .graph import compile, functional, patch_collectives
from .runtime._init import DEFAULT_TIMEOUT, World, comm_name, get_world, init, new_group, shutdown
from .runtime._parallel import ParallelGroup, ParallelGroups, parallel_groups, parallel_layout
from .plugin._contract import PLUGIN_API_VERSION, Plugin, ProbeResult, Runtime
from .plugin._registry import PluginInfo, Registry, Status, capabilities, plugins
from .plugin._sim import SimProfile

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "PLUGIN_API_VERSION",
    "BackendNotFound",
    "BackendUnavailable",
    "CapabilityTable",
    "Collective",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConstraintViolation",
    "EmulationWarning",
    "InitError",
    "InvalidArgument",
    "Level",
    "Mode",
    "ParallelGroup",
    "ParallelGroups",
    "PeerFailure",
    "Plugin",
    "PluginInfo",
    "ProbeResult",
    "RankTableError",
    "ReduceOp",
    "Registry",
    "RendezvousTimeout",
    "Resolution",
    "Runtime",
    "SimProfile",
    "Status",
    "Support",
    "UnsupportedCollective",
    "World",
    "XcclError",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_gather_mm",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "broadcast",
    "capabilities",
    "comm_name",
    "compile",
    "gather",
    "functional",
    "get_world",
    "init",
    "irecv",
    "isend",
    "mm_all_reduce",
    "mm_reduce_scatter",
    "new_group",
    "parallel_groups",
    "parallel_layout",
    "patch_collectives",
    "plugins",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_uneven",
    "scatter",
    "send",
    "shutdown",
    "table_from",
]
