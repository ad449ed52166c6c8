"""docs/fidelity.md, the fidelity ledger: generated from the vendor plugins' data, in sync, and a source for every
claim (regenerate with ``python scripts/gen_fidelity.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import xccl
from xccl import Collective, Mode

ROOT = Path(__file__).resolve().parents[1]
FIX = "regenerate it with `python scripts/gen_fidelity.py`"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_fidelity", ROOT / "scripts" / "gen_fidelity.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def parts(gen: ModuleType) -> list[tuple[xccl.PluginInfo, ModuleType]]:
    found = gen.participants(gen.documented(xccl.plugins(), gen.repo_distributions()))
    names = [i.name for i, _ in found]
    if not {"ascend", "sophgo"} <= set(names):
        pytest.skip(f"the vendor plugins are not both installed here (found {names})")
    return found


def test_fidelity_doc_is_in_sync(gen: ModuleType, parts: list[tuple[xccl.PluginInfo, ModuleType]]) -> None:
    text = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    problems = gen.stale(text, parts)
    assert not problems, f"docs/fidelity.md is stale ({'; '.join(problems)}): {FIX}"


def test_every_vendor_claim_has_a_source(gen: ModuleType, parts: list[tuple[xccl.PluginInfo, ModuleType]]) -> None:
    """Every Ascend and Sophgo table entry and claim names a source (graph entries may cite theirs in the note)."""
    missing = gen.unsourced(parts)
    assert not missing, "claims without a source: " + ", ".join(missing)


def test_ledger_covers_every_entry_and_constraint(gen: ModuleType, parts: list[tuple[xccl.PluginInfo, ModuleType]]) -> None:
    from xccl_ascend._constraints import RULES

    by_name = {i.name: gen.rows(i, m) for i, m in parts}
    for name in ("ascend", "sophgo"):
        entries, claims = by_name[name]
        assert len(entries) == len(Collective) * len(Mode)
        assert claims
    claims = {r.subject for r in by_name["ascend"][1]}
    assert {f"MC2 constraint: {r.name}" for r in RULES} <= claims
    assert {"hccl_config: hccl_job_id", "hccl_config: group_name", "prod over int16 / bfloat16"} <= claims
    assert {"chip map: ring", "chip map: SG2260 board"} <= {r.subject for r in by_name["sophgo"][1]}


def test_a_stale_or_unsourced_ledger_is_caught(gen: ModuleType, parts: list[tuple[xccl.PluginInfo, ModuleType]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = gen.render_document(parts)
    assert gen.stale(fresh, parts) == []
    assert gen.stale(fresh.replace("2, 4, 8, 16, 32", "2, 4, 8, 16"), parts)
    assert gen.stale("# hand-written\n", parts) == ["it lacks the generated header"]
    module = next(m for i, m in parts if i.name == "sophgo")
    sources = dict(module.ENTRY_SOURCES)
    sources.pop((Collective.ALL_TO_ALL, Mode.EAGER))
    monkeypatch.setattr(module, "ENTRY_SOURCES", sources)
    assert "sophgo: `all_to_all` eager" in gen.unsourced(parts)


def test_citations_in_notes_count_as_sources(gen: ModuleType) -> None:
    note = ("TorchAir converter (Ascend/torchair@fced884 python/torchair/ge_concrete_graph/hcom.py:12); seeds 000/001; "
            "manifest A4; see https://example.org/x")
    assert gen.citations(note) == ("Ascend/torchair@fced884 python/torchair/ge_concrete_graph/hcom.py:12",
                                   "seeds 000/001", "manifest A4", "https://example.org/x")
    assert gen.citations("verified in simulation only") == ()
    bracketed = "lowered to HcomSend [Ascend/torchair@fced884 python/torchair/x.py:51]; [seed 000 table 1]"
    assert gen.citations(bracketed) == ("Ascend/torchair@fced884 python/torchair/x.py:51", "seed 000")
