"""xccl: one vendor-neutral collective-communication API over ``torch.distributed``.

``xccl.init()`` selects a vendor plugin (Ascend HCCL, Sophgo SCCL, CUDA NCCL, CPU gloo, or any installed
third-party one), sets the device and creates the world on xccl's process group, so that every collective, from
``xccl.<op>`` or from ``torch.distributed`` (DDP, FSDP2, DTensor), dispatches to the vendor's native kernel, to an
emulation composed of what the vendor has, or fails before any communication with a typed error.
``xccl.capabilities(name)`` tells which, as data.

Importing xccl imports no vendor SDK, and not even torch until a name that needs it is used: plugins are
discovered from entry-point metadata and their SDKs are imported only once selected. The names below load on first
use (PEP 562), so ``import xccl`` costs little beyond ``import torch`` (``benchmarks/import_time.py``) and the
``xccl`` command's ``--help`` none; the layers and where each name lives are in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from .errors import (
    BackendNotFound,
    BackendUnavailable,
    CollectiveMismatch,
    CollectiveTimeout,
    ConstraintFallbackWarning,
    ConstraintViolation,
    EmulationWarning,
    InitError,
    InvalidArgument,
    InvalidArgumentType,
    MissingExtra,
    PeerFailure,
    PluginContractError,
    RankTableError,
    RendezvousTimeout,
    UnsupportedCollective,
    UnsupportedTorch,
    XcclError,
)
from .ops._torch import require_floor

# Before any layer imports torch: below the floor, the first would fail at torch.uint16 with no word of why.
require_floor()

__version__ = "0.1.0"

#: Public name -> the module that defines it, imported on first access.
_LAZY: Final = {
    "ReduceOp": "torch.distributed",
    # the collectives (eager dispatch, or the graph form while torch.compile traces)
    **dict.fromkeys(
        (
            "P2POp", "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_uneven",
            "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single",
            "all_to_all_v", "barrier", "batch_isend_irecv", "broadcast", "gather", "irecv", "isend",
            "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
            "reduce_scatter_tensor_uneven", "scatter", "send",
        ),
        "xccl.api",
    ),
    # the lifecycle
    **dict.fromkeys(
        ("DEFAULT_TIMEOUT", "World", "capabilities", "comm_name", "get_world", "init", "new_group",
         "process_group_backend", "shutdown"),
        "xccl.runtime._init",
    ),
    **dict.fromkeys(("ParallelGroup", "ParallelGroups", "parallel_groups", "parallel_layout"),
                    "xccl.runtime._parallel"),
    **dict.fromkeys(("BackendName", "XcclProcessGroup"), "xccl.collectives._process_group"),
    "TimeoutWarning": "xccl.collectives._backend",
    **dict.fromkeys(("Island", "WorldMap"), "xccl.collectives._islands"),
    # the capability model and plugins
    **dict.fromkeys(
        ("PLUGIN_API_VERSION", "CapabilityTable", "Collective", "KernelContext", "Level", "Mode", "Plugin",
         "ProbeResult", "Registry", "Runtime", "SimProfile", "Support", "table_from"),
        "xccl.plugin",
    ),
    **dict.fromkeys(("PluginInfo", "Status", "plugins"), "xccl.plugin._registry"),
    "Resolution": "xccl.plugin._capabilities",
    # graph mode and fused ops
    **dict.fromkeys(("compile", "functional", "graph_ops"), "xccl.graph"),
    "patch_collectives": "xccl.api._patch",
    **dict.fromkeys(("dump_trace", "trace_summary"), "xccl.runtime._trace"),
    **dict.fromkeys(("all_gather_mm", "mm_all_reduce", "mm_reduce_scatter"), "xccl.fused._api"),
}

__all__ = [
    "BackendName",
    "BackendNotFound",
    "BackendUnavailable",
    "CapabilityTable",
    "Collective",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConstraintFallbackWarning",
    "ConstraintViolation",
    "DEFAULT_TIMEOUT",
    "EmulationWarning",
    "InitError",
    "InvalidArgument",
    "InvalidArgumentType",
    "Island",
    "KernelContext",
    "Level",
    "MissingExtra",
    "Mode",
    "P2POp",
    "PLUGIN_API_VERSION",
    "ParallelGroup",
    "ParallelGroups",
    "PeerFailure",
    "Plugin",
    "PluginContractError",
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
    "TimeoutWarning",
    "UnsupportedCollective",
    "UnsupportedTorch",
    "World",
    "WorldMap",
    "XcclError",
    "XcclProcessGroup",
    "__version__",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_gather_mm",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "capabilities",
    "comm_name",
    "compile",
    "dump_trace",
    "functional",
    "gather",
    "get_world",
    "graph_ops",
    "init",
    "irecv",
    "isend",
    "mm_all_reduce",
    "mm_reduce_scatter",
    "monitored_barrier",
    "new_group",
    "parallel_groups",
    "parallel_layout",
    "patch_collectives",
    "plugins",
    "process_group_backend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_uneven",
    "scatter",
    "send",
    "shutdown",
    "table_from",
    "trace_summary",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xccl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from torch.distributed import ReduceOp

    from .api import (
        P2POp,
        all_gather,
        all_gather_coalesced,
        all_gather_into_tensor,
        all_gather_into_tensor_uneven,
        all_gather_single,
        all_reduce,
        all_reduce_coalesced,
        all_to_all,
        all_to_all_single,
        all_to_all_v,
        barrier,
        batch_isend_irecv,
        broadcast,
        gather,
        irecv,
        isend,
        monitored_barrier,
        recv,
        reduce,
        reduce_scatter,
        reduce_scatter_single,
        reduce_scatter_tensor,
        reduce_scatter_tensor_uneven,
        scatter,
        send,
    )
    from .api._patch import patch_collectives
    from .collectives._backend import TimeoutWarning
    from .collectives._islands import Island, WorldMap
    from .collectives._process_group import BackendName, XcclProcessGroup
    from .fused._api import all_gather_mm, mm_all_reduce, mm_reduce_scatter
    from .graph import compile, functional, graph_ops
    from .plugin import (
        PLUGIN_API_VERSION,
        CapabilityTable,
        Collective,
        KernelContext,
        Level,
        Mode,
        Plugin,
        ProbeResult,
        Registry,
        Runtime,
        SimProfile,
        Support,
        table_from,
    )
    from .plugin._capabilities import Resolution
    from .plugin._registry import PluginInfo, Status, plugins
    from .runtime._init import (
        DEFAULT_TIMEOUT,
        World,
        capabilities,
        comm_name,
        get_world,
        init,
        new_group,
        process_group_backend,
        shutdown,
    )
    from .runtime._parallel import ParallelGroup, ParallelGroups, parallel_groups, parallel_layout
