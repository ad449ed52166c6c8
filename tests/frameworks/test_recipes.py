"""docs/stacks.md's (and docs/elastic.md's torchft) framework recipes are excerpts of the job scripts that
tests/frameworks runs.

A recipe is a ``text`` block after ``<!-- xccl-doc: recipe=PATH -->``: every non-blank line of it must be a line of
PATH (leading whitespace aside), so the page cannot drift from what the tests run. Cheap: not marked
``frameworks``, it runs with the default suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "docs" / "stacks.md", ROOT / "docs" / "elastic.md")
RECIPE = re.compile(r"<!--\s*xccl-doc:\s*recipe=(\S+)\s*-->\n```text\n(.*?)\n```", re.S)
RECIPES = [r for page in PAGES for r in RECIPE.findall(page.read_text())]


def test_every_framework_has_a_recipe() -> None:
    scripts = {Path(path).name for path, _ in RECIPES}
    assert scripts == {"job_lightning.py", "job_ray.py", "job_deepspeed.py", "job_accelerate.py",
                       "job_torchtitan.py", "job_torchft.py"}, scripts


@pytest.mark.parametrize(("path", "block"), RECIPES, ids=[Path(p).stem for p, _ in RECIPES])
def test_recipe_is_in_its_script(path: str, block: str) -> None:
    script = {line.strip() for line in (ROOT / path).read_text().splitlines()}
    missing = [line for line in block.splitlines() if line.strip() and line.strip() not in script]
    assert not missing, f"the docs' recipe for {path} has lines its script lacks: {missing}"
