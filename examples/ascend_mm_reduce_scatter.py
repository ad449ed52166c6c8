"""Seed 004's ``torch_npu.npu_mm_reduce_scatter_base`` example, written with xccl.

The original sets the NPU, creates an HCCL group, fetches the communicator name with ``get_hccl_comm_name`` (by
a different route before and after torch 2.0.1) and calls the fused kernel with it. With xccl all of that is
``xccl.init`` and ``xccl.mm_reduce_scatter(a, b)``: on Ascend it runs torch_npu's fused MC2 kernel after checking
every documented constraint; where a constraint fails (or on another vendor) it runs xccl's portable pipelined
version instead, with a warning that names the constraint.

Run it on Ascend NPUs, or anywhere in simulation (CPU, HCCL's rules enforced, the kernel computed on CPU)::

    torchrun --nproc-per-node 8 examples/ascend_mm_reduce_scatter.py
    XCCL_SIMULATE=ascend torchrun --nproc-per-node 2 examples/ascend_mm_reduce_scatter.py
"""

from __future__ import annotations

import torch

import xccl


def main() -> None:
    world = xccl.init(vendor="ascend")
    x1_shape, x2_shape, dtype = (128, 512), (512, 64), torch.float16  # the seed's shapes and dtype

    # Each rank's operands, reproducible on every rank so each can check the result on its own.
    def operands(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(rank)
        return torch.randn(x1_shape, generator=gen).to(dtype), torch.randn(x2_shape, generator=gen).to(dtype)

    x1, x2 = (t.to(world.device) for t in operands(world.rank))
    output = xccl.mm_reduce_scatter(x1, x2)  # reduce_scatter(x1 @ x2) along dim 0: (128 / world_size, 64)

    # Reference: the sum over ranks of x1 @ x2 in float32, this rank's block of rows.
    full = sum(a.float() @ b.float() for a, b in (operands(r) for r in range(world.world_size)))
    block = x1_shape[0] // world.world_size
    expected = full[world.rank * block : (world.rank + 1) * block]
    torch.testing.assert_close(output.float().cpu(), expected, rtol=1e-2, atol=1e-1)
    print(f"rank {world.rank}/{world.world_size} on {world.plugin} ({'simulated ' if world.simulate else ''}"
          f"{world.backend}): mm_reduce_scatter {tuple(output.shape)} {output.dtype} matches the reference; "
          f"communicator {xccl.comm_name()}")
    xccl.shutdown()


if __name__ == "__main__":
    main()
