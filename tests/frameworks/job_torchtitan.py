"""torchtitan's FSDP2 recipe trains :mod:`_job`'s model on the world ``xccl.init()`` made.

``torchrun --nproc-per-node 2 job_torchtitan.py``. torchtitan's trainer does not run on a CPU-only machine:
its llama3 debug model imports ``triton`` (``torchtitan/models/common/token_dispatcher.py`` through
``minimal_async_ep``), and the trainer wants an accelerator (``torchtitan/tools/utils.py`` falls back to "cuda"), a
tokenizer and a dataset that the wheel does not ship. So this is torchtitan's FSDP2 set-up on the test MLP, with
torchtitan's own code where it is generic: ``fully_shard`` per layer and on the root with
``MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=False)`` as ``apply_fsdp_to_decoder`` does,
then ``torchtitan.distributed.fsdp.disable_fsdp_gradient_division`` (gradient divide factor 1.0: FSDP2 then
reduce-scatters with ``PREMUL_SUM``), and the loss divided by the global count as torchtitan's trainer does.
:func:`train` is also what the pooled tests run.
"""

from __future__ import annotations

import time
from typing import Any

import _job
import torch
import torch.distributed as dist
from torch import nn

import xccl


def train(force_sum: bool = False) -> dict[str, Any]:
    """Train with torchtitan's FSDP2 recipe on the current world; the losses and the final parameters.

    ``force_sum``: FSDP2's ``set_force_sum_reduction_for_comms(True)`` (what torchtitan sets with symmetric
    memory): a plain SUM and a local divide instead of ``PREMUL_SUM``, which plain gloo lacks.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torchtitan.distributed.fsdp import disable_fsdp_gradient_division

    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("fsdp",))
    # fp32 parameters and reductions (torchtitan's default is bf16 parameters, fp32 reductions): exact comparison.
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
    model = _job.model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    disable_fsdp_gradient_division(model)  # divide factor 1.0: FSDP2 reduce-scatters with PREMUL_SUM(1.0)
    if force_sum:  # on every FSDP module, as torchtitan's enable_fsdp_symm_mem does (the setting is per module)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.SGD(model.parameters(), lr=_job.LR)
    x, y = _job.rows(rank, n)
    losses = []
    started = time.perf_counter()
    for _ in range(_job.STEPS):
        opt.zero_grad()
        # torchtitan divides the summed loss by the global token count itself: here, the local mean loss by n.
        loss = nn.functional.mse_loss(model(x), y) / n
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().tolist()
              for k, v in model.state_dict().items()}
    return {"train_s": time.perf_counter() - started, "losses": losses, "params": params,
            "world_is_xccl": isinstance(dist.group.WORLD, xccl.XcclProcessGroup)}


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--force-sum", action="store_true", help="SUM instead of PREMUL_SUM (see train)")
    args = p.parse_args()
    if _job.baseline():
        dist.init_process_group("gloo")
    else:
        xccl.init()  # the recipe: xccl's world first; torchtitan's init_distributed finds it initialised
    out = train(args.force_sum)
    if dist.get_rank() == 0:
        params = {k: torch.tensor(v) for k, v in out.pop("params").items()}
        _job.write_result("torchtitan_fsdp2", out.pop("losses"), params, **out)
    if _job.baseline():
        dist.destroy_process_group()
    else:
        xccl.shutdown()


if __name__ == "__main__":
    main()
