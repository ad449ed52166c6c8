"""Lightning on xccl's process group, as docs/stacks.md's recipe runs it: 2 ranks, cpu and simulated Sophgo and
Ascend, the per-step global loss and the final parameters against one process training on the whole batch.

* Lightning's own launcher: ``python job_lightning.py`` with ``devices=2``; Lightning re-runs the script for rank 1.
  ``xccl.process_group_backend()`` therefore runs on rank 0 before Lightning has set ``WORLD_SIZE``, which is the
  path of issue 21's Sophgo defect (1).
* ``torchrun``: DDP, then FSDP2 and tensor parallelism through ``ModelParallelStrategy``, one after the other in
  the same world (one launch per plugin).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import _job
import pytest
from _launch import PLUGINS, run

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed"),
]

BACKENDS = {"cpu": "xccl_gloo", "sophgo": "xccl_sccl", "ascend": "xccl_hccl"}


def _check(out: Path, name: str, plugin: str, what: str) -> None:
    got = _job.read_result(out, name)
    assert got["backend"] == BACKENDS[plugin] and got["xccl_group"], f"{what}: the world was {got['backend']}"
    _job.compare(got, what)


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_lightning_ddp_with_its_own_launcher(plugin: str, tmp_path: Path) -> None:
    job = run("job_lightning.py", ["--strategies", "ddp", "--devices", "2"], plugin, tmp_path, timeout=300)
    assert job.returncode == 0, f"Lightning's launcher on {plugin}: {job.first_error()}\n{job.output[-3000:]}"
    _check(tmp_path, "ddp", plugin, f"Lightning DDP, own launcher, {plugin}")


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_lightning_ddp_fsdp2_tp_under_torchrun(plugin: str, tmp_path: Path) -> None:
    job = run("job_lightning.py", ["--strategies", "ddp,fsdp2,tp", "--devices", "2"], plugin, tmp_path, nproc=2,
              timeout=400)
    assert job.returncode == 0, f"Lightning under torchrun on {plugin}: {job.first_error()}\n{job.output[-3000:]}"
    for name in ("ddp", "fsdp2", "tp"):
        _check(tmp_path, name, plugin, f"Lightning {name}, torchrun, {plugin}")
