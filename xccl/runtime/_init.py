"""``xccl.init``: environment, plugin selection, device setup, process group; and the group registry.

The state is one :class:`World` per process plus a :class:`GroupContext` per process group, which caches what
dispatch needs (the plugin's table, the resolved kernel per call shape) so the per-call cost stays small.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import torch
import torch.distributed as dist

from ..plugin._capabilities import CapabilityTable, Collective
from ..errors import BackendUnavailable, InitError, InvalidArgument, RendezvousTimeout, UnsupportedCollective, XcclError
from ..plugin._contract import Plugin, Runtime
from ..plugin._registry import Registry, default_registry

__all__ = ["DEFAULT_TIMEOUT", "GroupContext", "World", "comm_name", "get_world", "init", "new_group", "shutdown"]

Fallback = Literal["emulate", "warn", "error"]
_FALLBACKS: Final = ("emulate", "warn", "error")

#: Default collective timeout: long enough for a slow first step, short enough that a hang becomes an error
#: within minutes, not torch's 30. Override with ``timeout=`` or ``XCCL_TIMEOUT`` (seconds).
DEFAULT_TIMEOUT: Final = _dt.timedelta(seconds=300)


@final
@dataclass(frozen=True, slots=True)
class World:
    """What ``xccl.init`` set up in this process."""

    rank: int
    world_size: int
    local_rank: int
    #: The device this rank computes on (``cpu`` in simulation).
    device: torch.device
    #: Name of the selected plugin.
    plugin: str
    #: torch.distributed backend name of the process group (``gloo``, ``nccl``, ``hccl``, ``sccl``).
    backend: str
    #: True when a vendor plugin runs in CPU simulation.
    simulate: bool = False
    #: The fallback policy for collectives the backend lacks.
    fallback: Fallback = "warn"
    #: True when the collective-mismatch detector is on.
    check: bool = False
    timeout: _dt.timedelta = DEFAULT_TIMEOUT


@final
class GroupContext:
    """Per-process-group dispatch state: plugin, table, ranks, and the cache of resolved kernels."""

    __slots__ = (
        "check",
        "device_type",
        "fallback",
        "group",
        "name",
        "plans",
        "rank",
        "ranks",
        "runtime",
        "seq",
        "side",
        "size",
        "table",
    )

    def __init__(self, group: dist.ProcessGroup, runtime: Runtime, ranks: Sequence[int], world: World) -> None:
        self.group: Final = group
        self.runtime: Final = runtime
        #: Device type of the tensors this group takes (a plain attribute: read on every call).
        self.device_type: Final = runtime.device_type
        self.table: Final[CapabilityTable] = runtime.plugin.capabilities()
        self.size: Final = group.size()
        self.rank: Final = group.rank()
        #: Global ranks of the members, in group-rank order.
        self.ranks: Final = tuple(ranks)
        #: (op, dtype, reduce op) -> kernel; filled by dispatch on first use of each call shape.
        self.plans: Final[dict[tuple[Any, ...], Callable[..., Any]]] = {}
        self.name: Final = group.group_name
        self.fallback: Final = world.fallback
        self.check: Final = world.check
        #: Sequence number of collectives issued on this group (the mismatch detector's clock).
        self.seq = 0
        #: A gloo group over the same ranks, for emulations staged through host memory (point-to-point where
        #: the backend has none); created with the group by xccl.init / xccl.new_group when the table needs it.
        self.side: Any = None

    def side_group(self) -> Any:
        """The host-side gloo group over the same ranks.

        Raises:
            UnsupportedCollective: the group was not created through xccl, so no side group exists.
        """
        if self.side is None:
            raise UnsupportedCollective(
                "point-to-point", self.table.backend,
                "emulated send/recv needs a host-side gloo group, created only for groups made with xccl.init or "
                "xccl.new_group; create this group with xccl.new_group",
            )
        return self.side

    def global_rank(self, group_rank: int) -> int:
        """Global rank of a member given its rank within the group."""
        return self.ranks[group_rank]


@dataclass
class _State:
    world: World | None = None
    args: tuple[Any, ...] | None = None
    runtime: Runtime | None = None
    default: GroupContext | None = None
    groups: dict[Any, GroupContext] = field(default_factory=dict)
    comm_names: dict[Any, str] = field(default_factory=dict)


_STATE: Final = _State()


def _env_int(names: Sequence[str], what: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise InitError(f"environment variable {name}={raw!r} is not an integer ({what}); fix or unset it") from None
    return None


def _resolve_ranks(
    rank: int | None, world_size: int | None, local_rank: int | None
) -> tuple[int, int, int, bool]:
    """rank, world size, local rank, and whether they came from the environment."""
    from_env = rank is None and world_size is None
    if rank is None:
        rank = _env_int(("RANK", "OMPI_COMM_WORLD_RANK"), "this process's global rank")
    if world_size is None:
        world_size = _env_int(("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"), "the number of ranks")
    if local_rank is None:
        local_rank = _env_int(("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"), "the rank within this node")
    if rank is None and world_size is None:
        rank, world_size = 0, 1  # a plain `python script.py`: a world of one
    if rank is None or world_size is None:
        raise InitError(
            f"rank={rank} world_size={world_size}: both are needed; run under torchrun (which sets RANK and "
            "WORLD_SIZE) or pass rank= and world_size= to xccl.init"
        )
    if world_size < 1:
        raise InitError(f"world size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise InitError(f"rank {rank} is outside [0, {world_size}) for world size {world_size}")
    if local_rank is None:
        local_rank = rank
    if local_rank < 0:
        raise InitError(f"local rank must be >= 0, got {local_rank}")
    return rank, world_size, local_rank, from_env


def _timeout(timeout: _dt.timedelta | float | None) -> _dt.timedelta:
    if timeout is None:
        raw = os.environ.get("XCCL_TIMEOUT")
        if raw is None:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(raw)
        except ValueError:
            raise InitError(f"XCCL_TIMEOUT={raw!r} is not a number of seconds") from None
    if not isinstance(timeout, _dt.timedelta):
        timeout = _dt.timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise InitError(f"timeout must be positive, got {timeout}")
    return timeout


def _select(vendor: str, simulate: bool | None, registry: Registry) -> tuple[Plugin, bool]:
    sim_env = os.environ.get("XCCL_SIMULATE", "").strip()
    if simulate is None and sim_env and sim_env not in ("0", "false"):
        if vendor not in ("auto", sim_env):
            raise InitError(f"XCCL_SIMULATE={sim_env} conflicts with xccl.init(vendor={vendor!r}); unset one")
        vendor, simulate = sim_env, True
    if not simulate:
        return registry.select(vendor), False
    if vendor == "auto":
        vendor = os.environ.get("XCCL_VENDOR", "").strip() or "auto"
    if vendor == "auto":
        raise InitError("simulate=True needs a vendor: xccl.init(vendor='sophgo', simulate=True) or XCCL_SIMULATE=sophgo")
    plugin = registry.get(vendor)
    if plugin.simulation() is None:
        raise BackendUnavailable(vendor, "this plugin has no CPU simulation", "run it on its hardware")
    return plugin, True


def init(
    vendor: str = "auto",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    init_method: str | None = None,
    timeout: _dt.timedelta | float | None = None,
    simulate: bool | None = None,
    fallback: Fallback = "warn",
    check: bool | None = None,
    registry: Registry | None = None,
) -> World:
    """Set up this process's device and process group through the selected plugin.

    Reads what ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and,
    failing that, Open MPI's ``OMPI_COMM_WORLD_*`` variables; with none of them it makes a world of one.

    Args:
        vendor: a plugin name, or ``"auto"``: ``XCCL_VENDOR``, else the one available accelerator, else ``cpu``.
        rank: global rank (default: from the environment).
        world_size: number of ranks (default: from the environment).
        local_rank: rank within this node, used to pick the device (default: from the environment, else rank).
        init_method: a torch.distributed init method URL (default ``env://``).
        timeout: collective and rendezvous timeout (timedelta or seconds); default ``XCCL_TIMEOUT`` or 300 s.
        simulate: run a vendor plugin on CPU over gloo (default: ``XCCL_SIMULATE=<vendor>``).
        fallback: what to do when the backend lacks an op: ``"emulate"`` silently, ``"warn"`` once per op,
            ``"error"`` raise :class:`~xccl.UnsupportedCollective`.
        check: turn on the collective-mismatch detector (default: ``XCCL_CHECK=1``).
        registry: plugins to choose from (default: the installed entry points); a test seam.

    Returns:
        The :class:`World`. Calling ``init`` again with the same arguments returns it unchanged.

    Raises:
        InitError: bad environment values, or a second ``init`` with different arguments.
        BackendNotFound, BackendUnavailable: the plugin is missing or cannot run here.
        RendezvousTimeout: not every rank arrived within the timeout.
    """
    if fallback not in _FALLBACKS:
        raise InitError(f"fallback={fallback!r}; choose one of {', '.join(_FALLBACKS)}")
    if check is None:
        check = os.environ.get("XCCL_CHECK", "0").strip() not in ("", "0", "false")
    args = (vendor, rank, world_size, local_rank, init_method, timeout, simulate, fallback, check)
    if _STATE.world is not None:
        if _STATE.args == args:
            return _STATE.world
        raise InitError(
            f"xccl is already initialised as {_STATE.world}; a second init with different arguments is refused. "
            "Call xccl.shutdown() first"
        )
    if dist.is_initialized():
        raise InitError("torch.distributed is already initialised outside xccl; call xccl.init instead of "
                        "init_process_group, or destroy that process group first")
    rank_, size, local, _ = _resolve_ranks(rank, world_size, local_rank)
    tmo = _timeout(timeout)
    plugin, sim = _select(vendor, simulate, registry or default_registry())
    runtime = plugin.runtime(simulate=sim)
    if sim:
        from ..plugin._sim import register_simulated_backend

        profile = plugin.simulation()
        if profile is not None:
            register_simulated_backend(profile)
    device = runtime.setup_device(local)
    kwargs: dict[str, Any] = {"rank": rank_, "world_size": size, "timeout": tmo}
    if init_method is None and size == 1 and "MASTER_ADDR" not in os.environ:
        kwargs["store"] = dist.HashStore()  # a world of one needs no rendezvous
    else:
        kwargs["init_method"] = init_method or _env_init_method()
    options = runtime.process_group_options(None)
    if options is not None:
        kwargs["pg_options"] = options
    started = time.monotonic()
    try:
        dist.init_process_group(backend=runtime.backend, **kwargs)
    except XcclError:
        raise
    except Exception as exc:
        raise _rendezvous_error(exc, rank_, size, time.monotonic() - started) from exc
    world = World(rank_, size, local, device, plugin.name, runtime.backend, sim, fallback, check, tmo)
    _STATE.world, _STATE.args, _STATE.runtime = world, args, runtime
    # A process group left alive at interpreter exit can abort the process (seen with simulated backends:
    # "terminate called without an active exception"); tear down in order unless the user already did.
    atexit.register(_shutdown_at_exit)
    default = dist.group.WORLD
    _STATE.default = _register(default, runtime, range(size), world)
    _STATE.default.side = _side_group(runtime, default, None)
    return world


def _side_group(runtime: Runtime, group: Any, ranks: list[int] | None) -> Any:
    """The host-side gloo group over ``ranks`` when the table emulates point-to-point through it, else None.

    A collective call, like creating ``group`` itself: every rank of the world makes it, members or not.
    """
    table = runtime.plugin.capabilities()
    if not any(table.entry(op).via == "host_gloo" for op in (Collective.SEND, Collective.RECV)):
        return None
    if runtime.backend == "gloo":
        return group
    return dist.new_group(ranks, backend="gloo")


def _env_init_method() -> str:
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise InitError(
            f"{' and '.join(missing)} not set: run under torchrun, export them (e.g. MASTER_ADDR=127.0.0.1 "
            "MASTER_PORT=29500), or pass init_method='tcp://host:port' to xccl.init"
        )
    port = os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InitError(f"MASTER_PORT={port!r} is not a TCP port number")
    return "env://"


def _rendezvous_error(exc: Exception, rank: int, size: int, elapsed: float) -> XcclError:
    """The typed error for a failed ``init_process_group``; the caller chains ``exc``.

    The texts matched are torch 2.13's (``tests/test_faults.py`` and ``tests/test_bad_input.py`` reproduce each).
    """
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    low = text.lower()
    said = f"{type(exc).__name__}: {first}"
    if "eaddrinuse" in low or "address already in use" in low:
        port = os.environ.get("MASTER_PORT", "?")
        return InitError(
            f"rank {rank}: the rendezvous port {port} is already in use on this host ({said}). Another job or a "
            "leftover process holds it, or two processes were started as rank 0: pick a free MASTER_PORT, stop the "
            "other process, or fix RANK"
        )
    if not ("timed out" in low or "timeout" in low or "DistStoreError" in type(exc).__name__):
        return InitError(f"creating the process group failed: {said}")
    if "clients joined" in low:
        why = (f"({said}) only some of the {size} ranks connected to the rendezvous server on this rank. Start the "
               "missing ranks, and check that WORLD_SIZE is the same on every rank")
    elif "trying to connect" in low:
        why = (f"({said}) this rank could not reach the rendezvous server. Check that rank 0 is running, that "
               "MASTER_ADDR/MASTER_PORT are the same on every rank and reachable from here (name, firewall)")
    else:
        why = (f"({said}) the ranks reached the server but not all of them completed the rendezvous. WORLD_SIZE "
               f"probably differs between ranks (this rank was told {size}), or a rank died while starting")
    return RendezvousTimeout(why, rank=rank, world_size=size, elapsed=elapsed)


def _register(group: Any, runtime: Runtime, ranks: Sequence[int] | range, world: World) -> GroupContext:
    ctx = GroupContext(group, runtime, list(ranks), world)
    _STATE.groups[group] = ctx
    return ctx


def get_world() -> World:
    """The :class:`World` of this process.

    Raises:
        InitError: ``xccl.init`` has not been called.
    """
    if _STATE.world is None:
        raise InitError("xccl is not initialised: call xccl.init() first")
    return _STATE.world


def context(group: Any = None) -> GroupContext:
    """The dispatch context of ``group`` (``None``: the world). Groups made outside xccl are adopted."""
    if group is None:
        ctx = _STATE.default
        if ctx is None:
            raise InitError("xccl is not initialised: call xccl.init() first")
        return ctx
    ctx = _STATE.groups.get(group)
    if ctx is None:
        ctx = _adopt(group)
    return ctx


def _adopt(group: Any) -> GroupContext:
    world, runtime = get_world(), _STATE.runtime
    if not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument("group", f"expected a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise InvalidArgument("group", "this rank is not a member of the group it passed")
    ranks = dist.get_process_group_ranks(group)
    return _register(group, runtime, ranks, world)  # type: ignore[arg-type]


def new_group(ranks: Sequence[int] | None = None, *, timeout: _dt.timedelta | float | None = None) -> Any:
    """Create a sub-group over ``ranks`` with the plugin's options. Every rank of the world must call it.

    Returns:
        The ``torch.distributed`` ProcessGroup, or ``GroupMember.NON_GROUP_MEMBER`` on ranks outside it.

    Raises:
        InvalidArgument: ranks out of range, repeated or empty.
    """
    world = get_world()
    runtime = _STATE.runtime
    if runtime is None:  # pragma: no cover - set together with world
        raise InitError("xccl is not initialised: call xccl.init() first")
    members = list(range(world.world_size)) if ranks is None else [int(r) for r in ranks]
    if not members:
        raise InvalidArgument("new_group", "ranks is empty")
    bad = [r for r in members if not 0 <= r < world.world_size]
    if bad:
        raise InvalidArgument("new_group", f"ranks {bad} are outside [0, {world.world_size})")
    if len(set(members)) != len(members):
        raise InvalidArgument("new_group", f"ranks {members} contain duplicates")
    kwargs: dict[str, Any] = {"ranks": members, "timeout": _timeout(timeout) if timeout is not None else world.timeout}
    options = runtime.process_group_options(members)
    if options is not None:
        kwargs["pg_options"] = options
    group = dist.new_group(backend=runtime.backend, **kwargs)
    side = _side_group(runtime, group, members)
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        # torch orders a group's ranks ascending whatever order they were passed in: ask it, don't assume.
        ctx = _register(group, runtime, dist.get_process_group_ranks(group), world)
        ctx.side = side
    return group


def comm_name(group: Any = None) -> str:
    """The plugin's communicator name for ``group``: stable, identical on every rank, unique per group.

    On Ascend this is HCCL's own name from ``get_hccl_comm_name`` (which fused kernels need); on other backends
    a name derived from the group. For HCCL the name is created on first use, so every member must call this.
    """
    ctx = context(group)
    name = _STATE.comm_names.get(ctx.group)
    if name is None:
        name = _STATE.comm_names[ctx.group] = ctx.runtime.comm_name(ctx.group)
    return name


def _shutdown_at_exit() -> None:
    if _STATE.world is not None:
        # At exit, a failing teardown must not mask the program's own status.
        with contextlib.suppress(Exception):
            shutdown()


def shutdown() -> None:
    """Destroy the process groups and forget the world; ``xccl.init`` may be called again afterwards."""
    runtime = _STATE.runtime
    # Drop our references to the process groups first, so that destroy_process_group releases the last ones
    # and the backends are torn down there, in order, rather than later by whoever drops a reference last.
    _STATE.world = _STATE.args = _STATE.runtime = _STATE.default = None
    _STATE.groups.clear()
    _STATE.comm_names.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    if runtime is not None:
        runtime.shutdown()
    # A process group can still be held by garbage reference cycles (a stored exception's traceback keeps the
    # frames that created it alive). Collect them now: if the collector only meets them during interpreter
    # shutdown, gloo's worker threads need the GIL to drop their last tensor and the process aborts.
    gc.collect()
