"""xccl's state in a process, in parts, and the state of each process group.

The process state is split into parts (``xccl.ops._parts.Part``), each owned by the floor that uses it and each with
its own reset; ``xccl.shutdown`` resets every part. The parts here are the collectives floor's:

* :data:`PROCESS`: the world (``xccl.init``'s :class:`World`), the selected runtime, this process's place in the
  job, the policies, the vendor's watchdog settings, the mixed-vendor world's map, the start-up laps;
* :data:`GROUPS`: one :class:`GroupState` per process group, and the once-per-op warnings.

The observers keep theirs where they live: the flight recorder's ring (``_flight.FLIGHT``), the mismatch detector
(``_check._run.DETECTOR``); the graph path its order tokens (``xccl.graph._group.GRAPH``).

A :class:`GroupState` is one process group as dispatch sees it. Its kind is its type: a group of one vendor is a
:class:`~._vendor.VendorGroup` (its kernels planned from the vendor's capability table), a group spanning the islands
of a mixed-vendor world a :class:`~._mixed.MixedGroup`. Each carries its own call pipeline (``issue``, built from the
group's hooks by ``_hooks``). Which state a process group has is ``_groups``' business.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import torch
import torch.distributed as dist

from ..errors import UnsupportedCollective
from ..ops._parts import Part, reset
from ..ops._vocab import Collective
from ..plugin._capabilities import CapabilityTable
from ..plugin._contract import Runtime
from ..plugin._job import Job
from ..plugin._kernels import KernelContext
from ._islands import WorldMap
from ._scratch import Scratch
from ._watchdog import WatchdogSettings

__all__ = [
    "ARRIVED", "DEFAULT_TIMEOUT", "GROUPS", "PROCESS", "Fallback", "GroupState", "Groups", "Part", "Process", "World",
    "mark_arrival", "missing_members", "reset",
]

Fallback = Literal["emulate", "warn", "error"]
Kernel = Callable[..., Any]

#: Default collective timeout: long enough for a slow first step, short enough that a hang becomes an error
#: within minutes, not torch's 30. Override with ``timeout=`` or ``XCCL_TIMEOUT`` (seconds).
DEFAULT_TIMEOUT: Final = _dt.timedelta(seconds=300)


# --------------------------------------------------------------------------------------------------- the parts


@final
@dataclass(frozen=True, slots=True)
class World:
    """What ``xccl.init`` set up (or adopted) in this process."""

    rank: int
    world_size: int
    local_rank: int
    #: The device this rank computes on (``cpu`` in simulation).
    device: torch.device
    #: Name of the selected plugin.
    plugin: str
    #: The vendor's torch.distributed backend under the groups (``gloo``, ``nccl``, ``hccl``, ``sccl``).
    backend: str
    #: True when a vendor plugin runs in CPU simulation.
    simulate: bool = False
    #: The fallback policy for collectives the backend lacks.
    fallback: Fallback = "warn"
    #: True when the collective-mismatch detector is on.
    check: bool = False
    #: The world group's timeout, as the vendor's group got it: on a vendor with a watchdog, xccl keeps it above
    #: the vendor's own execution timeout (``xccl.collectives._watchdog``), so it may differ from the one given.
    timeout: _dt.timedelta = DEFAULT_TIMEOUT
    #: The torch.distributed backend name of the world group: xccl's (``xccl_<backend>``) when xccl created it,
    #: the vendor's when xccl adopted a world created by someone else.
    process_group_backend: str = ""
    #: True when the world was created outside xccl and adopted by ``xccl.init``.
    adopted: bool = False
    #: How long a collective on the world waits before it fails: :attr:`timeout`, or the vendor's own execution
    #: timeout where that comes first (HCCL_EXEC_TIMEOUT on Ascend).
    collective_timeout: _dt.timedelta = DEFAULT_TIMEOUT
    #: The mixed-vendor world's map (which rank runs which plugin where, the islands), when ``xccl.init`` was
    #: given ``heterogeneous=True`` (or ``XCCL_HETEROGENEOUS=1``); None otherwise.
    map: WorldMap | None = None


@dataclass
class Process(Part):
    """The world and how this process takes part in it (set by ``xccl.runtime``, read by every floor above)."""

    world: World | None = None
    #: The arguments of the ``xccl.init`` call that made ``world`` (a second call with others is refused).
    args: tuple[Any, ...] | None = None
    #: The selected plugin's runtime; set by ``init`` and by ``process_group_backend`` (before any group exists).
    runtime: Runtime | None = None
    #: This process's place in the job and the device :meth:`Runtime.place` chose for it: set by ``init`` before
    #: it creates the world, or by the creator of the world's group after ``process_group_backend``.
    job: Job | None = None
    device: torch.device | None = None
    #: After ``process_group_backend``: ``(rank, world size) -> Job``, how the creator of the world's group
    #: describes the job (a framework may create the world before its launcher's variables exist).
    job_at: Callable[[int, int], Job] | None = None
    fallback: Fallback = "warn"
    check: bool = False
    #: This rank's liveness port and store address, to name the lost ranks at a fault (``_health._liveness.Liveness``).
    liveness: Any = None
    #: Seconds each phase of this process's ``xccl.init`` took, in order (``benchmarks/startup.py`` shows them).
    phases: dict[str, float] = field(default_factory=dict)
    #: The vendor's watchdog settings in force (``_watchdog``), when the plugin declares a watchdog.
    watchdog: WatchdogSettings | None = None
    #: The mixed-vendor world's map (``_islands``), built by the world check; None unless the switch is on.
    world_map: WorldMap | None = None

    def lap(self, name: str, since: float) -> float:
        """Add the time from ``since`` (``time.perf_counter()``) to now to phase ``name``; returns now."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - since
        return now


