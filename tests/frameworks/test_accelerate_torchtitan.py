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
* torchtitan: its FSDP2 recipe on the test MLP (``job_torchtitan.py`` says why not its trainer and debug model):
  torchtitan's ``disable_fsdp_gradient_division`` sets the gradient divide factor to 1.0, so FSDP2 reduce-scatters
  with ``PREMUL_SUM``: the path of issue 21's defect (3).

The bodies are ``job_accelerate.train`` and ``job_torchtitan.train``, the scripts' own training functions.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import _job
import pytest
from _launch import PLUGINS

pytestmark = pytest.mark.frameworks

BODY_TIMEOUT = 240.0
_ACCELERATE = importlib.util.find_spec("accelerate") is not None
_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


def body_accelerate(mode: str) -> dict[str, Any]:
    import job_accelerate

    return job_accelerate.train(mode)


def body_torchtitan_fsdp2() -> dict[str, Any]:
    import job_torchtitan

    return job_torchtitan.train()


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
