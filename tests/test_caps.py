"""``xccl caps`` and the generated capability docs, checked against the capability tables themselves."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

import xccl
from xccl import Collective, Level, Mode, Support
from xccl.plugin._capabilities import table_from
from xccl.tools._render import ASCII_DASH, DASH, cell, footnote, render_markdown, render_text
from xccl.tools.cli import main
from xccl.tools.cli.caps import shown_by_default

ROOT = Path(__file__).resolve().parent.parent


def _loaded(name: str) -> bool:
    return any(i.name == name and i.plugin is not None for i in xccl.plugins())


@pytest.fixture(scope="module")
def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def caps(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["caps", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------------- json


def test_json_equals_to_dict(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = caps(capsys, "cpu", "cuda", "--json")
    data = json.loads(out)
    assert rc == 0
    assert list(data["plugins"]) == ["cpu", "cuda"]
    for name, backend in (("cpu", "gloo"), ("cuda", "nccl")):
        entry = data["plugins"][name]
        assert entry["collectives"] == xccl.capabilities(name).to_dict()
        assert entry["backend"] == backend
        assert entry["notes"] == list(xccl.capabilities(name).notes)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_json_mode_filter(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    rc, out, _ = caps(capsys, "cpu", "--json", "--mode", mode)
    full = xccl.capabilities("cpu").to_dict()
    got = json.loads(out)["plugins"]["cpu"]["collectives"]
    assert rc == 0
    assert got == {op: {mode: per_mode[mode]} for op, per_mode in full.items()}  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------------- text


def _text_rows(out: str) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] in {c.value for c in Collective}:
            rows[cells[0]] = cells[1:]
    return rows


def _footnotes(out: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+\[(\d+)\] (.*)$", out, re.M))


@pytest.mark.parametrize("plugins", [["cpu"], ["cpu", "cuda"], ["cpu", "gloo-emulated"]], ids="+".join)
def test_text_matrix_matches_tables(capsys: pytest.CaptureFixture[str], plugins: list[str]) -> None:
    if not all(map(_loaded, plugins)):
        pytest.skip("the test plugin distribution tests/plugins/xccl-testplugins is not installed")
    rc, out, _ = caps(capsys, *plugins)
    rows, notes = _text_rows(out), _footnotes(out)
    assert rc == 0
    assert set(rows) == {c.value for c in Collective}, "every collective has a row"
    for op in Collective:
        cells = iter(rows[op.value])
        for name in plugins:
            for mode in Mode:
                sup = xccl.capabilities(name).entry(op, mode)
                got = next(cells)
                text, _, number = got.partition(" [")
                assert text == cell(sup), (op, name, mode, got)
                assert notes.get(number.rstrip("]"), "") == footnote(op, sup, mode), (op, name, mode)


def _toy_table() -> xccl.CapabilityTable:
    """A table with one of each kind of cell, independent of how the built-in tables evolve."""
    return table_from(
        "toy",
        {
            Collective.ALL_REDUCE: Support(Level.NATIVE, min_torch=(2, 6), note="fast"),
            Collective.REDUCE_SCATTER_TENSOR: Support(Level.EMULATED, via="all_to_all"),
            Collective.BROADCAST: Support(Level.NATIVE, world_sizes=frozenset({2, 4})),
        },
        {Collective.ALL_REDUCE: Support(Level.NATIVE)},
        notes=["a table-wide remark"],
    )


def test_text_cells_and_footnotes() -> None:
    text = render_text({"toy": _toy_table()})
    rows, notes = _text_rows(text), _footnotes(text)
    assert rows["all_reduce"] == ["native [1]", "native"]
    assert notes["1"] == "torch >= 2.6; fast"
    assert rows["reduce_scatter_tensor"] == ["emul(all_to_all) [2]", DASH]
    assert notes["2"].startswith("cost: all_to_all_single + local reduction")
    assert rows["broadcast"] == ["native [3]", DASH]
    assert notes["3"] == "world sizes 2, 4 only"
    assert rows["gather"] == [DASH, DASH]
    assert "  toy: a table-wide remark" in text.splitlines()


def test_vendor_sdk_floor_refuses_below_it_and_renders() -> None:
    """``Support.min_sdk`` holds against the installed versions the runtime names; an unknown version passes."""
    floor = Support(Level.NATIVE, min_torch=(2, 3, 1), min_sdk=("CANN", "8.6.0"))
    table = table_from("toy", {Collective.SEND: Support(Level.NATIVE)}, {Collective.SEND: floor})
    level = lambda **kw: table.resolve(Collective.SEND, mode=Mode.GRAPH, **kw).level  # noqa: E731
    assert level(sdk_versions={"CANN": "8.5.0"}) is Level.UNSUPPORTED
    assert "needs CANN >= 8.6.0, and CANN 8.5.0 is installed" in table.resolve(
        Collective.SEND, mode=Mode.GRAPH, sdk_versions={"CANN": "8.5.0"}).reason
    for version in ("8.6.0", "8.6", "9.0.0", "9.0.RC1"):
        assert level(sdk_versions={"CANN": version}) is Level.NATIVE, version
    assert level(sdk_versions={"CANN": "8.6.RC1"}) is Level.UNSUPPORTED  # a release candidate of 8.6 is below 8.6.0
    assert level(sdk_versions={}) is level(sdk_versions={"CANN": "unreadable"}) is level() is Level.NATIVE
    assert table.resolve(Collective.SEND, sdk_versions={"CANN": "1.0.0"}).level is Level.NATIVE  # eager: no floor
    assert footnote(Collective.SEND, floor) == "torch >= 2.3.1; CANN >= 8.6.0"
    assert table.to_dict()["send"]["graph"]["min_sdk"] == "CANN 8.6.0"  # type: ignore[index]


def test_vendor_versions_order_release_candidates_before_releases() -> None:
    from xccl.plugin._versions import version_key

    ordered = ["8.0.RC1", "8.0.RC2", "8.0.0", "8.1.RC1.alpha001", "8.1.RC1.beta1", "8.1.RC1", "8.1.0", "8.6.0", "9.0.0"]
    assert sorted(ordered, key=version_key) == ordered  # type: ignore[arg-type]
    assert version_key("garbage") is None and version_key("") is None and version_key("8.x-1") is None


def test_text_wraps_plugins_into_blocks() -> None:
    tables = {name: _toy_table() for name in ("one", "two", "three")}
    single = render_text(tables)
    wrapped = render_text(tables, width=80)
    blocks = [b for b in wrapped.split("\n\n") if b.startswith("collective")]
    assert len(blocks) > 1
    assert all(len(line) <= 80 for b in blocks for line in b.splitlines())
    # every plugin's two mode columns stay together, and every block has every collective
    heads = [b.splitlines()[0].split()[1:] for b in blocks]
    assert sorted(h for head in heads for h in head) == sorted(["one", "one", "two", "two", "three", "three"])
    assert all(set(_text_rows(b)) == {c.value for c in Collective} for b in blocks)
    # the notes are the same, wrapped or not
    assert _footnotes(wrapped) == _footnotes(single)


def test_text_ascii_fallback() -> None:
    text = render_text({"toy": _toy_table()}, ascii_only=True)
    assert DASH not in text
    assert _text_rows(text)["gather"] == [ASCII_DASH, ASCII_DASH]


def test_default_lists_every_loaded_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = caps(capsys, "--json")
    loaded = [i.name for i in xccl.plugins() if i.plugin is not None and i.status is not xccl.Status.INCOMPATIBLE]
    assert rc == 0
    assert list(json.loads(out)["plugins"]) == loaded
    assert {"cpu", "cuda"} <= set(loaded)


def _shown(out: str) -> set[str]:
    """The plugins heading the matrix's blocks."""
    return {name for line in out.splitlines() if line.startswith("collective") for name in line.split()[1:]}


