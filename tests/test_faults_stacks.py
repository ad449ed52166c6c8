"""Typed faults wherever a ``Work`` is waited on: a rank SIGKILLed while DDP or FSDP2 trains.

DDP's reducer waits on each bucket's future from C++ at the end of the backward pass, and FSDP2 waits on its
all-gathers and reduce-scatters; neither goes through xccl's own calls. Every survivor must still raise xccl's typed
error (:class:`~xccl.PeerFailure` or :class:`~xccl.CollectiveTimeout`, never gloo's raw ``RuntimeError``) within
the collective timeout + 5 s of the death, on cpu and on both simulated vendors. A survivor that was not talking to the
dead rank (its ring neighbours gave up on the step) learns of it from xccl's health watch, about a second into its wait
(``tests/test_health.py`` times that at a 300 s timeout).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import xccl
from xccl.testing import RankPool, all_here

TIMEOUT = 3.0
TYPED = ("PeerFailure", "CollectiveTimeout")


def _die(path: str) -> None:
    Path(path).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _model(stack: str, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    if stack == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def body_train_until_a_rank_dies(stack: str, victim: int, path: str) -> dict[str, Any]:
    """Every rank trains; the victim kills itself from a second thread while its main thread is in a step. Each
    survivor reports what its training loop raised: class names, when, and the chained backend error."""
    all_here(f"train-{stack}")  # the short timeout is for the kill, not for ranks of a loaded machine arriving apart
    w = xccl.get_world()
    model = _model(stack, w.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32, device=w.device)
    for _ in range(3):  # the stack is set up and has run on every rank
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    if w.rank == victim:
        threading.Timer(0.2, _die, (path,)).start()
    try:
        for _ in range(1_000_000):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    except Exception as exc:
        cause = exc.__cause__
        return {"types": [c.__name__ for c in type(exc).__mro__], "at": time.time(), "message": str(exc)[:500],
                "cause": f"{type(cause).__name__}" if cause is not None else ""}
    return {"types": ["no error"]}


# 8-14 s a case (4 ranks, started fresh): the first tier kills a rank once per vendor and at least once per stack.
@pytest.mark.slow_cases("ddp-cpu", "fsdp2-sophgo", "ddp-ascend")
@pytest.mark.parametrize("vendor", ["cpu", "sophgo", "ascend"])
@pytest.mark.parametrize("stack", ["ddp", "fsdp2"])
def test_a_rank_killed_under_a_training_stack_is_a_typed_error_on_every_survivor(tmp_path, stack, vendor):
    path = tmp_path / "death"
    env = {} if vendor == "cpu" else {"XCCL_SIMULATE": vendor}
    if vendor == "ascend":
        # What bounds a collective on Ascend is HCCL_EXEC_TIMEOUT (xccl keeps the group's timeout above it): a
        # survivor whose peers gave up on the step (not the dead rank) waits that long, as on the hardware.
        env["HCCL_EXEC_TIMEOUT"] = str(int(TIMEOUT))
    with RankPool(4, {"timeout": TIMEOUT}, env=env, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_train_until_a_rank_dies, stack, 3, str(path), timeout=TIMEOUT + 60)
    died = float(path.read_text())
    assert outs[3].raised("RankDied"), str(outs[3])
    for o in outs[:3]:
        assert o.ok, str(o)
        report = o.value
        assert any(t in report["types"] for t in TYPED) and "XcclError" in report["types"], report
        assert report["at"] - died < TIMEOUT + 5, report
