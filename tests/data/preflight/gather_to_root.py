"""Collect every rank's metrics on rank 0 with a gather. HCCL has no gather: xccl emulates it with an all_gather
unless the script forbids emulation, as this one does (fallback="error"), so on Ascend the gather raises
UnsupportedCollective before communicating, on every rank; a preflight reports it at collect()'s line."""

import torch
import torch.distributed as dist

import xccl


def collect(metrics: torch.Tensor, rank: int, size: int) -> None:
    out = [torch.empty_like(metrics) for _ in range(size)] if rank == 0 else None
    xccl.gather(metrics, out, dst=0)


world = xccl.init(fallback="error")
dist.all_reduce(torch.ones(8, device=world.device))
collect(torch.full((4,), float(world.rank), device=world.device), world.rank, world.world_size)
xccl.shutdown()