def test_default_text_fits_120_columns_and_shows_xccls_and_the_vendors_plugins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, _ = caps(capsys)  # not a terminal: 120 columns
    assert rc == 0
    longest = max(out.splitlines(), key=len)
    assert len(longest) <= 120, longest
    real = {i.name for i in xccl.plugins() if i.plugin is not None and i.name in {"cpu", "cuda", "ascend", "sophgo"}}
    assert {"cpu", "cuda"} <= real and _shown(out) >= real
    assert not _shown(out) & {"gloo-emulated", "gloo-emulated-ar", "fake-accel-a", "fake-accel-b", "bad-kernel"}
    blocks = [b for b in out.split("\n\n") if b.startswith("collective")]
    assert all(set(_text_rows(b)) == {c.value for c in Collective} for b in blocks)


def test_all_shows_every_loaded_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = caps(capsys, "--all", "--mode", "eager")
    loaded = {i.name for i in xccl.plugins() if i.plugin is not None and i.status is not xccl.Status.INCOMPATIBLE}
    assert rc == 0 and _shown(out) == loaded
    assert max(map(len, out.splitlines())) <= 120


@pytest.mark.parametrize(("name", "target", "device_type", "shown"), [
    ("cpu", "xccl.backends.cpu:plugin", "cpu", True),
    ("cuda", "xccl.backends.cuda:plugin", "cuda", True),
    ("sophgo", "xccl_sophgo._plugin:plugin", "tpu", True),
    ("acme", "xccl_acme._plugin:plugin", "acme", True),
    ("gloo-emulated", "xccl_testplugins.plugins:gloo_emulated", "cpu", False),
    ("fake-accel-a", "xccl_testplugins.plugins:fake_accel_a", "cpu", False),
], ids=["cpu", "cuda", "vendor", "third-party-vendor", "test-double", "fake-accelerator"])
def test_default_view_shows_xccls_own_plugins_and_those_for_a_device(
    name: str, target: str, device_type: str, shown: bool
) -> None:
    plugin = type("Toy", (xccl.Plugin,), {"name": name, "device_type": device_type})()
    info = xccl.PluginInfo(name, xccl.Status.AVAILABLE, target=target, plugin=plugin)
    assert shown_by_default(info) is shown


