"""The Ascend examples run as users run them: ``torchrun`` over two simulated ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def torchrun(script: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCCL_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env["XCCL_SIMULATE"] = "ascend"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(REPO / script)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_mm_reduce_scatter_example() -> None:
    proc = torchrun("examples/ascend_mm_reduce_scatter.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2 on ascend (simulated hccl): mm_reduce_scatter (64, 64) torch.float16 matches" in proc.stdout
    assert "ConstraintFallbackWarning" not in proc.stderr  # the simulated MC2 kernel ran, not the fallback


@pytest.mark.slow  # torch.compile on CPU takes ~20 s here
def test_all_reduce_single_group_example() -> None:
    proc = torchrun("examples/ascend_all_reduce_single_group.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("compiled all_reduce gives [[4, 4], [4, 4]]") == 2
