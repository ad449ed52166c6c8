"""The vendor's own process group for one group, built the way ``torch.distributed`` would build it.

``Runtime.create_native_group`` calls this by default; xccl's c10d process group wraps the result. gloo and nccl
are built directly, as ``torch.distributed.distributed_c10d._new_process_group_helper`` does in torch 2.13; any
other backend name goes through the creator its package registered with ``Backend.register_backend`` (torch_npu's
``hccl``, Sophgo's ``sccl``, or xccl's simulations of them).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..errors import InitError
from ._fake_world import transport

__all__ = ["create_native_group"]


def create_native_group(backend: str, options: Any, pg_options: Any) -> Any:
    """A c10d ``Backend`` or ``ProcessGroup`` of ``backend`` for the group ``options`` describes.

    Raises:
        InitError: no backend of that name is available in this process.
    """
    c10d: Any = dist.distributed_c10d
    store, rank, size, timeout = options.store, options.group_rank, options.group_size, options.timeout
    net = transport()
    if not net.waits and backend in ("gloo", "nccl"):
        return net.gloo(store, rank, size, timeout)  # a fake world (preflight): no communication
    if backend == "gloo":
        gloo = net.gloo(store, rank, size, timeout)
        gloo.options.global_ranks_in_group = list(options.global_ranks_in_group)
        gloo.options.group_name = options.group_id
        return gloo
    if backend == "nccl":
        opts = pg_options if pg_options is not None else c10d.ProcessGroupNCCL.Options()
        if pg_options is None:
            opts.is_high_priority_stream = False
        opts._timeout = timeout
        opts.global_ranks_in_group = list(options.global_ranks_in_group)
        opts.group_name = options.group_id
        return c10d.ProcessGroupNCCL(store, rank, size, opts)
    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is None:
        raise InitError(
            f"torch.distributed has no backend {backend!r} in this process: import the vendor's package (torch_npu "
            "registers 'hccl', torch_tpu 'sccl') or simulate it with xccl.init(vendor=..., simulate=True)"
        )
    if plugin.extended_api:
        return plugin.creator_fn(options, pg_options)
    return plugin.creator_fn(store, rank, size, timeout)
