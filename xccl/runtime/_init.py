"""``xccl.init`` and the lifecycle around it: plugin selection, device setup, the world on xccl's process group,
sub-groups, communicator names, adoption of a world created by someone else, and shutdown.

``xccl.init`` registers xccl's torch.distributed backend (``xccl_<vendor backend>``) and creates the world on it, so
that everything built on ``torch.distributed`` (DDP, FSDP2, DTensor, DeviceMesh, compiled graphs) runs through
xccl's dispatch. A world a framework created (Lightning, Accelerate, DeepSpeed, torchtitan) is adopted instead: a
world on the vendor's own backend gets xccl's dispatch for ``xccl.*`` calls only, one on the name
:func:`process_group_backend` gave the framework gets the rest too (docs/stacks.md).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._backend import backend_name, register_backend
from ..collectives._flight_dump import start_watch
from ..collectives._groups import state_of
from ..collectives._health._ending import exit_after as loss_exit_after
from ..collectives._health._liveness import close_quietly
from ..collectives._health._sentinel import start as start_sentinel
from ..collectives._health._watch import deadline as health_deadline
from ..collectives._islands import islands_of
from ..collectives._state import DEFAULT_TIMEOUT, GROUPS, PROCESS, Fallback, World
from ..collectives._state import reset as reset_state
from ..errors import BackendUnavailable, InitError, InvalidArgument, XcclError
from ..ops._warn import set_adaptor_modules
from ..plugin._capabilities import CapabilityTable
from ..plugin._contract import Plugin, Runtime
from ..plugin._fake_world import choose as choose_transport
from ..plugin._job import Job
from ..plugin._jobenv import job_env
from ..plugin._registry import Registry, default_registry
from ..plugin._sim import register_simulated_backend, simulated_backend_of
from ..plugin._verify import verify
from ._backend_check import all_arrived, plugin_for, wrong_backend
from ._compiled import start_compiled_record
from ._env import (
    env_init_method,
    heterogeneous_of,
    job_of,
    rendezvous_error,
    resolve_ranks,
    setup_timeout_of,
    timeout_of,
)
from ._rendezvous import rendezvous
from ._shutdown import at_exit as _at_exit
from ._shutdown import shutdown
from ._torch_api import install as install_torch_api
from ._vendor import collective_timeout, connect, connect_world, group_options, watchdog_settings

__all__ = [
    "DEFAULT_TIMEOUT",
    "World",
    "capabilities",
    "comm_name",
    "connect",
    "get_world",
    "init",
    "new_group",
    "process_group_backend",
    "shutdown",
    "vendor_group",
]

_FALLBACKS: Final = ("emulate", "warn", "error")


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


def _runtime_of(plugin: Plugin, simulate: bool) -> Runtime:
    """The selected plugin's runtime, checked against the plugin contract before any process group exists."""
    runtime = plugin.runtime(simulate=simulate)
    verify(plugin, runtime, simulate=simulate)
    return runtime


def _check_policy(fallback: str, check: bool | None) -> bool:
    if fallback not in _FALLBACKS:
        raise InitError(f"fallback={fallback!r}; choose one of {', '.join(_FALLBACKS)}")
    return check if check is not None else os.environ.get("XCCL_CHECK", "0").strip() not in ("", "0", "false")


def _prepare(runtime: Runtime, fallback: Fallback, check: bool) -> str:
    """Register the simulated vendor backend (when simulating) and xccl's backend; make ``runtime`` current; choose
    the vendor watchdog's mode before any of the vendor's groups exists (``xccl.collectives._watchdog``)."""
    vendor = runtime.plugin.vendor_runtime()
    choose_transport()  # a real world, or a fake one (XCCL_FAKE_WORLD): chosen once, before any group exists
    if runtime.simulate:
        profile = runtime.plugin.simulation()
        if profile is not None:
            register_simulated_backend(profile, runtime=vendor)
    # The vendor's adaptor is not the user's code: call sites and warnings name the line that called it.
    set_adaptor_modules(runtime.plugin.adaptor_modules())
    PROCESS.runtime, PROCESS.fallback, PROCESS.check = runtime, fallback, check
    PROCESS.job = PROCESS.device = PROCESS.job_at = None
    PROCESS.watchdog = watchdog_settings(runtime, choose=True)
    install_torch_api()  # torch.distributed's shrink_group and monitored_barrier on xccl's groups too
    return register_backend(runtime)


