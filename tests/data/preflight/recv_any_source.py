"""Rank 0 takes a message from whichever rank sends first: HCCL has no receive from any source, so on Ascend the
recv raises UnsupportedCollective on rank 0 alone, and rank 1's send is left waiting."""

import torch
import torch.distributed as dist

import xccl

world = xccl.init()
t = torch.zeros(4, device=world.device)
if world.rank == 0:
    dist.recv(t)
else:
    dist.send(t + 1, dst=0)
xccl.shutdown()
