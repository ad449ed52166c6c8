"""A small FSDP2 training loop, written for torchrun: the script `xccl preflight` runs in docs/preflight.md.

    torchrun --nproc-per-node 4 examples/fsdp2_train.py --steps 2
    xccl preflight --vendor sophgo --world 4 -- python examples/fsdp2_train.py --steps 2
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import xccl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    world = xccl.init()
    mesh = init_device_mesh(world.device.type, (world.world_size,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 8))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(4, args.width, generator=torch.Generator().manual_seed(step * 100 + world.rank))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    if world.rank == 0:
        print(f"trained {args.steps} steps on {world.world_size} ranks")
    xccl.shutdown()


if __name__ == "__main__":
    main()
