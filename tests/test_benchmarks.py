"""Every script in benchmarks/ runs in its small mode (``--quick``): it must finish, print its table and write valid
JSON, so that none can break unseen (``benchmarks/fused.py`` once failed at import for months).

Each runs in a subprocess as a user runs it. The figures are not judged: a smoke run on a shared machine measures
nothing; only that the script still works. They are the second tier (marked ``slow``: ``make test-more`` runs them,
``make test`` does not): each starts its own interpreters and ranks, 5-20 s apiece, and none is the only test of a
behaviour of xccl. ``frameworks.py`` needs the ``frameworks`` extra (marker ``frameworks``, also ``make test-more``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

#: script -> (a line its table prints, the launcher: "python" or "torchrun"). Every script of benchmarks/ is here
#: (test_every_benchmark_is_covered checks).
CASES: dict[str, tuple[str, str]] = {
    "bench_vs_raw.py": (r"xccl/raw: median", "python"),
    "cost_model.py": (r"ratio = predicted / measured", "python"),
    "detector.py": (r"size\s+torch\s+xccl", "python"),
    "emulation.py": (r"ratios over 1 run", "python"),
    "flight_recorder.py": (r"1 element, sync[\s\S]*in a hot loop", "python"),
    "frameworks.py": (r"accelerate\s+\d", "python"),
    "fused.py": (r"mm_reduce_scatter\s+64x32x64", "python"),
    "graph.py": (r"compiled step", "torchrun"),
    "import_time.py": (r"import xccl \(after torch\)", "python"),
    "mixed.py": (r"64 KiB hierarchical", "python"),
    # Without a C++ compiler the prototype cannot be built: the script says why and exits 0.
    "native_lane.py": (r"lane, recorded\s+[\d.]+ us|native_lane.py: skipped: ", "python"),
    "overhead.py": (r"dist on xccl\s+[\d.]+ us", "python"),
    "preflight.py": (r"sophgo 16, fake", "python"),
    # Two namespaced hosts need root: without it the script says why and exits 0.
    "restart.py": (r"seconds after host 1 was killed|restart.py: skipped: ", "python"),
    "shrink.py": (r"cpu\s+5\s+[\d.]+\s+[\d.]+", "python"),
    "soak.py": (r"== kill: 2 ranks", "python"),
    "stacks.py": (r"ddp", "python"),
    "startup.py": (r"\| cpu \| 2 \|", "python"),
}
#: Scripts that need the ``frameworks`` extra (marker ``frameworks``).
FRAMEWORKS = {"frameworks.py"}


def test_every_benchmark_is_covered():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=pytest.mark.frameworks) if s in FRAMEWORKS else
               pytest.param(s, marks=pytest.mark.slow) for s in CASES]
)
def test_benchmark_runs_in_its_small_mode(script: str, tmp_path: Path) -> None:
    table, launcher = CASES[script]
    out = tmp_path / "out.json"
    args = [str(BENCH / script), "--quick", "--json", str(out)]
    if launcher == "torchrun":
        args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "XCCL_SIMULATE")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert re.search(table, proc.stdout), f"{script} printed no table:\n{proc.stdout[-3000:]}"
    doc = json.loads(out.read_text())
    assert isinstance(doc, dict) and doc, f"{script} wrote an empty JSON document"
