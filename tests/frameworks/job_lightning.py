"""Lightning trains :mod:`_job`'s model on xccl's process group, with the recipe of docs/stacks.md.

``python job_lightning.py --strategies ddp --devices 2``: Lightning's own launcher starts the other rank (it re-runs
this script with ``LOCAL_RANK`` set). Under ``torchrun --nproc-per-node N job_lightning.py --devices N`` Lightning
finds torchrun's environment and launches nothing. ``--strategies``, run one after the other in the same world: ``ddp`` (``DDPStrategy``), ``fsdp2`` and ``tp``
(``ModelParallelStrategy``: FSDP2 over the data-parallel dimension, or tensor parallelism; Lightning's FSDP2/TP
strategy, which runs on CPU). The vendor comes from the environment (``XCCL_SIMULATE=sophgo`` ...), as in a user's
job. Rank 0 writes the per-step global loss and the final parameters (:func:`_job.write_result`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import _job
import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import xccl


class Net(L.LightningModule):
    def __init__(self, parallel: str) -> None:
        super().__init__()
        self.net = _job.model()
        self.parallel = parallel
        self.losses: list[float] = []

    def configure_model(self) -> None:
        # ModelParallelStrategy's hook: shard or split the model over the mesh it built on xccl's groups.
        if self.parallel == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in (self.net[0], self.net[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)
        elif self.parallel == "tp":
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.net, self.device_mesh["tensor_parallel"],
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        # sync_dist: Lightning's own all_reduce of the logged value, through xccl's group too.
        self.log("loss", loss, sync_dist=True, on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(self.trainer.callback_metrics["loss"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=_job.LR)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategies", default="ddp", help="comma-separated, run one after the other: ddp,fsdp2,tp")
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()

    # The recipe: xccl's backend name, given to Lightning's strategy; Lightning creates the world on it.
    backend = "gloo" if _job.baseline() else xccl.process_group_backend()
    for name in args.strategies.split(","):
        fit(name, backend, args.devices)


def fit(name: str, backend: str, devices: int) -> None:
    if name == "ddp":
        strategy: Any = DDPStrategy(process_group_backend=backend)
    elif name == "fsdp2":
        strategy = ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1,
                                         process_group_backend=backend)
    else:
        strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=devices,
                                         process_group_backend=backend)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=_job.STEPS,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    x, y = _job.batch()
    dp = devices if name != "tp" else 1
    data = DataLoader(TensorDataset(x, y), batch_size=_job.BATCH // dp)  # Lightning adds a DistributedSampler
    module = Net(name)
    started = time.perf_counter()
    trainer.fit(module, data)
    train_s = time.perf_counter() - started

    import torch.distributed as dist

    group = dist.group.WORLD
    params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v)  # DTensors: a collective on every rank
              for k, v in module.net.state_dict().items()}
    if trainer.global_rank == 0:
        _job.write_result(name, module.losses, params, backend=dist.get_backend(),
                          xccl_group=isinstance(group, xccl.XcclProcessGroup), world_size=trainer.world_size,
                          train_s=train_s)


if __name__ == "__main__":
    main()
