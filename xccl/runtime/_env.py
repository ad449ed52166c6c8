"""What ``xccl.init`` reads from the environment, and how a failed rendezvous is explained.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; Open MPI sets
``OMPI_COMM_WORLD_*``. Every value is checked here, so a bad one is an :class:`~xccl.InitError` naming the variable
rather than a failure deep in torch.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence

from ..collectives._state import DEFAULT_TIMEOUT
from ..errors import InitError, RendezvousTimeout, XcclError
from ..plugin._job import Job

__all__ = ["env_init_method", "env_int", "job_of", "rendezvous_error", "resolve_ranks", "timeout_of"]

#: The launcher's variables for the local rank and the node's size, first match wins (torchrun's, Open MPI's).
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
_LOCAL_WORLD_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def env_int(names: Sequence[str], what: str) -> int | None:
    """The first of ``names`` set in the environment, as an int (``what`` it means, for the error).

    Raises:
        InitError: it is set but not an integer.
    """
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise InitError(f"environment variable {name}={raw!r} is not an integer ({what}); fix or unset it") from None
    return None


def resolve_ranks(
    rank: int | None, world_size: int | None, local_rank: int | None
) -> tuple[int, int, int, bool]:
    """rank, world size, local rank, and whether they came from the environment."""
    from_env = rank is None and world_size is None
    if rank is None:
        rank = env_int(("RANK", "OMPI_COMM_WORLD_RANK"), "this process's global rank")
    if world_size is None:
        world_size = env_int(("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"), "the number of ranks")
    if local_rank is None:
        local_rank = env_int(_LOCAL_RANK_VARS, "the rank within this node")
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


def job_of(rank: int, world_size: int, local_rank: int | None = None) -> Job:
    """The :class:`~xccl.plugin.Job` a runtime is placed for: ``rank`` of ``world_size``, the node's size from the
    launcher (None when it says nothing), the local rank given, else the launcher's, else the rank's place on its
    node (``rank`` itself on a single node).

    Raises:
        InitError: a variable is not an integer, or the values contradict each other.
    """
    local_world = env_int(_LOCAL_WORLD_VARS, "the number of ranks on this node")
    if local_rank is None:
        local_rank = env_int(_LOCAL_RANK_VARS, "the rank within this node")
    if local_rank is None:
        local_rank = rank if local_world is None else rank % local_world
    return Job(rank, world_size, local_rank, local_world)


def timeout_of(timeout: _dt.timedelta | float | None) -> _dt.timedelta:
    """``timeout`` (a timedelta or seconds), else ``XCCL_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`.

    Raises:
        InitError: not a positive number of seconds.
    """
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


def env_init_method() -> str:
    """``env://``, once ``MASTER_ADDR`` and ``MASTER_PORT`` are known to be set and sane.

    Raises:
        InitError: either is missing, or the port is not a port.
    """
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


def rendezvous_error(exc: Exception, rank: int, size: int, elapsed: float) -> XcclError:
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
