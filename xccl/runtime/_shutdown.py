"""The end of a world: ``xccl.shutdown``, and the teardown at interpreter exit of a world the program left alive."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc

import torch.distributed as dist

from ..collectives._flight import FLIGHT
from ..collectives._flight_dump import dump_at_exit, stop_watch
from ..collectives._groups import close_all
from ..collectives._health._ending import disarm
from ..collectives._health._liveness import close_quietly
from ..collectives._process_group import backend_name
from ..collectives._state import PROCESS
from ..collectives._state import reset as reset_state
from ._compiled import dump_compiled_at_exit

__all__ = ["at_exit", "shutdown"]

@functools.cache
def at_exit() -> None:
    """Register :func:`_shutdown_at_exit` (once per process)."""
    atexit.register(_shutdown_at_exit)


def _shutdown_at_exit() -> None:
    """Tear down, before the interpreter finalizes, a world on xccl's backend that the program left alive.

    A process group alive when the interpreter finalizes can abort the process ("terminate called without an
    active exception"): the groups are then destroyed by module teardown or the last garbage collection, after
    Python has started refusing threads the GIL, and gloo's worker threads (the simulations' kernels) may need it
    to drop their last tensor; a daemon thread inside a GIL-releasing call dies the same way. atexit handlers run
    before that point. Covered: worlds ``xccl.init`` created, and worlds a framework created on the backend
    :func:`process_group_backend` named (Lightning's strategies and torchrun scripts, where CI saw it now and then
    on simulated Sophgo and Ascend). A world on another backend that xccl adopted is left to its creator.
    """
    world, runtime = PROCESS.world, PROCESS.runtime
    ours = world is not None and not world.adopted
    if not ours and runtime is not None and dist.is_initialized():
        with contextlib.suppress(Exception):
            ours = str(dist.get_backend()) == backend_name(runtime)
    if not ours:
        dump_at_exit()  # an adopted world's record is asked for too (ours is dumped by _teardown)
        dump_compiled_at_exit()
        return
    # At exit, a failing teardown must not mask the program's own status.
    with contextlib.suppress(Exception):
        _teardown(destroy=True)


def shutdown() -> None:
    """Destroy the process groups xccl created and forget all of xccl's state; ``xccl.init`` may be called again.

    A world xccl adopted is left to whoever created it.
    """
    world = PROCESS.world
    _teardown(destroy=world is not None and not world.adopted)


def _teardown(*, destroy: bool) -> None:
    """Forget xccl's state; with ``destroy``, destroy the world and shut the vendor's runtime down."""
    runtime, world = PROCESS.runtime, PROCESS.world
    dump_at_exit()
    dump_compiled_at_exit()
    close_quietly(PROCESS.liveness)
    stop_watch(FLIGHT.watch)
    # Drop our references to the process groups first, so that destroy_process_group releases the last ones
    # and the backends are torn down there, in order, rather than later by whoever drops a reference last.
    close_all()
    reset_state()
    if destroy and dist.is_initialized():
        dist.destroy_process_group()
    if runtime is not None and (destroy or world is None):
        runtime.shutdown()
    # A process group can still be held by garbage reference cycles (a stored exception's traceback keeps the
    # frames that created it alive). Collect them now: if the collector only meets them during interpreter
    # shutdown, gloo's worker threads need the GIL to drop their last tensor and the process aborts.
    gc.collect()
    disarm()  # last: a teardown that waits on a device stuck for ever is what the armed end is for