def _place(runtime: Runtime, job: Job, *, adopted: bool = False) -> torch.device:
    """Place this process for ``job`` (:meth:`Runtime.place`) and remember where."""
    PROCESS.device = runtime.place(job, adopted=adopted)
    PROCESS.job = job
    return PROCESS.device


def process_group_backend(
    vendor: str = "auto",
    *,
    local_rank: int | None = None,
    simulate: bool | None = None,
    fallback: Fallback = "warn",
    check: bool | None = None,
    registry: Registry | None = None,
) -> str:
    """Prepare xccl's torch.distributed backend for a framework that creates the process group itself.

    Selects the plugin as :func:`init` does, registers the backend and returns its name, to pass where the
    framework takes one. Every group created on it runs through xccl's dispatch; call :func:`init` afterwards (it
    adopts the world) to use ``xccl.*`` as well.

    This rank's device is chosen and made current when the framework creates the world on the backend, not here
    (a framework may call this before its launcher has told the process its place: docs/stacks.md). Create no
    device tensor before that; the vendor's first group is created after the device is set.

    Args:
        vendor: as :func:`init`.
        local_rank: this rank's local rank (default ``LOCAL_RANK`` when the world is created, else the rank's
            place on its node), to choose its device.
        simulate: as :func:`init`.
        fallback: as :func:`init`.
        check: as :func:`init`.
        registry: as :func:`init`.

    Returns:
        The backend name, e.g. ``"xccl_hccl"``.

    Example::

        backend = xccl.process_group_backend()
        trainer = lightning.Trainer(strategy=DDPStrategy(process_group_backend=backend))
    """
    check = _check_policy(fallback, check)
    plugin, sim = _select(vendor, simulate, registry or default_registry())
    runtime = _runtime_of(plugin, sim)
    name = _prepare(runtime, fallback, check)
    PROCESS.job_at = partial(job_of, local_rank=local_rank)
    # The framework creates the world and, like most training scripts, may never destroy it (Lightning does not):
    # its groups are xccl's backend all the same, torn down at exit as init's are (see _shutdown_at_exit).
    _at_exit()
    return name


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
    heterogeneous: bool | None = None,
    registry: Registry | None = None,
    setup_timeout: _dt.timedelta | float | None = None,
) -> World:
    """Set up this process's device and the world's process group through the selected plugin.

    Reads what the launcher sets (:func:`xccl.plugin.job_env`): torchrun's ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, else Slurm's, LSF's, Kubeflow's or MPI's variables, with the
    rendezvous address by the launcher's conventions (Slurm: the first node, a port from the job id); with none of
    them it makes a world of one. When ``torch.distributed`` is already initialised, it adopts that world
    (docs/stacks.md).

    Args:
        vendor: a plugin name, or ``"auto"``: ``XCCL_VENDOR``, else the one available accelerator, else ``cpu``.
        rank: global rank (default: from the environment).
        world_size: number of ranks (default: from the environment).
        local_rank: rank within this node, used to pick the device (default: from the environment, else rank).
        init_method: a torch.distributed init method URL (default ``env://``).
        timeout: collective timeout (timedelta or seconds); default ``XCCL_TIMEOUT`` or 300 s. On a
            vendor with a watchdog and its own execution timeout (Ascend) the process groups get no timeout at or
            below that execution timeout, and without a timeout they get the vendor's default (warned once when
            a given timeout is not what bounds collectives; ``World.timeout`` and ``World.collective_timeout``
            say what holds).
        simulate: run a vendor plugin on CPU over gloo (default: ``XCCL_SIMULATE=<vendor>``).
        fallback: what to do when the plugin's library lacks an op: ``"emulate"`` silently, ``"warn"`` once per op,
            ``"error"`` raise :class:`~xccl.UnsupportedCollective`.
        check: turn on the collective-mismatch detector (default: ``XCCL_CHECK=1``).
        heterogeneous: a mixed-vendor world (default: ``XCCL_HETEROGENEOUS=1``): each rank selects its own plugin
            (``vendor``, ``XCCL_VENDOR`` / ``XCCL_SIMULATE`` per rank), the world check builds the world's map
            (:attr:`World.map`: the islands of each vendor) instead of refusing ranks whose plugins differ, and a
            group that spans islands runs hierarchical collectives (docs/mixed.md). Every rank must set it alike.
        registry: plugins to choose from (default: the installed entry points); a test seam.
        setup_timeout: how long the rendezvous and the world check wait for every rank (timedelta or seconds);
            default ``XCCL_SETUP_TIMEOUT``, else the collective timeout but at least 300 s. Kept apart from
            ``timeout`` because starting ranks (imports, device setup, a busy machine) is slower and less even than
            a collective: a short collective timeout must not make a loaded machine's start-up fail.

    Returns:
        The :class:`World`. Calling ``init`` again with the same arguments returns it unchanged.

    Raises:
        InitError: bad environment values, a second ``init`` with different arguments, or ranks that were not
            told the same world (``WORLD_SIZE``, plugin, versions...: checked before any process group).
        BackendNotFound, BackendUnavailable: the plugin is missing or cannot run here.
        RendezvousTimeout: not every rank arrived within the setup timeout (the message names the missing ones),
            or all did and the world check itself ran out of it (the message says so, and what to raise).

    Example::

        world = xccl.init()                       # under torchrun
        xccl.all_reduce(torch.ones(2, device=world.device))
    """
    check = _check_policy(fallback, check)
    mixed = heterogeneous_of(heterogeneous)
    args = (vendor, rank, world_size, local_rank, init_method, timeout, simulate, fallback, check, mixed, setup_timeout)
    if PROCESS.world is not None:
        if PROCESS.args == args:
            return PROCESS.world
        raise InitError(
            f"xccl is already initialised as {PROCESS.world}; a second init with different arguments is refused. "
            "Call xccl.shutdown() first"
        )
    if dist.is_initialized():
        if mixed:
            raise InitError("a mixed-vendor world (heterogeneous) is created by xccl.init itself, which builds the "
                            "world's map at the rendezvous; torch.distributed is already initialised here")
        world = _adopt_world(vendor, local_rank, timeout, simulate, fallback, check, registry or default_registry())
    else:
        world = _create_world(vendor, rank, world_size, local_rank, init_method, timeout, simulate, fallback, check,
                              registry or default_registry(), mixed, setup_timeout)
    PROCESS.world, PROCESS.args = world, args
    t = time.perf_counter()
    GROUPS.default = state_of(dist.group.WORLD)
    start_watch()  # the flight recorder's dump watcher and SIGUSR1 handler, when it is on
    start_compiled_record()  # graph breaks, for xccl preflight (XCCL_COMPILED_DUMP_AT_EXIT)
    PROCESS.lap("group state", t)
    if not world.adopted:
        connect_world()
    return world