# ------------------------------------------------------------------------------------------------------ errors


def test_unknown_plugin_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = caps(capsys, "no-such-plugin")
    known = [i.name for i in xccl.plugins()]
    assert rc == 2
    assert out == ""
    assert str(xccl.BackendNotFound("no-such-plugin", known)) in err


def test_plugin_that_fails_to_load_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    if not any(i.name == "broken-import" for i in xccl.plugins()):
        pytest.skip("the test plugin distribution tests/plugins/xccl-testplugins is not installed")
    rc, _, err = caps(capsys, "broken-import")
    assert rc == 2
    assert "broken-import" in err and "xccl_testplugins_missing_dependency" in err


# ---------------------------------------------------------------------------------------------------- markdown


def test_markdown_matrix_and_details(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = caps(capsys, "cpu", "--markdown")
    table = xccl.capabilities("cpu")
    assert rc == 0
    assert out.splitlines()[0] == "| collective | cpu eager | cpu graph |"
    for op in Collective:
        eager, graph = table.entry(op, Mode.EAGER), table.entry(op, Mode.GRAPH)
        assert f"| `{op.value}` | {cell(eager)} | {cell(graph)} |" in out
        # every eager entry has a detail row that starts with its op, mode and level
        assert f"| `{op.value}` | eager | {cell(eager)} |" in out
    assert "### cpu" in out


def test_markdown_detail_lists_dtypes_and_reduce_ops() -> None:
    # gloo-emulated withholds bool and avg: both must be visible in the detail row.
    if not _loaded("gloo-emulated"):
        pytest.skip("the test plugin distribution tests/plugins/xccl-testplugins is not installed")
    md = render_markdown(xccl.capabilities("gloo-emulated"), matrix=False)
    row = next(ln for ln in md.splitlines() if ln.startswith("| `all_reduce` | eager"))
    cols = [c.strip() for c in row.split("|")]
    assert cols[3] == Level.NATIVE.value
    assert cols[5] == "max, min, product, sum"
    assert cols[6] == "bool as uint8, float64 via all_gather"  # float64: moved, reduced by xccl (as SCCL's)


# -------------------------------------------------------------------------------------------------------- docs


def test_capabilities_doc_is_up_to_date(gen_docs: ModuleType) -> None:
    doc = ROOT / "docs" / "capabilities.md"
    infos = gen_docs.documented(xccl.plugins(), gen_docs.repo_distributions(ROOT))
    assert {"cpu", "cuda"} <= {i.name for i in infos}
    problems = gen_docs.stale(doc.read_text(), infos)
    assert not problems, f"docs/capabilities.md is stale ({'; '.join(problems)}): run python scripts/gen_docs.py"


def test_embedded_vendor_tables_are_up_to_date(gen_docs: ModuleType) -> None:
    infos = gen_docs.documented(xccl.plugins(), gen_docs.repo_distributions(ROOT))
    stale = [
        p for p in gen_docs.embedding_pages(ROOT) if gen_docs.refresh_embedded(p.read_text(), infos) != p.read_text()
    ]
    assert not stale, f"stale embedded tables in {stale}: run python scripts/gen_docs.py"


def test_staleness_is_detected(gen_docs: ModuleType) -> None:
    infos = {i.name: i for i in xccl.plugins()}
    cpu, cuda = infos["cpu"], infos["cuda"]
    both = gen_docs.render_document([cpu, cuda])
    assert gen_docs.stale(both, [cpu, cuda]) == []
    # A changed cell, a plugin missing from the doc, a hand-written doc: all stale.
    assert gen_docs.stale(both.replace("| `all_reduce` | native |", "| `all_reduce` | emul(x) |", 1), [cpu, cuda])
    assert any(
        "'cuda' is installed but not documented" in p
        for p in gen_docs.stale(gen_docs.render_document([cpu]), [cpu, cuda])
    )
    assert gen_docs.stale("# Capabilities\n", [cpu]) == ["it lacks the generated header"]


def test_documented_plugins_absent_here_are_left_alone(gen_docs: ModuleType) -> None:
    # A doc generated where more plugins were installed (CI installs the vendor plugins) is checked only for
    # the plugins present: here, a doc with cpu and cuda checked in an environment "with only cpu".
    infos = {i.name: i for i in xccl.plugins()}
    cpu, cuda = infos["cpu"], infos["cuda"]
    both = gen_docs.render_document([cpu, cuda])
    assert gen_docs.stale(both, [cpu]) == []
    cuda_section = gen_docs.section("cuda", cuda.plugin.capabilities(), gen_docs._tables([cuda])[1])
    assert gen_docs.stale(both.replace(cuda_section, cuda_section.replace("native", "emul(z)")), [cpu]) == []
    broken = both.replace("| `gather` | eager | native |", "| `gather` | eager | emul(z) |", 1)
    assert gen_docs.stale(broken, [cpu]) == ["section 'cpu' differs from the table"]
    broken = both.replace("| `gather` | native |", "| `gather` | emul(z) |", 1)
    assert gen_docs.stale(broken, [cpu]) == ["matrix column 'cpu eager' differs from the table"]


def test_embedded_table_is_refreshed(gen_docs: ModuleType) -> None:
    cpu = next(i for i in xccl.plugins() if i.name == "cpu")
    page = "# Vendor\n\n<!-- xccl-caps: cpu -->\nold\n<!-- /xccl-caps -->\n\n<!-- xccl-caps: absent -->\nkept\n<!-- /xccl-caps -->\n"
    new = gen_docs.refresh_embedded(page, [cpu])
    assert "old" not in new and "kept" in new
    assert render_markdown({"cpu": xccl.capabilities("cpu")}, heading="####", about=gen_docs._tables([cpu])[1]) in new
