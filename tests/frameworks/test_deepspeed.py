"""DeepSpeed ZeRO-1, ZeRO-2 and ZeRO-3, unmodified, on xccl's process group under torchrun: 2 ranks, cpu and
simulated Sophgo and Ascend, each stage's per-step global loss and final parameters against one process training on
the whole batch.

DeepSpeed runs on its CPU accelerator, which JIT-builds its shared-memory all_reduce kernel (g++ and ninja) the
first time (a minute or more; cached after, in this environment's folder: ``DS_ENV``). ZeRO-3 all_reduces its
gradient norm in float64 (``get_norm_dtype()`` in ``deepspeed/runtime/zero/stage3.py``): the path of issue 21's
defect (2) on simulated Sophgo and Ascend.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import _job
import pytest
from _launch import PLUGINS, run

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
]

BACKENDS = {"cpu": "xccl_gloo", "sophgo": "xccl_sccl", "ascend": "xccl_hccl"}
#: DeepSpeed's CPU accelerator, and its JIT-built kernel cached in this environment's own folder: the default
#: (~/.cache/torch_extensions) is shared by every environment of the user, whose builds differ by include paths
#: and so rebuild over each other, under a lock, when several run at once.
DS_ENV = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(Path(sys.prefix) / "torch_extensions")}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """One torchrun per plugin, all three stages in it: (results folder, first error or "")."""
    done = {}
    for plugin in PLUGINS:
        out = tmp_path_factory.mktemp(f"deepspeed-{plugin}")
        job = run("job_deepspeed.py", ["--stages", "1,2,3"], plugin, out, nproc=2, timeout=540, env=DS_ENV)
        done[plugin] = (out, "" if job.returncode == 0 else f"{job.first_error()}\n{job.output[-2000:]}")
    return done


def _stage(jobs: dict[str, tuple[Path, str]], plugin: str, stage: int) -> None:
    out, error = jobs[plugin]
    failed = out / f"zero{stage}.error"
    if failed.exists():
        pytest.fail(f"ZeRO-{stage} on {plugin}: {failed.read_text().splitlines()[0]}")
    if not (out / f"zero{stage}.json").exists():
        pytest.fail(f"ZeRO-{stage} on {plugin} did not run: {error}")
    got = _job.read_result(out, f"zero{stage}")
    assert got["backend"] == BACKENDS[plugin] and got["xccl_group"], f"the world was {got['backend']}"
    _job.compare(got, f"DeepSpeed ZeRO-{stage} on {plugin}")


@pytest.mark.parametrize("plugin", list(PLUGINS))
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_1_2(jobs: dict[str, tuple[Path, str]], plugin: str, stage: int) -> None:
    _stage(jobs, plugin, stage)


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_deepspeed_zero_3(jobs: dict[str, tuple[Path, str]], plugin: str) -> None:
    _stage(jobs, plugin, 3)
