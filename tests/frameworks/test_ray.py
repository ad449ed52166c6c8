"""Ray Train's ``TorchTrainer`` on xccl's process group: 2 workers, cpu and simulated Sophgo and Ascend, in one
local Ray session for the module (``job_ray.py`` runs one trainer per plugin), the per-step global loss and final
parameters against one process training on the whole batch.

xccl's backend is registered in each Ray worker by Ray's ``worker_process_setup_hook``, which runs as the worker
process starts, before Ray Train has set ``WORLD_SIZE`` and ``LOCAL_RANK``: the path of issue 21's Sophgo
defect (1).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import _job
import pytest
from _launch import PLUGINS, run

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
]

BACKENDS = {"cpu": "xccl_gloo", "sophgo": "xccl_sccl", "ascend": "xccl_hccl"}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The one Ray session of this module: (results folder, its output's tail if the driver failed)."""
    out = tmp_path_factory.mktemp("ray")
    # Ray's own limits: worker start-up is slow on a loaded 2-core machine (the default is 60 s); no usage
    # reporting, no dashboard (job_ray.py), no token file in the user's home.
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",
           "RAY_AUTH_MODE": "disabled"}
    job = run("job_ray.py", ["--plugins", ",".join(PLUGINS), "--workers", "2"], "cpu", out, timeout=900, env=env)
    return out, "" if job.returncode == 0 else f"{job.first_error()}\n{job.output[-3000:]}"


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_ray_train_torch_trainer_2_workers(session: tuple[Path, str], plugin: str) -> None:
    out, driver_error = session
    failed = out / f"{plugin}.error"
    if failed.exists():
        text = failed.read_text()
        root = [line for line in text.splitlines() if "Error: " in line]
        pytest.fail(f"TorchTrainer on {plugin}: {root[-1].strip() if root else text[:500]}")
    if not (out / f"{plugin}.json").exists():
        pytest.fail(f"TorchTrainer on {plugin} did not run: {driver_error}")
    got = _job.read_result(out, plugin)
    assert got["backend"] == BACKENDS[plugin] and got["xccl_group"], f"the world was {got['backend']}"
    _job.compare(got, f"Ray Train on {plugin}")
