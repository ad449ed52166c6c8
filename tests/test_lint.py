"""The package type-checks under mypy --strict and the tree is ruff-clean (pyproject.toml holds both configs).

Both tools are pinned in the ``test`` extra, so a new release's rules change nothing until the pin moves. ``make
lint`` runs the same commands by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What ruff checks: the package, the vendor plugins, the template, the tests, benchmarks and scripts.
RUFF_PATHS = ["xccl", "xccl_cli.py", "plugins", "examples", "tests", "benchmarks", "scripts"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_package_type_checks_strictly() -> None:
    done = _run("mypy", "xccl")
    assert done.returncode == 0, done.stdout + done.stderr


def test_tree_is_ruff_clean() -> None:
    done = _run("ruff", "check", *RUFF_PATHS)
    assert done.returncode == 0, done.stdout + done.stderr
