"""DeepSpeed ZeRO trains :mod:`_job`'s model on xccl's process group, unmodified, with the recipe of docs/stacks.md.

``torchrun --nproc-per-node 2 job_deepspeed.py --stages 1,2,3``: ``deepspeed.init_distributed`` creates the world
on xccl's backend (``xccl.process_group_backend()``), ``xccl.init()`` adopts it, then one ``deepspeed.initialize``
per ZeRO stage (DeepSpeed's CPU accelerator, fp32, the model's SGD as DeepSpeed's client optimizer). The vendor
comes from the environment (``XCCL_SIMULATE``). Rank 0 writes each stage's result as ``zero<stage>.json``; a stage
that raises writes ``zero<stage>.error`` and ends the job (the ranks may disagree on where they stopped).
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path
from typing import Any

import _job
import torch
import torch.distributed as dist
from torch import nn

import xccl


def config(stage: int, world_size: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": _job.BATCH // world_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        # torch.optim.SGD is not one of DeepSpeed's own optimizers; ZeRO accepts it with this flag.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }


def train(stage: int) -> None:
    import deepspeed

    rank, size = dist.get_rank(), dist.get_world_size()
    net = _job.model()
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=_job.LR),
                                           config=config(stage, size))
    x, y = _job.rows(rank, size)
    losses = []
    started = time.perf_counter()
    for _ in range(_job.STEPS):
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / size)
    train_s = time.perf_counter() - started
    # ZeRO-3 keeps each parameter partitioned: gather them (a collective on every rank) to read them whole.
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
        params = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        _job.write_result(f"zero{stage}", losses, params, backend=dist.get_backend(),
                          xccl_group=isinstance(dist.group.WORLD, xccl.XcclProcessGroup), world_size=size,
                          train_s=train_s)
    engine.destroy()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stages", default="1,2,3")
    args = p.parse_args()
    import deepspeed

    # The recipe: DeepSpeed creates the world on xccl's backend; xccl.init() then adopts it.
    if _job.baseline():
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        deepspeed.init_distributed(dist_backend=xccl.process_group_backend())
        world = xccl.init()
        if not world.adopted:
            raise AssertionError("xccl.init() did not adopt DeepSpeed's world")
    for stage in map(int, args.stages.split(",")):
        try:
            train(stage)
        except Exception as exc:  # every rank records it; the test fails with it
            out = os.environ.get(_job.OUT_ENV)
            text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            if out:
                Path(out, f"zero{stage}.error").write_text(text)
            else:
                print(text)
            raise


if __name__ == "__main__":
    main()
