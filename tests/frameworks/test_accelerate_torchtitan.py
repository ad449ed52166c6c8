"""Accelerate, and torchtitan's FSDP2 recipe, on the world ``xccl.init()`` made (docs/stacks.md's recipe for both:
``xccl.init()`` first, then the framework finds ``torch.distributed`` initialised). Run in pools of live ranks
(:class:`xccl.testing.RankPool`, the environment torchrun gives), on cpu and simulated Sophgo and Ascend, at 2 and
4 ranks; every rank's per-step global loss and final parameters are compared with one process training on the
whole batch.

* Accelerate: ``Accelerator(cpu=True)`` trains with DDP over xccl's world. Its FSDP plugin is ignored on CPU
  (``MULTI_CPU`` is not among the distributed types ``AcceleratorState`` turns into ``FSDP``): the model is
  DDP-wrapped. Without ``cpu=True``, on a machine without an accelerator Accelerate finds (the simulations),
  Accelerate picks ``DistributedType.NO`` and every rank trains alone, silently: the test asserts that this still
  happens, which is what docs/stacks.md warns about.
* torchtitan: its llama3 debug model cannot be imported without ``triton`` (``torchtitan/models/common/
  token_dispatcher.py`` imports it through ``minimal_async_ep``), and its trainer needs an accelerator, a tokenizer
  and a dataset outside the wheel. The run here is torchtitan's FSDP2 set-up on the test MLP: ``fully_shard``
  per layer and the root with ``MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=False)``
  (``apply_fsdp_to_decoder``), torchtitan's own ``disable_fsdp_gradient_division`` (gradient divide factor 1.0,
  so FSDP2 reduce-scatters with ``PREMUL_SUM``: issue 21's defect (3)), and the loss scaled by the global count.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import _job
import pytest
import torch
import torch.distributed as dist
from _launch import PLUGINS
from torch import nn

import xccl

pytestmark = pytest.mark.frameworks

BODY_TIMEOUT = 240.0
_ACCELERATE = importlib.util.find_spec("accelerate") is not None
_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


def _train(model: nn.Module, step: Any, scale: float = 1.0) -> list[float]:
    """:data:`_job.STEPS` steps on this rank's rows; ``step(loss)`` runs backward and the optimizer. The global
    loss of each step (the mean over ranks of the local mean loss, divided by ``scale``)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y = _job.rows(rank, n)
    losses = []
    for _ in range(_job.STEPS):
        loss = nn.functional.mse_loss(model(x), y) * scale
        step(loss)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / n / scale)
    return losses


def _params(state: dict[str, torch.Tensor]) -> dict[str, list[Any]]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().tolist() for k, v in state.items()}


# ---------------------------------------------------------------------------------------------------------------
# Bodies, run on every rank of a pool
# ---------------------------------------------------------------------------------------------------------------


def body_accelerate(mode: str) -> dict[str, Any]:
    """``Accelerator(cpu=True)`` (``mode="cpu"``), with an FSDP2 plugin (``"fsdp"``), or ``Accelerator()``."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)  # Accelerate's state is process-wide; the pool's ranks outlive a test
    try:
        if mode == "cpu":
            acc = Accelerator(cpu=True)
        elif mode == "fsdp":
            acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        else:
            acc = Accelerator()
        net = _job.model()
        model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=_job.LR))

        def step(loss: torch.Tensor) -> None:
            opt.zero_grad()
            acc.backward(loss)
            opt.step()

        losses = _train(model, step)
        return {"distributed_type": str(acc.distributed_type).split(".")[-1], "num_processes": acc.num_processes,
                "wrapper": type(model).__name__, "world_is_xccl": isinstance(dist.group.WORLD, xccl.XcclProcessGroup),
                "losses": losses, "params": _params(acc.unwrap_model(model).state_dict())}
    finally:
        AcceleratorState._reset_state(True)


def body_torchtitan_fsdp2() -> dict[str, Any]:
    """torchtitan's FSDP2 recipe (``apply_fsdp_to_decoder`` + ``disable_fsdp_gradient_division``) on the MLP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torchtitan.distributed.fsdp import disable_fsdp_gradient_division

    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("fsdp",))
    # fp32 parameters and reductions (torchtitan's default is bf16 parameters, fp32 reductions): exact comparison.
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
    model = _job.model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    disable_fsdp_gradient_division(model)  # divide factor 1.0: FSDP2 reduce-scatters with PREMUL_SUM(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=_job.LR)

    def step(loss: torch.Tensor) -> None:
        opt.zero_grad()
        loss.backward()
        opt.step()

    # torchtitan divides the summed loss by the global token count itself: here, the local mean loss by n.
    losses = _train(model, step, scale=1.0 / n)
    return {"losses": losses, "params": _params(model.state_dict())}


# ---------------------------------------------------------------------------------------------------------------
# Tests, in pool order: every body of one (world size, plugin), then the next
# ---------------------------------------------------------------------------------------------------------------

BODIES = ("accelerate_cpu", "accelerate_fsdp_plugin", "accelerate_without_cpu", "torchtitan_fsdp2")
CASES = [(ws, plugin, body) for ws in (2, 4) for plugin in PLUGINS for body in BODIES
         if ws == 2 or body in ("accelerate_cpu", "torchtitan_fsdp2")]


def _needs(body: str) -> None:
    if body.startswith("accelerate") and not _ACCELERATE:
        pytest.skip("accelerate is not installed")
    if body.startswith("torchtitan") and not _TORCHTITAN:
        pytest.skip("torchtitan is not installed")


@pytest.mark.parametrize(("world_size", "plugin", "body"), CASES, ids=[f"{p}-{w}ranks-{b}" for w, p, b in CASES])
def test_framework_on_xccl_world(rank_pools: Any, world_size: int, plugin: str, body: str) -> None:
    _needs(body)
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    what = f"{body} on {plugin}, {world_size} ranks"
    if body == "torchtitan_fsdp2":
        outs = pool.run_ok(body_torchtitan_fsdp2, timeout=BODY_TIMEOUT)
    else:
        mode = {"accelerate_cpu": "cpu", "accelerate_fsdp_plugin": "fsdp", "accelerate_without_cpu": "none"}[body]
        outs = pool.run_ok(body_accelerate, mode, timeout=BODY_TIMEOUT)
    if body == "accelerate_without_cpu":
        # Accelerate finds no accelerator and was not told cpu=True: every rank trains alone on its rows, so the
        # ranks end apart from each other and from the whole-batch reference (docs/stacks.md says so).
        assert all(o["distributed_type"] == "NO" and o["num_processes"] == 1 for o in outs), outs[0]
        assert outs[0]["params"] != outs[1]["params"], f"{what}: the ranks trained together after all"
        return
    for rank, out in enumerate(outs):
        if body.startswith("accelerate"):
            # The FSDP plugin is ignored on CPU: DDP, as with cpu=True alone.
            assert out["distributed_type"] == "MULTI_CPU" and out["wrapper"] == "DistributedDataParallel", out
            assert out["world_is_xccl"] and out["num_processes"] == world_size, out
        _job.compare(out, f"{what}, rank {rank}")