def _create_world(
    vendor: str, rank: int | None, world_size: int | None, local_rank: int | None, init_method: str | None,
    timeout: _dt.timedelta | float | None, simulate: bool | None, fallback: Fallback, check: bool, registry: Registry,
    mixed: bool = False, setup_timeout: _dt.timedelta | float | None = None,
) -> World:
    PROCESS.phases.clear()
    t = time.perf_counter()
    launcher = job_env()
    rank_, size, _, _ = resolve_ranks(rank, world_size, local_rank, launcher)
    job = job_of(rank_, size, local_rank, launcher)
    tmo = timeout_of(timeout)
    setup = setup_timeout_of(setup_timeout, tmo)
    health_deadline()  # a bad XCCL_HEALTH_DEADLINE fails here, not at the first group
    loss_exit_after()  # and a bad XCCL_LOSS_EXIT_AFTER, not at a verdict
    t = PROCESS.lap("launcher variables", t)
    plugin, sim = _select(vendor, simulate, registry)
    t = PROCESS.lap("plugin discovery", t)
    runtime = _runtime_of(plugin, sim)
    name = _prepare(runtime, fallback, check)
    t = PROCESS.lap("runtime and backend registration", t)
    device = _place(runtime, job)
    watchdog = plugin.vendor_runtime().watchdog
    given = timeout is not None or "XCCL_TIMEOUT" in os.environ
    # The rendezvous waits for tmo; the group gets what the vendor's watchdog may have (torch's default where no
    # timeout was given: the vendor's own default, see xccl.collectives._watchdog).
    group_tmo = tmo if watchdog is None or given else _dt.timedelta(seconds=watchdog.torch_default)
    kwargs: dict[str, Any] = {"rank": rank_, "world_size": size, "timeout": group_tmo, **group_options(runtime, None)}
    t = PROCESS.lap("device setup", t)
    started = time.monotonic()
    live = None
    try:
        if init_method is None and size == 1 and "MASTER_ADDR" not in os.environ:
            kwargs["store"] = dist.HashStore()  # a world of one needs no rendezvous
            if mixed:
                PROCESS.world_map = islands_of([(0, plugin.name, runtime.backend, socket.gethostname())])
        else:
            # xccl makes the store, and checks there that every rank was told the same world (_rendezvous).
            kwargs["store"], live = rendezvous(
                init_method or env_init_method(launcher), rank_, size, job.local_rank, tmo, plugin=plugin.name,
                backend=runtime.backend, simulate=sim, check=check, fallback=fallback, started=started, job=launcher,
                heterogeneous=mixed, setup=setup)
        t = time.perf_counter()
        dist.init_process_group(backend=name, **kwargs)
        PROCESS.lap("process group", t)
    except Exception as exc:
        close_quietly(live)
        reset_state()
        if isinstance(exc, XcclError):
            raise
        raise rendezvous_error(exc, rank_, size, time.monotonic() - started, launcher.master_port) from exc
    got = str(dist.get_backend())
    if got != name:
        # Something replaced init_process_group and chose another backend (Sophgo's torch adaptor: "sccl"): the
        # world is not xccl's. Take it down rather than run without xccl's dispatch.
        error = wrong_backend(name, got, plugin)  # while the replacement is in place, to name it
        all_arrived(kwargs["store"], rank_, size, setup)
        close_quietly(live)
        reset_state()
        dist.destroy_process_group()
        runtime.shutdown()
        raise error
    PROCESS.liveness = live
    start_sentinel(live, size)
    _at_exit()
    group_tmo = getattr(dist.group.WORLD, "timeout", tmo)
    return World(rank_, size, job.local_rank, device, plugin.name, runtime.backend, sim, fallback, check, group_tmo, name,
                 False, collective_timeout(group_tmo), PROCESS.world_map)


