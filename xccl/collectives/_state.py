"""All of xccl's state in a process: the world, the selected runtime, and one :class:`GroupState` per process group.

Everything that lives longer than a call is here, in :data:`STATE`, and :meth:`ProcessState.reset` (called by
``xccl.shutdown``) forgets all of it: the groups' plan caches and mismatch-detector clocks, the once-per-op
warnings, the graph path's order tokens and pending point-to-point work, the mismatch detector. No other
module keeps state of its own.

It sits with dispatch, which reads it on every call; ``xccl.runtime`` (``init``, ``new_group``, ``shutdown``)
is the lifecycle that fills and resets it.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import torch
import torch.distributed as dist

from ..errors import InitError, InvalidArgument, UnsupportedCollective
from ..ops._validate import group_problem
from ..plugin._capabilities import CapabilityTable
from ..plugin._contract import Runtime
from ..plugin._job import Job
from ..plugin._kernels import KernelContext
from ._flight import Flight, capacity
from ._islands import WorldMap
from ._scratch import Scratch
from ._watchdog import WatchdogSettings

__all__ = [
    "ARRIVED", "DEFAULT_TIMEOUT", "STATE", "Fallback", "GroupState", "ProcessState", "World", "flight_recorder", "forget",
    "mark_arrival",
    "missing_members", "register", "state_of",
]

Fallback = Literal["emulate", "warn", "error"]

#: Default collective timeout: long enough for a slow first step, short enough that a hang becomes an error
#: within minutes, not torch's 30. Override with ``timeout=`` or ``XCCL_TIMEOUT`` (seconds).
DEFAULT_TIMEOUT: Final = _dt.timedelta(seconds=300)


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


@final
class GroupState:
    """One process group as dispatch sees it: plugin, table, ranks, the plan cache, the detector's clock.

    Implements the validation facts (``size``, ``rank``, ``ranks``, ``device_type``, ``backend``); kernels of
    plugins get the narrower :attr:`kernel_context`.
    """

    __slots__ = (
        "backend", "barriers", "carrier", "check", "comm_name", "device_type", "fallback", "flight", "fr_p2p", "fr_seq",
        "group", "kernel_context", "name", "native", "plans", "rank", "ranks", "runtime", "scratch", "seq", "side", "size",
        "table",
    )

    def __init__(self, group: Any, native: Any, side: Any, runtime: Runtime, fallback: Fallback, check: bool,
                 ranks: tuple[int, ...] | None = None, name: str | None = None) -> None:
        #: The process group as torch.distributed knows it.
        self.group: Final = group
        #: The vendor's own process group (or c10d Backend): native kernels call its c10d methods.
        self.native: Final = native
        #: A gloo group over the same ranks for emulations staged through host memory, or None.
        self.side: Final = side
        self.runtime: Final = runtime
        #: Device type of the tensors this group takes (a plain attribute: read on every call).
        self.device_type: Final = runtime.device_type
        self.table: Final[CapabilityTable] = runtime.capabilities()
        #: The plugin's name, in messages.
        self.backend: Final = self.table.backend
        self.size: Final = group.size()
        self.rank: Final = group.rank()
        #: Global ranks of the members, in group-rank order.
        #: (Given for a group torch does not know: a mixed group's island, ``_mixed``.)
        self.ranks: Final = tuple(dist.get_process_group_ranks(group)) if ranks is None else ranks
        self.name: Final = group.group_name if name is None else name
        self.fallback: Final = fallback
        self.check: Final = check
        #: (op, dtype, reduce op) -> kernel; filled by dispatch on first use of each call shape.
        self.plans: Final[dict[tuple[Any, ...], Callable[..., Any]]] = {}
        #: Sequence number of collectives issued on this group (the mismatch detector's clock).
        self.seq = 0
        #: The flight recorder (``_flight``), or None when it is off; its per-group sequence numbers (collectives
        #: and point-to-point calls, counted separately as torch's recorder does).
        self.flight: Final = flight_recorder()
        self.fr_seq = 0
        self.fr_p2p = 0
        #: Monitored barriers called on this group (numbers each call's keys in the store: ``_monitored``).
        self.barriers = 0
        #: The group dispatcher-level tools see this group's collectives on, once one watched (``_observe``).
        self.carrier: Any = None
        #: The emulations' reusable host buffers (``_scratch``), dropped with the group's state.
        self.scratch: Final = Scratch()
        #: The plugin's communicator name, once asked for (:meth:`communicator_name`).
        self.comm_name: str | None = None
        #: What a plugin's kernels see of the group.
        self.kernel_context: Final = KernelContext(group, native, self.rank, self.size, self.ranks, self.backend,
                                                   self.communicator_name)
        if runtime.plugin.vendor_runtime().lazy_connect is not None:
            mark_arrival(group, self.rank)

    def communicator_name(self) -> str:
        """The plugin's communicator name for the group, asked for once (on HCCL, asking creates it)."""
        if self.comm_name is None:
            # A group spanning islands has no vendor communicator of its own (each island has its own): its name is
            # xccl's, the same on every member, and asks no vendor (HCCL's would broadcast over the whole group).
            mixed = getattr(self.group, "mixed", None) is not None
            self.comm_name = f"xccl-mixed:{self.name}" if mixed else self.runtime.comm_name(self.group)
        return self.comm_name

    def side_group(self) -> Any:
        """The host-side gloo group over the same ranks.

        Raises:
            UnsupportedCollective: the group was not created by xccl's process-group backend.
        """
        if self.side is None:
            raise UnsupportedCollective(
                "point-to-point", self.backend,
                "emulated send/recv needs a host-side gloo group, which xccl creates with each group of its own "
                "process-group backend; this group was created outside xccl (create it with xccl.new_group, or "
                "initialise torch.distributed with xccl.process_group_backend())",
            )
        return self.side

    def __repr__(self) -> str:
        return f"<GroupState {self.name!r} of {self.backend}: rank {self.rank} of {self.size}>"