@dataclass
class Groups(Part):
    """Every process group's :class:`GroupState`, and what was warned about once."""

    default: GroupState | None = None
    groups: dict[Any, GroupState] = field(default_factory=dict)
    #: (op, backend) pairs already warned about (emulation, fused-kernel fallback).
    warned: set[tuple[str, ...]] = field(default_factory=set)


PROCESS: Final = Part.register(Process())
GROUPS: Final = Part.register(Groups())


# --------------------------------------------------------------------------------------------- a group's state


class GroupState:
    """One process group as dispatch sees it: plugin, table, ranks, the plan cache, its call pipeline.

    Implements the validation facts (``size``, ``rank``, ``ranks``, ``device_type``, ``backend``); kernels of
    plugins get the narrower :attr:`kernel_context`. A kind of group is a subclass: it plans its kernels
    (:meth:`kernel_for`).
    """

    __slots__ = (
        "barriers", "check", "comm_name", "device_type", "fallback", "group", "hooks", "issue", "issue_inner",
        "kernel_context", "name", "native", "plans", "plugin", "rank", "ranks", "runtime", "scratch", "side", "size",
        "table",
    )

    def __init__(self, group: Any, native: Any, side: Any, runtime: Runtime, fallback: Fallback, check: bool,
                 ranks: tuple[int, ...] | None = None, name: str | None = None,
                 table: CapabilityTable | None = None) -> None:
        #: The process group as torch.distributed knows it.
        self.group: Final = group
        #: The vendor's own process group (or c10d Backend): native kernels call its c10d methods.
        self.native: Final = native
        #: A gloo group over the same ranks for emulations staged through host memory, or None.
        self.side: Final = side
        self.runtime: Final = runtime
        #: Device type of the tensors this group takes (a plain attribute: read on every call).
        self.device_type: Final = runtime.device_type
        self.table: Final[CapabilityTable] = runtime.capabilities() if table is None else table
        #: The plugin's name (in messages; a mixed group's names its islands).
        self.plugin: Final = self.table.backend
        self.size: Final = group.size()
        self.rank: Final = group.rank()
        #: Global ranks of the members, in group-rank order (given for a group torch does not know: a mixed group's
        #: island, ``_mixed``).
        self.ranks: Final = tuple(dist.get_process_group_ranks(group)) if ranks is None else ranks
        self.name: Final = group.group_name if name is None else name
        #: The group's own policies (a mixed group's govern its island parts too).
        self.fallback: Final = fallback
        self.check: Final = check
        #: (op, dtype, reduce op) -> kernel; filled by dispatch on first use of each call shape.
        self.plans: Final[dict[tuple[Any, ...], Kernel]] = {}
        #: The group's call hooks (observers), outermost first, and the pipeline built from them (``_hooks``):
        #: ``issue(spec, kernel_args, kernel, async_op)`` for a call, ``issue_inner`` for an emulation's building
        #: block. With no hook both are the bare kernel call.
        self.hooks: tuple[Any, ...] = ()
        self.issue: Callable[..., Any] = _bare
        self.issue_inner: Callable[..., Any] = _bare
        #: Monitored barriers called on this group (numbers each call's keys in the store: ``_monitored``).
        self.barriers = 0
        #: The emulations' reusable host buffers (``_scratch``), dropped with the group's state.
        self.scratch: Final = Scratch()
        #: The plugin's communicator name, once asked for (:meth:`communicator_name`).
        self.comm_name: str | None = None
        #: What a plugin's kernels see of the group.
        self.kernel_context: Final = KernelContext(group, native, self.rank, self.size, self.ranks, self.plugin,
                                                   self.communicator_name)
        if runtime.plugin.vendor_runtime().lazy_connect is not None:
            mark_arrival(group, self.rank)

    @property
    def backend(self) -> str:
        """The plugin's name (:attr:`plugin`): what validation messages call the backend."""
        return self.plugin

    def kernel_for(self, op: Collective, dtype: torch.dtype | None, reduce_op: Any, block: Kernel,
                   fallback: Callable[[], Kernel] | None = None) -> Kernel:
        """The kernel of one call shape on this group (planned once, cached by dispatch): what its kind does.

        Args:
            op: the capability key.
            dtype, reduce_op: the call shape.
            block: runs a building block on this group (``block(st, spec, kargs, async_op=False)``).
            fallback: for a fused op, builds its portable version (what runs where the vendor has no kernel, or
                its kernel refuses the call).

        Raises:
            UnsupportedCollective: the group cannot run it under its fallback policy.
        """
        raise NotImplementedError(f"{type(self).__name__} plans no kernel")

    @property
    def communicator_group(self) -> Any:
        """The group whose vendor communicator this rank connects (``xccl.runtime.connect``): its own."""
        return self.group

    def communicator_name(self) -> str:
        """The plugin's communicator name for the group, asked for once (on HCCL, asking creates it)."""
        if self.comm_name is None:
            self.comm_name = self.runtime.comm_name(self.group)
        return self.comm_name

    def side_group(self) -> Any:
        """The host-side gloo group over the same ranks.

        Raises:
            UnsupportedCollective: the group was not created by xccl's process-group backend.
        """
        if self.side is None:
            raise UnsupportedCollective(
                "point-to-point", self.plugin,
                "emulated send/recv needs a host-side gloo group, which xccl creates with each group of its own "
                "process-group backend; this group was created outside xccl (create it with xccl.new_group, or "
                "initialise torch.distributed with xccl.process_group_backend())",
            )
        return self.side

    def close(self) -> None:
        """The group is gone (destroyed, or xccl shut down): its buffers go, its hooks are told."""
        self.scratch.clear(close=True)
        for hook in self.hooks:
            closing = getattr(hook, "close", None)
            if closing is not None:
                closing()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} of {self.plugin}: rank {self.rank} of {self.size}>"


def _bare(spec: Any, kargs: Any, kernel: Kernel, async_op: bool) -> Any:
    """The call with no hook: the kernel itself."""
    return kernel(*kargs, async_op)


#: The key under a group's store that says a member reached its first collective there (``mark_arrival``).
ARRIVED: Final = "xccl.arrived/"


def mark_arrival(group: Any, group_rank: int) -> None:
    """Note in the group's store that this member reached its first collective on it (xccl's groups only).

    Where the vendor connects a group lazily, a member that arrives late makes the others' connect fail; the
    typed error then names the members that never arrived (``_faults``). One store write per group and rank.
    """
    store = getattr(group, "store", None)
    if store is not None:
        store.set(f"{ARRIVED}{group_rank}", "1")


def missing_members(group: Any, ranks: tuple[int, ...]) -> list[int] | None:
    """The global ranks of ``group`` that never reached a collective on it (None: unknown, no store)."""
    store = getattr(group, "store", None)
    if store is None:
        return None
    try:
        return [r for i, r in enumerate(ranks) if not store.check([f"{ARRIVED}{i}"])]
    except RuntimeError:
        return None