def _adopt_world(
    vendor: str, local_rank: int | None, timeout: _dt.timedelta | float | None, simulate: bool | None,
    fallback: Fallback, check: bool, registry: Registry,
) -> World:
    """A :class:`World` over the torch.distributed world someone else created; sets nothing that is set."""
    backend = str(dist.get_backend())
    runtime = PROCESS.runtime
    if runtime is not None and PROCESS.job_at is not None and backend != backend_name(runtime):
        # process_group_backend gave the framework xccl's name, yet the world is on another backend and xccl's
        # creator never ran: something between them chose the backend. The world is the framework's: left alone.
        error = wrong_backend(backend_name(runtime), backend, runtime.plugin)
        reset_state()
        runtime.shutdown()
        raise error
    ours = runtime is not None and backend == backend_name(runtime)
    if runtime is None or not ours:
        plugin = plugin_for(backend, vendor, registry)
        sim = simulated_backend_of() is not None if simulate is None else simulate
        runtime = _runtime_of(plugin, sim)
    # Group states made before this call (a framework's collectives on xccl's group) were planned under the
    # settings of process_group_backend; rebuild them under init's.
    GROUPS.groups.clear()
    PROCESS.runtime, PROCESS.fallback, PROCESS.check = runtime, fallback, check
    if PROCESS.watchdog is None:  # set by process_group_backend when xccl prepared the backend; else as found
        PROCESS.watchdog = watchdog_settings(runtime, choose=False)
    # A world created on xccl's backend placed this process when its group was created (_process_group._Creator).
    job, device = PROCESS.job, PROCESS.device
    if not ours or job is None or device is None:
        job = job_of(dist.get_rank(), dist.get_world_size(), local_rank)
        device = _place(runtime, job, adopted=True)
    tmo = getattr(dist.group.WORLD, "timeout", None) or timeout_of(timeout)
    return World(job.rank, job.world_size, job.local_rank, device, runtime.plugin.name, runtime.backend,
                 runtime.simulate, fallback, check, tmo, backend, True, collective_timeout(tmo))


