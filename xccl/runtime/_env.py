"""What ``xccl.init`` reads from the environment, and how a failed rendezvous is explained.

The launcher's variables (torchrun's, Slurm's, LSF's, Kubeflow's, MPI's) are read by
:func:`xccl.plugin.job_env`; here they become ``xccl.init``'s ranks and init method. Every value is checked, so a
bad one is an :class:`~xccl.InitError` naming the variable rather than a failure deep in torch.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Final

from ..collectives._state import DEFAULT_TIMEOUT
from ..errors import InitError, RendezvousTimeout, XcclError
from ..plugin._job import Job
from ..plugin._jobenv import JobEnv, job_env

__all__ = ["env_init_method", "heterogeneous_of", "job_of", "rendezvous_error", "resolve_ranks", "timeout_of"]


def heterogeneous_of(given: bool | None) -> bool:
    """The mixed-vendor switch: ``given`` (``xccl.init(heterogeneous=)``), else ``XCCL_HETEROGENEOUS``.

    Raises:
        InitError: ``XCCL_HETEROGENEOUS`` is set to something other than 0/1/true/false/on/off/yes/no.
    """
    if given is not None:
        return bool(given)
    raw = os.environ.get("XCCL_HETEROGENEOUS", "").strip().lower()
    if raw in ("", "0", "false", "off", "no"):
        return False
    if raw in ("1", "true", "on", "yes"):
        return True
    raise InitError(f"environment variable XCCL_HETEROGENEOUS={raw!r} is not a switch; set it to 1 or 0, or unset it")


def resolve_ranks(
    rank: int | None, world_size: int | None, local_rank: int | None, job: JobEnv | None = None
) -> tuple[int, int, int, bool]:
    """rank, world size, local rank, and whether they came from the launcher (``job``, default :func:`job_env`)."""
    job = job_env() if job is None else job
    from_env = rank is None and world_size is None
    rank = job.rank if rank is None else rank
    world_size = job.world_size if world_size is None else world_size
    local_rank = job.local_rank if local_rank is None else local_rank
    if rank is None and world_size is None:
        rank, world_size = 0, 1  # a plain `python script.py`: a world of one
    if rank is None or world_size is None:
        raise InitError(
            f"rank={rank} world_size={world_size} ({job.source}): both are needed; run under torchrun (which sets "
            "RANK and WORLD_SIZE), srun, jsrun or mpirun, or pass rank= and world_size= to xccl.init"
        )
    if world_size < 1:
        raise InitError(f"world size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise InitError(f"rank {rank} is outside [0, {world_size}) for world size {world_size}")
    local_rank = rank if local_rank is None else local_rank
    if local_rank < 0:
        raise InitError(f"local rank must be >= 0, got {local_rank}")
    return rank, world_size, local_rank, from_env


def job_of(rank: int, world_size: int, local_rank: int | None = None, launcher: JobEnv | None = None) -> Job:
    """The :class:`~xccl.plugin.Job` a runtime is placed for: ``rank`` of ``world_size``, the node's size from the
    launcher (None when it says nothing), the local rank given, else the launcher's, else the rank's place on its
    node (``rank`` itself on a single node). ``launcher``: what the launcher says (default :func:`job_env`).

    Raises:
        InitError: a variable is not an integer, or the values contradict each other.
    """
    launcher = job_env() if launcher is None else launcher
    local_world = launcher.local_world_size
    local_rank = launcher.local_rank if local_rank is None else local_rank
    if local_rank is None:
        local_rank = rank if local_world is None else rank % local_world
    return Job(rank, world_size, local_rank, local_world)


#: The least the rendezvous waits for every rank when no setup timeout is given (a collective timeout may be short).
MIN_SETUP_TIMEOUT: Final = _dt.timedelta(seconds=300)


def setup_timeout_of(setup: _dt.timedelta | float | None, timeout: _dt.timedelta) -> _dt.timedelta:
    """How long the rendezvous and the world check wait: ``setup``, else ``XCCL_SETUP_TIMEOUT``, else the
    collective ``timeout`` but at least :data:`MIN_SETUP_TIMEOUT`.

    Raises:
        InitError: not a positive number of seconds.
    """
    return _seconds(setup, "XCCL_SETUP_TIMEOUT", "the setup timeout") or max(timeout, MIN_SETUP_TIMEOUT)


def timeout_of(timeout: _dt.timedelta | float | None) -> _dt.timedelta:
    """``timeout`` (a timedelta or seconds), else ``XCCL_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`.

    Raises:
        InitError: not a positive number of seconds.
    """
    return _seconds(timeout, "XCCL_TIMEOUT", "timeout") or DEFAULT_TIMEOUT


def _seconds(value: _dt.timedelta | float | None, env: str, what: str) -> _dt.timedelta | None:
    """``value`` (a timedelta or seconds), else the variable ``env``, else None (the caller's default)."""
    if value is None:
        raw = os.environ.get(env)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise InitError(f"{env}={raw!r} is not a number of seconds") from None
    if not isinstance(value, _dt.timedelta):
        value = _dt.timedelta(seconds=float(value))
    if value.total_seconds() <= 0:
        raise InitError(f"{what} must be positive, got {value}")
    return value


def env_init_method(job: JobEnv | None = None) -> str:
    """``env://`` once ``MASTER_ADDR`` and ``MASTER_PORT`` are set and sane; else ``tcp://host:port`` where the
    launcher's conventions give the address (Slurm's first node, LSF's first host, ...: :func:`job_env`).

    Raises:
        InitError: neither gives an address, or the port is not a port.
    """
    job = job_env() if job is None else job
    if job.source != "lsf" and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        port = os.environ["MASTER_PORT"]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InitError(f"MASTER_PORT={port!r} is not a TCP port number")
        return "env://"
    if job.master_addr and job.master_port:
        host = f"[{job.master_addr}]" if ":" in job.master_addr else job.master_addr
        return f"tcp://{host}:{job.master_port}"
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    raise InitError(
        f"{' and '.join(missing)} not set ({job.source}): run under torchrun, srun or jsrun (xccl derives them), "
        "export them (e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500), or pass init_method='tcp://host:port' to "
        "xccl.init"
    )


def rendezvous_error(exc: Exception, rank: int, size: int, elapsed: float, port: int | None = None) -> XcclError:
    """The typed error for a failed ``init_process_group``; the caller chains ``exc``.

    The texts matched are torch 2.13's (``tests/test_faults.py`` and ``tests/test_bad_input.py`` reproduce each).
    """
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    low = text.lower()
    said = f"{type(exc).__name__}: {first}"
    if "eaddrinuse" in low or "address already in use" in low:
        where = os.environ.get("MASTER_PORT", "?") if port is None else str(port)
        return InitError(
            f"rank {rank}: the rendezvous port {where} is already in use on this host ({said}). Another job or a "
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
