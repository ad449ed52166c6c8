"""Ray Train's ``TorchTrainer`` trains :mod:`_job`'s model on xccl's process group, 2 workers, one Ray session.

``python job_ray.py --plugins cpu,sophgo,ascend``: starts one local Ray session, then per plugin one
``TorchTrainer.fit`` with the recipe of docs/stacks.md: a worker set-up hook that runs
``xccl.process_group_backend()`` in every Ray worker process (so xccl's backend name is registered there before
Ray Train creates the process group), and ``TorchConfig(backend=...)`` naming it. The vendor reaches the workers
as ``XCCL_SIMULATE`` in ``RunConfig(worker_runtime_env=...)``, one trainer per plugin in the same session. Each
plugin's result (or the error that stopped it) is written as ``$XCCL_FRAMEWORK_TEST_OUT/<plugin>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import _job

#: xccl's backend name for each plugin (what process_group_backend() returns for it).
BACKENDS = {"cpu": "xccl_gloo", "sophgo": "xccl_sccl", "ascend": "xccl_hccl", "gloo": "gloo"}
SIMULATE = {"cpu": "", "sophgo": "sophgo", "ascend": "ascend", "gloo": ""}


def xccl_setup() -> None:
    """Ray's ``worker_process_setup_hook``: register xccl's backend in each worker process as it starts."""
    import xccl

    xccl.process_group_backend(fallback="emulate")


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: plain torch DDP through Ray's helpers, on the world Ray created."""
    import torch
    import torch.distributed as dist
    from ray import train
    from ray.train.torch import prepare_model
    from torch import nn

    import xccl

    ctx = train.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    model = prepare_model(_job.model())  # DistributedDataParallel on Ray's (xccl's) world
    opt = torch.optim.SGD(model.parameters(), lr=_job.LR)
    x, y = _job.rows(rank, size)
    losses = []
    started = time.perf_counter()
    for _ in range(_job.STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / size)
    train_s = time.perf_counter() - started
    if rank == 0:
        os.environ[_job.OUT_ENV] = config["out"]
        _job.write_result(config["name"], losses, model.module.state_dict(), backend=dist.get_backend(),
                          xccl_group=isinstance(dist.group.WORLD, xccl.XcclProcessGroup), world_size=size,
                          train_s=train_s)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plugins", default="cpu,sophgo,ascend",
                   help="comma-separated; 'gloo' is the baseline: plain gloo, no xccl (benchmarks/frameworks.py)")
    p.add_argument("--repeat", type=int, default=1, help="run the list this many times (benchmarks)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    out = os.environ[_job.OUT_ENV]

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Room for two trainers' workers: a failed trainer's placement group is released asynchronously.
    ray.init(num_cpus=2 * args.workers, include_dashboard=False, log_to_driver=True,
             runtime_env={"worker_process_setup_hook": xccl_setup})
    try:
        for i, plugin in enumerate(args.plugins.split(",") * args.repeat):
            try:
                trainer = TorchTrainer(
                    train_loop,
                    train_loop_config={"out": out, "name": plugin if args.repeat == 1 else f"{plugin}.{i}"},
                    torch_config=TorchConfig(backend=BACKENDS[plugin]),
                    scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
                    run_config=RunConfig(name=f"xccl-{plugin}-{i}", storage_path=tempfile.mkdtemp(),
                                         worker_runtime_env={"env_vars": {"XCCL_SIMULATE": SIMULATE[plugin]}}),
                )
                started = time.perf_counter()
                trainer.fit()
                Path(out, f"{plugin}.{i}.fit_s").write_text(str(time.perf_counter() - started))
            except Exception as exc:  # recorded for the test, which fails with it; the next plugin still runs
                Path(out, f"{plugin}.error").write_text(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
