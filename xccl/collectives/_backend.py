"""xccl's torch.distributed backend: its registration, and the creator torch calls for every group of it.

``xccl.init`` registers a backend named ``xccl_<vendor backend>`` (:func:`register_backend`) and creates the world
on it; torch then calls the creator (:class:`_Creator`) for every group of that backend, whoever creates it (``xccl``,
``dist.new_group``, DeviceMesh, FSDP's helpers): a group of one vendor is an
:class:`~._process_group.XcclProcessGroup` over the vendor's own group (:func:`_vendor_group`), a group spanning
islands of a mixed-vendor world a :class:`~._mixed.MixedProcessGroup`. Groups created by third-party code get the
vendor's options from the plugin (``Runtime.process_group_options``), which SCCL needs: it refuses to create a group
without ``ProcessGroupSCCLOptions``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from ..errors import InitError
from ..plugin._capabilities import Collective
from ..plugin._contract import Runtime
from ..plugin._fake_world import transport
from ..plugin._vendor_runtime import Completion
from ._mixed import mixed_group
from ._plan import warn_once
from ._process_group import PREFIX, BackendName, XcclProcessGroup, backend_name
from ._state import PROCESS
from ._watchdog import group_timeout

__all__ = ["PREFIX", "TimeoutWarning", "backend_name", "needs_host_side", "register_backend"]

LOG = logging.getLogger("xccl")
#: Backend names torch compares with when it creates a group (``_new_process_group_helper``, ``BackendConfig``):
#: xccl's name must never compare equal to one of them, or torch would build its own group instead of xccl's.
_TORCH_OWN: Final = frozenset({"undefined", "gloo", "nccl", "ucc", "mpi", "xccl", "fake"})


def needs_host_side(runtime: Runtime) -> bool:
    """Whether the plugin needs a host-side gloo group: its table stages point-to-point through one, or its works
    complete at once, so the barrier blocks the host on one (``_host_barrier``)."""
    if runtime.plugin.vendor_runtime().completion is Completion.AT_ONCE:
        return True
    table = runtime.capabilities()
    return any(table.entry(op).via == "host_gloo" for op in (Collective.SEND, Collective.RECV))


def register_backend(runtime: Runtime) -> str:
    """Register xccl's backend for ``runtime`` with torch.distributed (once per process); returns its name.

    The creator reads the runtime from xccl's state when torch calls it, so one registration serves every
    ``xccl.init`` of the process. Over a vendor backend torch does not know itself, ``dist.get_backend`` returns
    the name as a :class:`BackendName`, equal to the vendor's name as well.
    """
    name = backend_name(runtime)
    if name.upper() not in dist.Backend._plugins:
        if runtime.backend not in _TORCH_OWN and not hasattr(dist.Backend, name.upper()):
            # register_backend keeps an attribute that exists: this is what Backend(name) returns from now on.
            setattr(dist.Backend, name.upper(), BackendName(name, runtime.backend))
        dist.Backend.register_backend(name, _Creator(name), extended_api=True, devices=[runtime.device_type])
    return name


class _Creator:
    """The creator torch calls for every group of an ``xccl_<backend>`` backend."""

    def __init__(self, name: str) -> None:
        self.name: Final = name

    def __call__(self, options: Any, pg_options: Any) -> XcclProcessGroup:
        runtime = PROCESS.runtime
        if runtime is None or backend_name(runtime) != self.name:
            raise InitError(
                f"torch.distributed creates a group of xccl's backend {self.name!r}, but xccl has not prepared it in "
                "this process: call xccl.init() (or xccl.process_group_backend()) before creating groups on it"
            )
        if PROCESS.job is None and PROCESS.job_at is not None:
            _place_world(runtime, options)
        if pg_options is None:
            # A group created by third-party code (DeviceMesh, FSDP, Megatron-style builders): the vendor's options.
            world = None if not dist.is_initialized() else list(options.global_ranks_in_group)
            pg_options = runtime.process_group_options(world)
        given = options.timeout  # a mixed group's host (gloo) groups keep it: no vendor watchdog watches them
        watchdog = runtime.plugin.vendor_runtime().watchdog
        if watchdog is not None:
            # Every group, whoever creates it: the vendor's watchdog never gets a timeout at or below its floor.
            decided = group_timeout(watchdog, options.timeout)
            if decided.note is not None:
                warn_once(("timeout", runtime.plugin.name), f"xccl: {decided.note}.", TimeoutWarning)
            options.timeout = decided.timeout
        world_map = PROCESS.world_map
        if world_map is not None and len(world_map.split(_members(options))) > 1:
            return mixed_group(runtime, world_map, options, pg_options, self.name, given, _vendor_group)
        return _vendor_group(runtime, self.name, options, pg_options)


def _members(options: Any) -> list[int]:
    """The global ranks of a group being created, in group order (torch leaves them empty for the world)."""
    return list(options.global_ranks_in_group) or list(range(options.group_size))


def _vendor_group(runtime: Runtime, name: str, options: Any, pg_options: Any) -> XcclProcessGroup:
    """xccl's group over the vendor's own group of ``options``' members (and its host-side gloo group where the
    plugin needs one): every group of one vendor, and each island's part of a mixed group."""
    t = time.perf_counter()
    native = runtime.create_native_group(options, pg_options)
    t = PROCESS.lap("native group", t)
    side = None
    if needs_host_side(runtime):
        side = transport().gloo(PrefixStore("xccl.side", options.store), options.group_rank, options.group_size,
                                options.timeout)
        PROCESS.lap("host-side gloo group", t)
    LOG.debug("xccl group %s (%s) of %d ranks over %s", options.group_id, name, options.group_size,
              type(native).__name__)
    return XcclProcessGroup(options, native, side, name, runtime.device_type, pg_options)


def _place_world(runtime: Runtime, options: Any) -> None:
    """Place this process when a framework creates the world on xccl's backend (after ``process_group_backend``).

    The world's group is the first one torch creates, and its options carry this rank and the world's size, which
    the framework may have given only as arguments (Lightning, Ray Train); the launcher's variables exist by now.
    Placed before the vendor's group is created: vendors that bind a group to the current device (SCCL takes the
    current TPU stream in its constructor) need the device set first.
    """
    job_at = PROCESS.job_at
    if job_at is None:  # pragma: no cover - the caller checked
        return
    job = job_at(options.group_rank, options.group_size)
    PROCESS.device = runtime.place(job)
    PROCESS.job, PROCESS.job_at = job, None


class TimeoutWarning(UserWarning):
    """The timeout given to xccl is not what bounds a collective on this vendor (warned once per process)."""

