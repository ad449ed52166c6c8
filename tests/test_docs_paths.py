"""Every repository path the docs cite exists: ``xccl/...``, ``plugins/...``, ``tests/...``, ``benchmarks/...``,
``scripts/...`` and ``examples/...`` in ``docs/**/*.md`` and ``README.md``, and every private module they name as
``xccl.pkg._module.name`` (with the name in it). A module moved or removed leaves such a path behind; nothing else
notices, and a reader following it finds nothing.

Reads files only (no torch): it runs in well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
#: A path of this repository: a top-level folder, then path characters (a glob's ``*`` included). Not preceded by
#: a path or word character (``python/torchair/...`` in a citation of another repository, ``a/b`` ratios of words),
#: by ``@`` or ``.``; a markdown link's ``../`` is skipped.
PATH: Final = re.compile(r"(?<![\w.@/*-])(?:\.\./)*((?:xccl|plugins|tests|benchmarks|scripts|examples)/[\w./*-]*)")
#: A dotted name in an xccl package with a private part (``xccl.fused._cost.choose_chunks``).
DOTTED: Final = re.compile(r"(?<![\w.])((?:xccl|xccl_ascend|xccl_sophgo|xccl_template)(?:\.\w+)+)")
#: Where each package's modules live.
PACKAGES: Final = {
    "xccl": ROOT,
    "xccl_ascend": ROOT / "plugins" / "ascend",
    "xccl_sophgo": ROOT / "plugins" / "sophgo",
    "xccl_template": ROOT / "examples" / "plugin-template",
}
#: Where the benchmarks write their JSON: ignored by git and never committed (docs/performance.md says so), so a
#: page names files there that exist only after a run.
OUTPUTS: Final = ("benchmarks/results/",)
#: Cited on pages this test's author could not edit, as (page, text). Each is either not a path of this repository
#: or a dead one reported for its page's owner; remove the entry with the fix.
ALLOWED: Final = {
    # docs/performance-history.md: "xccl/raw" is a ratio (xccl's time over raw torch.distributed's) in table headers.
    ("docs/performance-history.md", "xccl/raw"),
    # docs/performance-history.md: the flat layout of an old commit that `benchmarks/overhead.py --baseline` checks out into
    # a worktree; it no longer exists here, by design.
    ("docs/performance-history.md", "xccl/_*.py"),
    # docs/multinode.md: "xccl/world/<restart count>.<n>/" is a key prefix in the rendezvous store, not a path.
    ("docs/multinode.md", "xccl/world/"),
    # docs/plugin-guide.md: a file of the distribution `xccl new-plugin acme` generates, not of this repository.
    ("docs/plugin-guide.md", "tests/test_acme_conformance.py"),
    # docs/performance_fused.md: DEAD, for its owner: set_tuning moved to xccl.fused._cost (docs/fused.md is fixed).
    ("docs/performance_fused.md", "xccl.fused._api.set_tuning"),
}


def _cited(pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    """``(page, line, text)`` for every match of ``pattern`` on every page, trailing punctuation removed."""
    out = []
    for page in PAGES:
        rel = page.relative_to(ROOT).as_posix()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            out += [(rel, number, m.group(1).rstrip(".")) for m in pattern.finditer(line)]
    return out


def _exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def _module(parts: list[str]) -> Path | None:
    """The file of the module ``parts`` names, or None."""
    where = PACKAGES[parts[0]].joinpath(*parts)
    for candidate in (where.with_suffix(".py"), where / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(name: str) -> bool:
    """Whether ``pkg.mod._private.attr`` names an existing module and, after it, a name that module has."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module = _module(parts[:end])
        if module is not None:
            rest = parts[end:]
            return not rest or re.search(rf"\b{re.escape(rest[0])}\b", module.read_text(encoding="utf-8")) is not None
    return False


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split(".")[1:])


def test_pages_are_found() -> None:
    # Guards the scan: with no page, or no citation found, every path would "exist".
    assert ROOT / "docs" / "README.md" in PAGES and len(PAGES) > 10
    assert len(_cited(PATH)) > 50 and len([n for *_, n in _cited(DOTTED) if _private(n)]) > 10


def test_cited_paths_exist() -> None:
    dead = [f"{page}:{line}: {path}" for page, line, path in _cited(PATH)
            if not _exists(path) and not path.startswith(OUTPUTS) and (page, path) not in ALLOWED]
    assert dead == [], "paths cited in the docs that do not exist:\n" + "\n".join(dead)


def test_cited_private_modules_exist() -> None:
    dead = [f"{page}:{line}: {name}" for page, line, name in _cited(DOTTED)
            if _private(name) and not _resolves(name) and (page, name) not in ALLOWED]
    assert dead == [], "modules or names cited in the docs that do not exist:\n" + "\n".join(dead)


@pytest.mark.parametrize(("page", "text"), sorted(ALLOWED), ids=[f"{p}:{t}" for p, t in sorted(ALLOWED)])
def test_allowed_entries_are_still_cited(page: str, text: str) -> None:
    # An entry whose page no longer says it is stale: remove it, so the list stays the list of open cases.
    assert text in (ROOT / page).read_text(encoding="utf-8")
