"""Seed 000's ``AllReduceSingleGroup`` (a collective inside a compiled graph), written with xccl.

The original spawns the ranks itself, sets the NPU, creates the HCCL group, patches torch.distributed with
``torchair.patch_for_hcom()`` and compiles with TorchAir's backend. With xccl: ``torchrun`` starts the ranks,
``xccl.init`` sets the device and creates the group, and the model calls ``xccl.all_reduce``, which traces into the
graph as a functional collective, and ``xccl.compile`` hands the graph to TorchAir, which converts it to an HCCL
graph op (in simulation, a simulated TorchAir checks that every node has a converter).

Run it on Ascend NPUs, or anywhere in simulation::

    torchrun --nproc-per-node 2 examples/ascend_all_reduce_single_group.py
    XCCL_SIMULATE=ascend torchrun --nproc-per-node 2 examples/ascend_all_reduce_single_group.py
"""

from __future__ import annotations

import torch

import xccl


class AllReduceSingleGroup(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + y
        xccl.all_reduce(x, op=xccl.ReduceOp.SUM)
        return x


def main() -> None:
    world = xccl.init(vendor="ascend")
    x = torch.ones([2, 2], dtype=torch.int32, device=world.device)
    y = torch.ones([2, 2], dtype=torch.int32, device=world.device)
    # xccl.compile hands the graph to the plugin's compiler: TorchAir on Ascend, the simulated TorchAir check in
    # simulation (every node must have a TorchAir converter), Inductor elsewhere.
    model = xccl.compile(AllReduceSingleGroup().to(world.device), dynamic=False, fullgraph=True)
    out = torch.ones([2, 2], dtype=torch.int32, device=world.device) * 2 * world.world_size
    ret = model(x, y)
    if not out.equal(ret):
        raise SystemExit(f"rank {world.rank}: expected {out.tolist()}, got {ret.tolist()}")
    print(f"rank {world.rank}/{world.world_size} on {world.plugin} ({'simulated ' if world.simulate else ''}"
          f"{world.backend}): compiled all_reduce gives {ret.tolist()}")
    xccl.shutdown()


if __name__ == "__main__":
    main()
