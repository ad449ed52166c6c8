"""Accelerate trains :mod:`_job`'s model on the world ``xccl.init()`` made, with the recipe of docs/stacks.md.

``torchrun --nproc-per-node 2 job_accelerate.py [--mode cpu|fsdp|none]``: ``xccl.init()`` first, then
``Accelerator(cpu=True)``, which finds ``torch.distributed`` initialised and wraps the model in DDP over xccl's
world. ``--mode fsdp`` adds an FSDP2 plugin (ignored on CPU), ``--mode none`` leaves out ``cpu=True`` (every rank
then trains alone where Accelerate finds no accelerator). :func:`train` is also what the pooled tests run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import _job
import torch
import torch.distributed as dist
from torch import nn

import xccl


def train(mode: str = "cpu") -> dict[str, Any]:
    """Train with Accelerate on the current world; what happened, the losses and the final parameters."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)  # Accelerate's state is process-wide (a pool's ranks outlive a test)
    try:
        if mode == "cpu":
            acc = Accelerator(cpu=True)
        elif mode == "fsdp":
            acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        else:
            acc = Accelerator()
        net = _job.model()
        model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=_job.LR))
        rank, n = dist.get_rank(), dist.get_world_size()
        x, y = _job.rows(rank, n)
        losses = []
        started = time.perf_counter()
        for _ in range(_job.STEPS):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item() / n)
        return {"distributed_type": str(acc.distributed_type).split(".")[-1], "num_processes": acc.num_processes,
                "wrapper": type(model).__name__, "world_is_xccl": isinstance(dist.group.WORLD, xccl.XcclProcessGroup),
                "train_s": time.perf_counter() - started, "losses": losses,
                "params": {k: v.detach().tolist() for k, v in acc.unwrap_model(model).state_dict().items()}}
    finally:
        AcceleratorState._reset_state(True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("cpu", "fsdp", "none"), default="cpu")
    args = p.parse_args()
    if _job.baseline():
        dist.init_process_group("gloo")
    else:
        xccl.init()  # the recipe: xccl's world first; Accelerate finds it and uses it
    out = train(args.mode)
    if dist.get_rank() == 0:
        params = {k: torch.tensor(v) for k, v in out.pop("params").items()}
        _job.write_result(f"accelerate_{args.mode}", out.pop("losses"), params, **out)
    if _job.baseline():
        dist.destroy_process_group()
    else:
        xccl.shutdown()


if __name__ == "__main__":
    main()
