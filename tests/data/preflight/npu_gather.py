"""dist.gather on Ascend runs torch_npu's replacement (``torch_npu/distributed/distributed_c10d.py`` ``_gather``,
put in place by torch_npu's patches; in simulation ``xccl_ascend._torch_npu_sim.gather``): a
``broadcast_object_list`` of the root's sizes through xccl's group, then an all_gather on the HCCL backend. A
preflight reports that broadcast at this script's line, not at torch_npu's."""

import torch
import torch.distributed as dist

import xccl

world = xccl.init()
metrics = torch.full((4,), float(world.rank), device=world.device)
out = [torch.empty_like(metrics) for _ in range(world.world_size)] if world.rank == 0 else None
dist.gather(metrics, out, dst=0)
xccl.shutdown()