@dataclass
class ProcessState:
    """The process's state; one instance, :data:`STATE`."""

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
    #: describes the job. A framework may call ``process_group_backend`` before its launcher's variables exist
    #: (Lightning's launcher on rank 0, Ray Train's worker hook); when it creates the world, they and the world's
    #: rank and size do.
    job_at: Callable[[int, int], Job] | None = None
    fallback: Fallback = "warn"
    check: bool = False
    default: GroupState | None = None
    groups: dict[Any, GroupState] = field(default_factory=dict)
    #: (op, backend) pairs already warned about (emulation, fused-kernel fallback).
    warned: set[tuple[str, ...]] = field(default_factory=set)
    #: The graph path's order token per group name (``xccl.graph``).
    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Point-to-point work started by graph ops and not yet waited for, per group name (``xccl.graph``).
    pending: dict[str, list[Any]] = field(default_factory=dict)
    #: The mismatch detector (its recorder, store channel and background thread), once started.
    channel: Any = None
    #: The flight recorder's ring (``_flight``), once a group asked for it; None: not yet (or off, see ``flight_off``).
    flight: Flight | None = None
    flight_off: bool = False
    #: The flight recorder's dump trigger watcher (``_flight_dump``), once started.
    flight_watch: Any = None
    #: This rank's liveness port and store address, to name the lost ranks at a fault (``_liveness.Liveness``).
    liveness: Any = None
    #: Post-grad passes of the ``xccl`` compile backend: name -> (pass, uuid) (``xccl.graph``).
    passes: dict[str, tuple[Callable[..., None], str]] = field(default_factory=dict)
    #: Seconds each phase of this process's ``xccl.init`` took, in order (``benchmarks/startup.py`` shows them).
    phases: dict[str, float] = field(default_factory=dict)

    def lap(self, name: str, since: float) -> float:
        """Add the time from ``since`` (``time.perf_counter()``) to now to phase ``name``; returns now."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - since
        return now
    #: The vendor's watchdog settings in force (``_watchdog``), when the plugin declares a watchdog.
    watchdog: WatchdogSettings | None = None
    #: The mixed-vendor world's map (``_islands``), built by the world check; None unless the switch is on.
    world_map: WorldMap | None = None

    def reset(self) -> None:
        """Forget everything (``xccl.shutdown``)."""
        fresh = ProcessState()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))


STATE: Final = ProcessState()


def flight_recorder() -> Flight | None:
    """The process's flight recorder (created on first use from the environment: ``_flight.capacity``), or None."""
    if STATE.flight is None and not STATE.flight_off:
        size = capacity()
        if size:
            STATE.flight = Flight(size)
        else:
            STATE.flight_off = True
    return STATE.flight


def state_of(group: Any = None) -> GroupState:
    """The :class:`GroupState` of ``group`` (``None``: the world). Groups made outside xccl are adopted.

    Raises:
        InitError: xccl is not initialised.
        InvalidArgument: ``group`` is not a process group of this rank.
    """
    if group is None:
        st = STATE.default
        if st is None:
            raise InitError("xccl is not initialised: call xccl.init() first")
        return st
    st = STATE.groups.get(group)
    return st if st is not None else _adopt(group)


def register(group: Any, runtime: Runtime, fallback: Fallback | None = None, check: bool | None = None, *,
             ranks: tuple[int, ...] | None = None, name: str | None = None) -> GroupState:
    """Track ``group`` with a runtime and policies of its own instead of the world's.

    A test seam (one rank pool serves several fallback policies, or a test vendor's kernels over a real group);
    applications get their groups' state from ``xccl.init`` and ``xccl.new_group``. ``ranks`` and ``name`` are
    given for a group torch does not know (a mixed group's island group, ``_mixed``).
    """
    native = getattr(group, "native", group)
    side = getattr(group, "side", None)
    st = STATE.groups[group] = GroupState(
        group, native, side, runtime, STATE.fallback if fallback is None else fallback,
        STATE.check if check is None else check, ranks, name,
    )
    return st


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


def forget(group: Any) -> None:
    """Drop what xccl keeps for ``group`` once torch destroys it: its state and its scratch buffers."""
    st = STATE.groups.pop(group, None) if STATE.default is None or STATE.default.group is not group else STATE.default
    if st is not None:
        st.scratch.clear(close=True)


def _adopt(group: Any) -> GroupState:
    # The runtime is enough: a framework may create xccl's groups (xccl.process_group_backend) before xccl.init.
    runtime = STATE.runtime
    if runtime is None:
        raise InitError("xccl is not initialised: call xccl.init() first")
    problem = group_problem(group)
    if problem is not None:
        raise InvalidArgument("group", problem)
    # xccl's process group carries the vendor's group and the host-side group; any other group is its own native.
    return register(group, runtime)
