"""``xccl --help`` and every subcommand's ``--help`` import no torch: help is the first thing a new user runs, and
``import torch`` costs seconds (more on a node where torch_npu autoloads).

Two checks. The whole command (``python -X importtime -m xccl SUB --help``), which goes through ``xccl/__init__.py``
(it defers ``torch.distributed.ReduceOp`` like every other name); and the CLI's own part (building the parser and
printing every help) in an interpreter where the ``xccl`` package is a bare namespace, so that a regression in
``xccl/tools/cli`` shows on its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xccl.tools import cli
from xccl.tools.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
#: The ``xccl`` package directory the tests import.
PACKAGE = Path(cli.__file__).resolve().parents[2]
#: ``xccl --help``, then ``xccl SUB --help`` for every subcommand.
HELPS = [[], *([name] for name in COMMANDS)]
_IMPORT_LINE = re.compile(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s*(\S+)\s*$", re.M)


def _torch_modules(modules: list[str]) -> list[str]:
    return sorted({m for m in modules if m == "torch" or m.startswith("torch.")})


def _imported(importtime: str) -> list[str]:
    """The modules ``python -X importtime`` reported importing."""
    return _IMPORT_LINE.findall(importtime)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, check=False,
                          cwd=ROOT, timeout=300)


@pytest.mark.parametrize("argv", HELPS, ids=lambda argv: " ".join(argv) or "xccl")
def test_help_imports_no_torch(argv: list[str]) -> None:
    proc = _run("-m", "xccl", *argv, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: xccl")
    assert _torch_modules(_imported(proc.stderr)) == []


#: Imports each subcommand's module, then builds and prints every help, with ``xccl`` a bare package (its
#: ``__init__`` not run); prints, after each step, the torch modules imported so far.
_CLI_ONLY = """
import contextlib, importlib, io, json, sys, types

package = types.ModuleType("xccl")
package.__path__ = [sys.argv[1]]
sys.modules["xccl"] = package
found = {}
steps = json.loads(sys.argv[2])
for module in steps["modules"]:
    importlib.import_module(module)
    found["import " + module] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
from xccl.tools.cli import main

for argv in steps["helps"]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    assert out.getvalue().startswith("usage: xccl"), (argv, out.getvalue()[:200])
    found[" ".join(["xccl", *argv, "--help"])] = sorted(
        m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps(found))
"""


def test_the_cli_part_of_help_imports_no_torch() -> None:
    steps = {"modules": [f"xccl.tools.cli.{module}" for module in COMMANDS.values()], "helps": HELPS}
    proc = subprocess.run([sys.executable, "-c", _CLI_ONLY, str(PACKAGE), json.dumps(steps)],
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    assert len(found) == len(COMMANDS) + len(HELPS)
    # sys.modules only grows: the first step that imported torch is the culprit.
    culprit = next((f"{step} imported torch ({len(mods)} modules: {mods[:3]}...)" for step, mods in found.items()
                    if mods), "")
    assert culprit == ""
