"""Run a job script of this folder the way a user launches it: plainly (the framework's own launcher starts the
other ranks), or under ``torchrun``; in a clean environment naming only the vendor, with a hard timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The environment that selects each vendor: the cpu plugin, or xccl's CPU simulation of the vendor.
PLUGINS: dict[str, dict[str, str]] = {
    "cpu": {},
    "sophgo": {"XCCL_SIMULATE": "sophgo"},
    "ascend": {"XCCL_SIMULATE": "ascend"},
}
#: Variables of an enclosing launcher that must not leak into a job (it would think it was launched already).
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID", "XCCL_SIMULATE")


@dataclass(frozen=True)
class Run:
    """What a job did: its exit code, its output, and the folder where it wrote its results."""

    returncode: int
    output: str
    out: Path

    def first_error(self) -> str:
        """The job's first error line (``SomeError: message``), for a short failure message."""
        for line in self.output.splitlines():
            m = re.search(r"\b(\w+(?:Error|Exception|Collective|Failure|Timeout)): (.+)$", line)
            if m and "Traceback" not in line:
                return f"{m.group(1)}: {m.group(2)}"
        return f"exit code {self.returncode}"


def environment(plugin: str, out: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for a job on ``plugin``, writing its results to ``out``."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(PLUGINS[plugin])
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XCCL_FRAMEWORK_TEST_OUT"] = str(out)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run(script: str, args: Sequence[str], plugin: str, out: Path, *, nproc: int = 0, timeout: float = 300.0,
        env: Mapping[str, str] | None = None) -> Run:
    """Run ``script`` (a file of this folder) with ``args`` on ``plugin``; under torchrun when ``nproc`` > 0.

    A job that outlives ``timeout`` is killed with its process group, and reported as exit code -9.
    """
    out.mkdir(parents=True, exist_ok=True)
    cmd: list[str] = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += [str(HERE / script), *args]
    kw: dict[str, Any] = {"cwd": ROOT, "env": environment(plugin, out, env), "stdout": subprocess.PIPE,
                          "stderr": subprocess.STDOUT, "text": True, "start_new_session": True}
    with subprocess.Popen(cmd, **kw) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the job's own session: its launcher and every rank it started
            output, _ = proc.communicate()
            return Run(-9, f"{output}\n[killed after {timeout:.0f} s]", out)
    return Run(proc.returncode, output, out)
