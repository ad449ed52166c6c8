"""Every code block in docs/ runs, as a new user would run it.

Fenced blocks tagged ``python`` run as a script (with ``torchrun --standalone`` when the block is preceded by a
directive asking for ranks); blocks tagged ``sh`` run line by line in bash from the repository root. A directive is
an HTML comment on the line(s) before the block:

    <!-- xccl-doc: ranks=2 env=XCCL_SIMULATE=sophgo -->
    <!-- xccl-doc: no-run (installs packages) -->

``no-run`` must give its reason; only installation commands may use it. Blocks of other languages (json, text,
console output) are not code. Blocks marked ``expect=TEXT`` must print TEXT.

Tiers: the blocks that start several processes run in ``make test-more`` (marked ``slow``): ranks under torchrun
(5-30 s each: a launcher and a torch import per rank, some compile a graph) and shell blocks (each ``xccl`` or
``python`` line a fresh interpreter importing torch, 2-9 s a block). The quickstart's, the first steps a new user
runs, and the single-process Python blocks (1-5 s) run in ``make test``. Each block moved shows a behaviour that a
first-tier test checks (collectives, stacks, simulations, graph mode, the CLI); what the second tier adds is that
the page's code, as printed, still runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^```(\w+)?\s*$")
DIRECTIVE = re.compile(r"<!--\s*xccl-doc:\s*(.*?)\s*-->")


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    code: str
    ranks: int = 1
    env: dict[str, str] = field(default_factory=dict)
    no_run: str = ""
    expect: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT / 'docs')}:{self.line}"

    @property
    def second_tier(self) -> bool:
        """Whether ``make test-more`` runs this block rather than ``make test`` (see the module docstring)."""
        return (self.ranks > 1 or self.lang != "python") and self.path.name != "quickstart.md"


def _blocks(path: Path) -> list[Block]:
    out: list[Block] = []
    lines = path.read_text().splitlines()
    pending: dict[str, object] = {}
    i = 0
    while i < len(lines):
        m = DIRECTIVE.search(lines[i])
        if m:
            for tok in shlex.split(m.group(1)):
                if tok.startswith("ranks="):
                    pending["ranks"] = int(tok.split("=", 1)[1])
                elif tok.startswith("env="):
                    k, v = tok.split("=", 1)[1].split("=", 1)
                    pending.setdefault("env", {})[k] = v  # type: ignore[union-attr]
                elif tok.startswith("expect="):
                    pending.setdefault("expect", []).append(tok.split("=", 1)[1])  # type: ignore[union-attr]
                elif tok == "no-run":
                    pending["no_run"] = m.group(1).split("no-run", 1)[1].strip() or "?"
            i += 1
            continue
        m = FENCE.match(lines[i])
        if m and m.group(1):
            lang, start, body = m.group(1), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if lang in ("python", "sh", "bash"):
                out.append(Block(path, start, lang, "\n".join(body) + "\n", **pending))  # type: ignore[arg-type]
            pending = {}
        elif lines[i].strip() and not lines[i].lstrip().startswith("<!--"):
            pending = {}  # a directive applies only to the block right after it
        i += 1
    return out


BLOCKS = [b for p in DOCS for b in _blocks(p)]


def _env(block: Block) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(block.env)
    return env


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.second_tier else []) for b in BLOCKS]
)
def test_doc_block_runs(block: Block, tmp_path: Path) -> None:
    if block.no_run:
        assert "install" in block.code, f"{block.id}: only installation commands may be no-run ({block.no_run})"
        return
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
        if block.ranks > 1:
            # Each rank's stdout to a file of its own: torchrun runs its ranks unbuffered (``python -u``), so on one
            # shared pipe two ranks' prints interleave mid-line ("hh  (16, 16)(16, 16)  yy ...").
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={block.ranks}",
                   "--log-dir", str(tmp_path / "logs"), "--redirects", "1", str(script)]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(block), capture_output=True, text=True, timeout=300)
    # The ranks' own output, rank by rank (``<log dir>/<run>/attempt_0/<local rank>/stdout.log``), after torchrun's.
    stdout = out.stdout + "".join(f.read_text() for f in sorted((tmp_path / "logs").rglob("stdout.log")))
    assert out.returncode == 0, f"{block.id} failed:\n{block.code}\n--- stdout\n{stdout}\n--- stderr\n{out.stderr}"
    for text in block.expect:
        assert text in stdout, f"{block.id}: expected {text!r} in output:\n{stdout}"


def test_docs_have_code_blocks() -> None:
    # Guards the parser: if it silently found nothing, every page would "pass".
    assert len(BLOCKS) >= 1
