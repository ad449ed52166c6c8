"""Sophgo's all_reduce example (torch-tpu distributed tutorial), written with xccl.

On Sophgo TPUs::

    xccl rank-table sophgo --device-id '[[0,2,6,7,3,1,5,4]]' -o rank_table.json   # optional
    RANK_TABLE_FILE=rank_table.json torchrun --standalone --nproc-per-node 8 examples/sophgo_all_reduce.py

Anywhere, in xccl's CPU simulation of SCCL (same code path, simulated chips)::

    XCCL_SIMULATE=sophgo torchrun --standalone --nproc-per-node 8 examples/sophgo_all_reduce.py

Every rank prints ``results: tensor([8., 8., 8., 8.])`` (the world size, in each element).

What xccl does in ``init`` that the original did by hand: parse the rank table (Sophgo's reader is broken in its
current source), select this rank's chip with ``torch_tpu.tpu.set_device``, and create the ``sccl`` process
group with ``ProcessGroupSCCLOptions`` carrying the chip map.
"""

import torch

import xccl


def main() -> None:
    world = xccl.init(vendor="sophgo")

    tensor = torch.ones(4).float()
    print(f"rank: {world.rank}, {tensor}")
    tensor = tensor.to(world.device)  # tpu:<chip> on hardware, cpu in simulation

    xccl.all_reduce(tensor, op=xccl.ReduceOp.SUM)

    print(f"rank: {world.rank}, results: {tensor.cpu()}")
    xccl.shutdown()


if __name__ == "__main__":
    main()
