"""A DTensor tensor-parallel + FSDP2 training loop, written for torchrun: the second script `xccl preflight` runs in
docs/preflight.md (TP + FSDP2 on Ascend A2 at 16 ranks on 2 nodes).

The mesh is ``("dp", "tp")``: tensor parallelism inside a node (``--tp``, default 8: an Atlas A2 server's 8 NPUs),
FSDP2 across nodes. The MLP's first linear layer is split by columns and its second by rows
(``ColwiseParallel`` / ``RowwiseParallel``: an all_reduce over ``tp`` in the forward pass, and one in the
backward), then FSDP2 shards the parameters over ``dp`` (all_gather before use, reduce_scatter of the gradients).
The loss every rank logs is averaged over ``dp`` in a compiled region (``xccl.compile``: on Ascend, TorchAir).

    torchrun --nnodes 2 --nproc-per-node 8 examples/tp_fsdp2_train.py --steps 2
    xccl preflight --vendor ascend --world 16 --nodes 2 -- python examples/tp_fsdp2_train.py --steps 1
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import xccl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--tp", type=int, default=8)
    args = parser.parse_args()
    world = xccl.init()
    tp = min(args.tp, world.world_size)
    mesh = init_device_mesh(world.device.type, (world.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_group, dp = mesh.get_group("dp"), mesh["dp"].size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.ReLU(), nn.Linear(4 * args.width, args.width))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @xccl.compile
    def mean_loss(loss: torch.Tensor) -> torch.Tensor:
        total = loss.detach().clone()
        xccl.all_reduce(total, group=dp_group)
        return total / dp

    for step in range(args.steps):
        # The same batch on every rank of a tp group: its seed is the dp coordinate.
        seed = step * 100 + mesh.get_local_rank("dp")
        x = torch.randn(8, args.width, generator=torch.Generator().manual_seed(seed))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged = mean_loss(loss)
    if world.rank == 0:
        print(f"trained {args.steps} steps on {world.world_size} ranks (dp {dp} x tp {tp}), loss {logged.item():.4f}")
    xccl.shutdown()


if __name__ == "__main__":
    main()