def capabilities(plugin: str | None = None) -> CapabilityTable:
    """The :class:`~xccl.CapabilityTable` of ``plugin`` (default: the plugin ``xccl.init`` selected).

    For the selected plugin this is its runtime's table: the plugin's, refined by what the runtime found in the
    installed SDK (``Runtime.capabilities``); for any other plugin, its static table.

    Raises:
        BackendNotFound, BackendUnavailable: no such plugin, or it failed to load.
        InitError: no plugin named and xccl is not initialised.

    Example::

        xccl.capabilities("sophgo").supports("all_to_all_single")
    """
    if plugin is None:
        plugin = get_world().plugin
    runtime = PROCESS.runtime
    if runtime is not None and runtime.plugin.name == plugin:
        return runtime.capabilities()
    return default_registry().get(plugin).capabilities()


def get_world() -> World:
    """The :class:`World` of this process.

    Raises:
        InitError: ``xccl.init`` has not been called.
    """
    if PROCESS.world is None:
        raise InitError("xccl is not initialised: call xccl.init() first")
    return PROCESS.world


def new_group(ranks: Sequence[int] | None = None, *, timeout: _dt.timedelta | float | None = None) -> Any:
    """Create a sub-group over ``ranks`` with the plugin's options. Every rank of the world must call it.

    Args:
        ranks: global ranks of the members (``None``: every rank), in any order.
        timeout: the group's timeout (default: the world's).

    Returns:
        The ``torch.distributed`` ProcessGroup, or ``GroupMember.NON_GROUP_MEMBER`` on ranks outside it.

    Raises:
        InvalidArgument: ranks out of range, repeated or empty.

    Example::

        tp = xccl.new_group([0, 1])
    """
    world = get_world()
    runtime = PROCESS.runtime
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
    tmo = timeout_of(timeout) if timeout is not None else world.timeout
    return dist.new_group(members, timeout=tmo, backend=world.process_group_backend, **group_options(runtime, members))


def vendor_group(ranks: Sequence[int] | None = None) -> Any:
    """A group of the vendor's own backend over ``ranks`` (``None``: every rank), with the plugin's options but
    without xccl's dispatch: what ``torch.distributed`` alone would run, for comparisons (``xccl bench
    --compare-raw``, the benchmarks). Every rank of the world must call it.

    Example::

        raw = xccl.runtime.vendor_group()
        torch.distributed.all_reduce(t, group=raw)     # the vendor's kernel, no xccl in between
    """
    world = get_world()
    runtime = PROCESS.runtime
    if runtime is None:  # pragma: no cover - set together with world
        raise InitError("xccl is not initialised: call xccl.init() first")
    members = list(range(world.world_size)) if ranks is None else [int(r) for r in ranks]
    return dist.new_group(members, backend=world.backend, timeout=world.timeout, **group_options(runtime, members))


def comm_name(group: Any = None) -> str:
    """The plugin's communicator name for ``group``: stable, identical on every rank, unique per group.

    On Ascend this is HCCL's own name from ``get_hccl_comm_name`` (which fused kernels need); on other backends
    a name derived from the group. For HCCL the name is created on first use, so every member must call this.

    Example::

        hcom = xccl.comm_name(tp_group)
    """
    return state_of(group).communicator_name()
