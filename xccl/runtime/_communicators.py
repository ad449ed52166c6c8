"""What xccl holds in this process: the communicators of every process group, and the device memory they take.

A vendor's communicator costs device memory whatever it carries (HCCL: twice ``HCCL_BUFFSIZE``, one buffer to send
and one to receive, 400 MB by default, per communicator, or twice the group's ``hccl_config["hccl_buffer_size"]``;
twice ``P2P_HCCL_BUFFSIZE`` per pair of ranks that send to each other). Each group of xccl's backend holds
one of the vendor's, plus a host-side gloo group only where the plugin's table stages point-to-point through host
memory (never on Ascend, whose send/recv are native); ``xccl.runtime.vendor_group()`` makes one more, on request.
:func:`communicators` lists them; ``xccl doctor`` shows them when run in a process where xccl is initialised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, final

import torch.distributed as dist

from ..collectives._state import PROCESS

__all__ = ["Communicator", "communicators"]


@final
@dataclass(frozen=True, slots=True)
class Communicator:
    """One communicator this process holds."""

    #: torch's name of the group (``"0"`` is the world).
    group: str
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: ``"vendor"`` (the vendor's own group under xccl's), ``"host gloo"`` (xccl's host-side group for point-to-point
    #: staged through host memory) or ``"vendor (raw)"`` (a group of the vendor's backend without xccl's dispatch).
    kind: str
    #: The torch.distributed backend of the communicator (``"hccl"``, ``"gloo"``).
    backend: str
    #: Whether the vendor connected it yet (None: the vendor connects at creation, or it cannot tell).
    connected: bool | None
    #: Device memory it takes, MB, once connected (None: the vendor declares none): the vendor's buffers at the
    #: group's own size where its options set one (``CommMemory.comm_mb``).
    memory_mb: int | None


def communicators() -> list[Communicator]:
    """Every communicator of every process group in this process, world first.

    Example::

        for c in xccl.runtime.communicators():
            print(c.group, c.ranks, c.kind, c.connected, c.memory_mb)
    """
    runtime = PROCESS.runtime
    if runtime is None or not dist.is_initialized():
        return []
    memory = runtime.plugin.vendor_runtime().comm_memory
    out = []
    for group in list(dist.distributed_c10d._world.pg_map):
        ranks = tuple(dist.get_process_group_ranks(group))
        name = str(group.group_name)
        native: Any = getattr(group, "native", None)
        if native is None and str(dist.get_backend(group)) != runtime.backend:
            continue
        # A simulated vendor group keeps its options; a raw group of the vendor's own backend may not say.
        mb = None if memory is None else memory.comm_mb(os.environ, getattr(group, "pg_options", None))
        kind = "vendor" if native is not None else "vendor (raw)"
        out.append(Communicator(name, ranks, kind, runtime.backend, runtime.comm_connected(group), mb))
        if native is not None and getattr(group, "side", None) is not None:
            out.append(Communicator(name, ranks, "host gloo", "gloo", None, None))
    return out

