"""``xccl preflight``: an unmodified script run as every rank of a world on a vendor's simulation, reported by call
site.

Each preflight spawns its ranks (seconds each: every rank imports torch), so one run per scenario serves several
assertions through module-scoped fixtures: FSDP2 on simulated Sophgo (2 ranks; the Python API, priced with a
cost model given here), and a gather on simulated Ascend with emulation forbidden (the CLI, with ``--json``); the
same two at 64 and 16 ranks as fake worlds (two processes each: the first and the last rank).
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from xccl.errors import InvalidArgument
from xccl.ops._vocab import Collective
from xccl.plugin._cost import CostModel, LinkCost
from xccl.tools import Report, preflight
from xccl.tools._cost_model import predict
from xccl.tools._preflight import derived_nodes, devices_per_node
from xccl.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
FSDP2 = "examples/fsdp2_train.py"
GATHER = "tests/data/preflight/gather_to_root.py"
RECV_ANY = "tests/data/preflight/recv_any_source.py"
NPU_GATHER = "tests/data/preflight/npu_gather.py"
#: A model with figures for what FSDP2 on Sophgo issues (all_gather natively, reduce_scatter as all_to_all_single):
#: made up for the test, which checks the arithmetic, not the figures.
MODEL = CostModel("test part", intra={
    Collective.ALL_GATHER_INTO_TENSOR: LinkCost(10.0, 20.0, "test"),
    Collective.ALL_TO_ALL_SINGLE: LinkCost(15.0, 10.0, "test"),
})


def _line(path: str, text: str) -> int:
    """The line of ``path`` holding ``text`` (so that the test follows the script's edits)."""
    lines = (ROOT / path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.fixture(scope="module")
def fsdp2() -> Report:
    return preflight("sophgo", 2, ["python", FSDP2, "--steps", "2"], cwd=str(ROOT), timeout=120, cost_model=MODEL)


@pytest.fixture(scope="module")
def fsdp2_fake() -> tuple[Report, list[str]]:
    """FSDP2 on Sophgo at 64 ranks on 8 nodes (8 TPUs each), as a fake world: ranks 0 and 63 only. The launcher's
    rendezvous port is one this test listens on: a rank that tried to reach its peers (TCPStore, gloo's pairs
    through it) would connect there."""
    import socket

    with socket.socket() as listener, pytest.MonkeyPatch.context() as mp:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        mp.setattr("xccl.tools._preflight_launch.free_port", lambda: listener.getsockname()[1])
        report = preflight("sophgo", 64, ["python", FSDP2, "--steps", "1"], nodes=8, cwd=str(ROOT), timeout=120,
                           cost_model=MODEL)
        connections = []
        while True:
            try:
                conn, peer = listener.accept()
            except BlockingIOError:
                break
            conn.close()
            connections.append(str(peer))
    return report, connections


@pytest.fixture(scope="module")
def gather_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("preflight") / "report.json"
    cwd = os.getcwd()
    os.chdir(ROOT)  # call sites are reported relative to the working directory
    try:
        code = main(["preflight", "--vendor", "ascend", "--world", "2", "--timeout", "120", "--json", str(out),
                     "--html", str(out.with_suffix(".html")), "--", "python", GATHER])
    finally:
        os.chdir(cwd)
    return code, json.loads(out.read_text()), str(out)


def test_fsdp2_on_sophgo_reduce_scatter_is_emulated_and_all_gather_native_at_the_call_sites(fsdp2: Report) -> None:
    assert fsdp2.ok, fsdp2.table()
    forward = f"{FSDP2}:{_line(FSDP2, 'loss = model(x)')} main"
    backward = f"{FSDP2}:{_line(FSDP2, 'loss.backward()')} main"
    by_op: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {}
    for c in fsdp2.calls:
        by_op.setdefault(c.op, set()).add((c.site, c.status, c.via))
    # FSDP2 gathers the parameters in forward, again in backward (resharded after forward), and reduce-scatters
    # the gradients in backward; SCCL has no ReduceScatter: all_to_all_single + local reduction (caps note [7]).
    assert by_op["all_gather_into_tensor"] == {(forward, "native", ()), (backward, "native", ())}
    assert by_op["reduce_scatter_tensor"] == {(backward, "emulated", ("all_to_all_single",))}
    for c in fsdp2.calls:
        if c.op != "barrier":
            assert (c.calls, c.ranks, c.group_size, c.dtype, c.intra_node) == (2, 2, 2, "Float", True), c
        if c.op == "reduce_scatter_tensor":
            assert c.extra_bytes == 0  # the all_to_all moves the bytes of a ring reduce_scatter


def test_fsdp2_prediction_prices_an_emulated_call_as_its_parts(fsdp2: Report) -> None:
    for c in fsdp2.calls:
        op = Collective.ALL_TO_ALL_SINGLE if c.op == "reduce_scatter_tensor" else Collective(c.op)
        expected = predict(MODEL, op, c.nbytes, 2, intra_node=True).seconds
        assert c.seconds == pytest.approx(expected) if expected is not None else c.seconds is None, c
        assert c.total == (None if c.seconds is None else pytest.approx(c.seconds * c.calls))
    assert fsdp2.total_seconds is None  # the barrier has no figure in this model: unknown, not zero
    priced = [c.total for c in fsdp2.calls if c.total is not None]
    assert priced == sorted(priced, reverse=True) and len(priced) == len(fsdp2.calls) - 1
    table = fsdp2.table()
    assert "emulated: all_to_all_single" in table and "unknown" in table and "runs on sophgo" in table


def test_gather_on_ascend_without_emulation_is_unsupported_with_the_typed_error(
        gather_cli: tuple[int, dict[str, Any], str]) -> None:
    code, report, _ = gather_cli
    assert code == 1 and report["exit_code"] == 1 and not report["ok"]
    [failure] = report["failures"]
    assert failure["error"] == "UnsupportedCollective" and failure["module"] == "xccl.errors"
    assert failure["op"] == "gather" and failure["ranks"] == [0, 1] and failure["kind"] == "unsupported"
    assert failure["site"] == f"{GATHER}:{_line(GATHER, 'xccl.gather(')} collect"
    assert "fallback='warn' or 'emulate'" in failure["message"]  # the fix, as the real run's error says it
    # What ran before it is still reported.
    [call] = report["calls"]
    assert (call["op"], call["status"], call["site"]) == ("all_reduce", "native", f"{GATHER}:17 <module>")


def test_a_call_through_torch_npus_replacement_is_reported_at_the_users_line() -> None:
    """``dist.gather`` on Ascend is torch_npu's ``_gather`` (simulated: ``xccl_ascend._torch_npu_sim``), which
    broadcasts the root's sizes through xccl's group: its call site is the script's ``dist.gather`` line, not the
    adaptor's (``AscendPlugin.adaptor_modules``)."""
    report = preflight("ascend", 2, [NPU_GATHER], cwd=str(ROOT), timeout=120, cost_model=None)
    assert report.ok, report.table()
    sites = {(c.op, c.site) for c in report.calls}
    assert ("broadcast", f"{NPU_GATHER}:{_line(NPU_GATHER, 'dist.gather(')} <module>") in sites, sites
    assert not any("xccl_ascend" in site or "torch_npu" in site for _, site in sites), sites


def test_fsdp2_at_64_ranks_as_a_fake_world_plays_ranks_0_and_63_with_the_vendors_table(
        fsdp2_fake: tuple[Report, list[str]]) -> None:
    report, connections = fsdp2_fake
    assert report.ok, report.table()
    assert (report.mode, report.ranks_run, report.world, report.nodes) == ("fake", (0, 63), 64, 8)
    forward = f"{FSDP2}:{_line(FSDP2, 'loss = model(x)')} main"
    backward = f"{FSDP2}:{_line(FSDP2, 'loss.backward()')} main"
    by_op: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {}
    for c in report.calls:
        by_op.setdefault(c.op, set()).add((c.site, c.status, c.via))
        # The world's group at its full size, spanning the 8 nodes; both played ranks made every call.
        assert (c.group_size, c.intra_node, c.ranks) == (64, False, 2), c
    assert by_op["all_gather_into_tensor"] == {(forward, "native", ()), (backward, "native", ())}
    assert by_op["reduce_scatter_tensor"] == {(backward, "emulated", ("all_to_all_single",))}
    table = report.table()
    assert "mode fake (ranks run: 0, 63)" in table and "garbage values" in table
    # Nothing reached the rendezvous address the ranks were given: no store, no peer connection.
    assert connections == []


@pytest.mark.slow
def test_a_fake_world_reports_what_the_real_world_of_the_same_size_does() -> None:
    """The fake world's faithfulness, where both can run: FSDP2 on Sophgo at 4 ranks on 2 nodes, every rank a
    process, and ranks 0 and 3 played alone, report the same call sites, ops, groups, sizes, counts and
    emulations."""
    def rows(report: Report) -> list[tuple[Any, ...]]:
        assert report.ok, report.table()
        return sorted((c.site, c.op, c.group, c.group_size, c.intra_node, c.dtype, c.nbytes, c.calls, c.status,
                       c.via, c.extra_bytes) for c in report.calls)

    argv = [FSDP2, "--steps", "1"]
    real = preflight("sophgo", 4, argv, nodes=2, cwd=str(ROOT), timeout=120, cost_model=None, mode="real")
    fake = preflight("sophgo", 4, argv, nodes=2, cwd=str(ROOT), timeout=120, cost_model=None, ranks=[0, 3])
    assert (real.mode, fake.mode, fake.ranks_run) == ("real", "fake", (0, 3))
    assert rows(fake) == rows(real)


@pytest.fixture(scope="module")
def gather_fake_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("preflight") / "report.json"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(["preflight", "--vendor", "ascend", "--world", "16", "--nodes", "2", "--timeout", "120",
                     "--json", str(out), "--", "python", GATHER])
    finally:
        os.chdir(cwd)
    return code, json.loads(out.read_text())


def test_gather_on_ascend_at_16_ranks_as_a_fake_world_is_unsupported_with_the_typed_error(
        gather_fake_cli: tuple[int, dict[str, Any]]) -> None:
    code, report = gather_fake_cli
    assert code == 1 and report["exit_code"] == 1 and (report["mode"], report["ranks_run"]) == ("fake", [0, 15])
    [failure] = report["failures"]
    assert (failure["error"], failure["module"], failure["op"], failure["kind"]) == (
        "UnsupportedCollective", "xccl.errors", "gather", "unsupported")
    assert failure["ranks"] == [0, 15] and failure["site"] == f"{GATHER}:{_line(GATHER, 'xccl.gather(')} collect"
    assert "fallback='warn' or 'emulate'" in failure["message"]
    [call] = report["calls"]
    assert (call["op"], call["status"], call["group_size"], call["ranks"]) == ("all_reduce", "native", 16, 2)


def test_json_report_shape(gather_cli: tuple[int, dict[str, Any], str]) -> None:
    _, report, _ = gather_cli
    assert {"vendor", "world", "nodes", "mode", "ranks_run", "calls", "failures", "exits", "cost_model", "notes",
            "groups", "settings", "ok", "seen", "exit_code", "total_seconds", "by_group"} <= set(report)
    assert report["by_group"] == {"default_pg": {"group_size": 2, "calls": 1, "bytes": 32, "seconds": None}}
    assert (report["vendor"], report["world"], report["nodes"], report["mode"]) == ("ascend", 2, 1, "real")
    assert set(report["calls"][0]) == {"site", "op", "group", "group_size", "mesh_dim", "intra_node", "dtype",
                                       "nbytes", "calls", "ranks", "status", "via", "extra_bytes", "seconds",
                                       "total", "why"}
    settings = {s["name"]: s for s in report["settings"]}
    assert {"watchdog", "communicators", "communicator memory"} <= set(settings)
    # One group (the world) per rank, each holding one HCCL communicator of 2 x HCCL_BUFFSIZE (400 MB by default).
    assert report["groups"] == 1 and "400 MB of device memory per rank" in settings["communicator memory"]["summary"]
    assert report["calls"][0]["why"].startswith("unknown")  # no cost model published yet: unknown, never a guess
    assert [e["rank"] for e in report["exits"]] == [0, 1] and all(e["returncode"] == 1 for e in report["exits"])


@pytest.mark.slow
def test_a_rank_left_waiting_is_stopped_and_the_failure_reported() -> None:
    """Rank 0 receives from any source, which HCCL cannot (caps: recv_any_source unsupported); rank 1's send is
    left waiting. The run ends long before its timeout (xccl's liveness check fails rank 1's send when rank 0's
    process is gone; else the launcher would stop it), and the report tells the cause from its consequence."""
    started = time.monotonic()
    report = preflight("ascend", 2, [RECV_ANY], cwd=str(ROOT), timeout=120, cost_model=None)
    assert time.monotonic() - started < 60
    assert report.exit_code == 1
    kinds = {f.kind: f for f in report.failures}
    assert set(kinds) == {"unsupported", "peer"}
    cause, consequence = kinds["unsupported"], kinds["peer"]
    assert (cause.error, cause.op, cause.ranks) == ("UnsupportedCollective", "recv_any_source", (0,))
    assert cause.site == f"{RECV_ANY}:{_line(RECV_ANY, 'dist.recv(')} <module>"
    assert (consequence.error, consequence.ranks) == ("PeerFailure", (1,))
    assert "another rank failed first" in report.table()


@pytest.mark.parametrize(("world", "nodes", "argv", "options", "needle"), [
    (4, 3, [FSDP2], {}, "does not divide"),
    (64, 1, [FSDP2], {"mode": "real"}, "more than 8"),
    (2, 1, ["python"], {}, "no script"),
    (0, 1, [FSDP2], {}, "at least one rank"),
    (64, 1, [FSDP2], {"ranks": [0, 64]}, "0..63"),
    (4, 1, [FSDP2], {"mode": "real", "ranks": [0]}, "runs them all"),
    (4, 1, [FSDP2], {"mode": "simulated"}, "expected 'real', 'fake' or 'auto'"),
], ids=["nodes", "too-large-for-real", "no-script", "empty-world", "rank-outside", "ranks-in-real", "mode"])
def test_bad_requests_are_refused_before_anything_runs(world: int, nodes: int, argv: list[str],
                                                       options: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        preflight("sophgo", world, argv, nodes=nodes, **options)


# ------------------------------------------------------------------------- nodes derived when --nodes is not given


@pytest.mark.parametrize(("world", "per_node", "nodes"), [
    (64, 8, 8), (8, 8, 1), (2, 8, 1), (12, 8, 2), (9, 8, 3), (64, None, 1),
], ids=["64-on-nodes-of-8", "one-full-node", "one-node", "2-nodes-of-6", "3-nodes-of-3", "no-device-count"])
def test_nodes_are_the_fewest_that_hold_the_world(world: int, per_node: int | None, nodes: int) -> None:
    assert derived_nodes(world, per_node) == nodes


def test_a_plugin_without_a_simulation_has_no_device_count_and_a_bad_request_is_refused_before_asking() -> None:
    assert devices_per_node("cpu") is None  # no simulation: nothing to ask, no child process
    with pytest.raises(InvalidArgument, match="at least one rank"):
        preflight("sophgo", 0, [FSDP2], nodes=None)


def test_without_nodes_64_sophgo_ranks_span_8_nodes_and_the_header_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``xccl preflight --vendor sophgo --world 64`` without ``--nodes``: 8 nodes of 8 TPUs (the simulation's), where
    every rank used to die of "64 ranks on this node but only 8 TPUs". The script only creates its world: a child
    asking the simulation for its TPUs, then ranks 0 and 63 of a fake world."""
    script = tmp_path / "init_only.py"
    script.write_text("import xccl\n\nxccl.init()\nxccl.shutdown()\n")
    code = main(["preflight", "--vendor", "sophgo", "--world", "64", "--timeout", "120", "--",
                 "python", str(script)])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        "xccl preflight: sophgo, world 64 on 8 node(s) (derived: 64 ranks / 8 TPUs per node), mode fake "
        "(ranks run: 0, 63)"), out
    assert "InitError" not in out and code == 0, out


# ------------------------------------------------------------------------------- one rank's runner, in-process


def test_rank_runner_runs_a_module_with_its_argv_and_records_what_it_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-- python -m module ARGS``: the module runs as ``__main__`` with ``sys.argv``, and the error it raises is
    written with the user's frame that raised it (not the runner's or runpy's)."""
    from xccl.tools._preflight_child import error_path
    from xccl.tools._preflight_child import main as run_rank

    (tmp_path / "pf_job.py").write_text(
        "import sys\nimport xccl\n\ndef step():\n    raise xccl.UnsupportedCollective('gather', 'ascend', 'no')\n\n"
        "if __name__ == '__main__':\n    assert sys.argv[1:] == ['--steps', '1'], sys.argv\n    step()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", ["runner"])
    monkeypatch.setenv("RANK", "3")
    assert run_rank([str(tmp_path), "--", "-m", "pf_job", "--steps", "1"]) == 1
    raised = json.loads(Path(error_path(str(tmp_path), 3)).read_text())
    assert (raised["type"], raised["module"], raised["op"]) == ("UnsupportedCollective", "xccl.errors", "gather")
    assert raised["site"] == {"filename": str(tmp_path / "pf_job.py"), "line": 5, "name": "step"}


def test_rank_runner_passes_the_scripts_own_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xccl.tools._preflight_child import main as run_rank

    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    monkeypatch.setattr("sys.argv", ["runner"])
    monkeypatch.setattr("sys.path", list(sys.path))  # the runner puts the script's folder first, as python does
    assert run_rank([str(tmp_path), "--", str(script), "0"]) == 0
    assert run_rank([str(tmp_path), "--", str(script), "7"]) == 7
    assert not list(tmp_path.glob("error_*.json"))  # exiting is not raising


def test_a_script_whose_world_xccl_never_saw_is_not_passed(tmp_path: Path) -> None:
    """A script that creates a plain gloo world runs, but nothing of it was recorded: "runs on V" would be a lie."""
    script = tmp_path / "plain_gloo.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "dist.destroy_process_group()\n")
    report = preflight("sophgo", 1, [str(script)], timeout=120, cost_model=None)
    assert [e.returncode for e in report.exits] == [0]
    assert (report.seen, report.ok, report.exit_code) == (False, False, 1)
    assert "NOTHING SEEN" in report.table()


def test_calibrate_prices_with_figures_fitted_to_a_measurement_file(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from xccl.plugin import Collective
    from xccl.tools.cli.preflight import _calibrated

    log = str(ROOT / "tests" / "data" / "cost" / "nccl_tests_all_reduce.txt")
    model = _calibrated("ascend", [log], [])
    fitted = model.intra[Collective.ALL_REDUCE]
    assert fitted.source == f"fitted: {log}" and fitted.latency_us is not None and fitted.busbw_gbps is not None
    assert model.generation.endswith(", calibrated")
    # The other link kind keeps the plugin's own figures (Ascend publishes none: unknown, with what was searched).
    assert model.inter[Collective.ALL_REDUCE].busbw_gbps is None
    # A file it cannot read stops the command before any rank starts, naming the file.
    bad = tmp_path / "bench.json"
    bad.write_text("{not json")
    code = main(["preflight", "--vendor", "ascend", "--world", "2", "--calibrate", str(bad), "--", "python", GATHER])
    assert code == 2 and str(bad) in capsys.readouterr().err


@pytest.mark.parametrize("value", ["64", "64/64", "-1/4", "a/b", "0/"])
def test_a_malformed_fake_world_variable_is_a_typed_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from xccl.plugin._fake_world import ENV, FakeWorld, choose

    try:
        monkeypatch.setenv(ENV, "63/64")
        assert choose().fake == FakeWorld(63, 64)  # xccl.init chooses the transport from the variable, once
        monkeypatch.setenv(ENV, value)
        with pytest.raises(InvalidArgument, match="RANK/N"):
            choose()
    finally:
        monkeypatch.delenv(ENV)
        assert choose().fake is None  # a real world again for this process's other tests


# ------------------------------------------------------------------------------- the HTML page and the PNG


class _Page(HTMLParser):
    """What a browser would show of the page: the text of its cells and of its SVG labels, and what it would load."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.svg_text: list[str] = []
        self.loads: list[str] = []
        self.scripts = 0
        self.text = ""
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._stack.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self.rows[-1].append("")
        self.scripts += tag == "script"
        self.loads += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_endtag(self, tag: str) -> None:
        while self._stack and self._stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._stack[-1:] == ["td"]:
            self.rows[-1][-1] += data
        elif self._stack[-1:] == ["text"]:
            self.svg_text.append(data)


def test_html_page_parses_and_holds_every_call_site_and_the_totals_the_json_has(fsdp2: Report) -> None:
    from xccl.tools._preflight_charts import seconds as _seconds

    page = _Page()
    text = fsdp2.html()
    page.feed(text)
    page.close()
    assert text.startswith("<!DOCTYPE html>") and page.scripts == 0 and page.loads == []  # self-contained
    data = fsdp2.to_json()
    sites = [r for r in page.rows if r]
    assert len(sites) >= len(data["calls"])
    for call in data["calls"]:  # every call site, with its op, count and predicted total
        assert [call["site"], call["op"], str(call["calls"]), _seconds(call["total"])] in (
            [r[0], r[1], r[7], r[11]] for r in sites), call
    # The charts: one bar per op and per group, labelled with the JSON's per-group time and bytes.
    assert data["total_seconds"] is None and "predicted communication per rank: unknown" in page.text
    for name, group in data["by_group"].items():
        assert f"{name}[{group['group_size']}]" in page.svg_text and _seconds(group["seconds"]) in page.svg_text
    for op in {c["op"] for c in data["calls"]}:
        assert op in page.svg_text
    assert "verdict: runs on sophgo" in page.text and "<svg" in text


def test_html_page_lists_the_unsupported_call_and_the_settings(tmp_path: Path,
                                                               gather_cli: tuple[int, dict[str, Any], str]) -> None:
    _, report, path = gather_cli
    page = _Page()
    text = Path(path).with_suffix(".html").read_text()
    page.feed(text)
    [failure] = report["failures"]
    assert ["unsupported", failure["site"], "UnsupportedCollective", "gather"] in (r[:4] for r in page.rows)
    assert {s["name"] for s in report["settings"]} <= {r[0] for r in page.rows if r}
    assert "verdict: WOULD FAIL on ascend" in page.text


def test_png_is_a_png_of_a_sane_size(fsdp2: Report, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.png"
    fsdp2.png(str(out))
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, 150 <= height <= 1200) == (1200, True), (width, height)
    assert 10_000 < out.stat().st_size < 1_000_000


def test_png_without_matplotlib_is_a_typed_error_before_the_script_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fsdp2: Report) -> None:
    """An environment without the ``plot`` extra: importing matplotlib fails (``sys.modules[name] = None`` is how
    Python spells a module that cannot be imported), so ``--png`` stops before any rank starts."""
    import xccl

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    code = main(["preflight", "--vendor", "sophgo", "--world", "1", "--png", str(tmp_path / "r.png"), "--",
                 "python", str(script)])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'xccl[plot]'" in err and "--png needs matplotlib" in err
    assert not marker.exists() and not (tmp_path / "r.png").exists()
    with pytest.raises(xccl.MissingExtra) as raised:
        fsdp2.png(str(tmp_path / "r.png"))
    assert (raised.value.package, raised.value.extra, raised.value.fix) == ("matplotlib", "plot",
                                                                           "pip install 'xccl[plot]'")


# ---------------------------------------------------------------------------------------------- compiled regions

COMPILED = "tests/data/preflight/compiled_regions.py"
TP_FSDP2 = "examples/tp_fsdp2_train.py"


@pytest.fixture(scope="module")
def compiled() -> Report:
    """Three compiled regions on simulated Ascend: a dist.broadcast that breaks its graph, a region TorchAir
    converts, and one it does not (the script dies of it there, as on the hardware). Rank 0 of a fake world of 2,
    one process (compiling is the cost: a real world of 2 takes about four times as long on 2 shared cores)."""
    return preflight("ascend", 2, ["python", COMPILED], cwd=str(ROOT), timeout=180, cost_model=None, ranks=[0])


def _region(report: Report, name: str) -> Any:
    [region] = [r for r in report.compiled if r.region.endswith(f" {name}")]
    return region


def test_a_collective_that_breaks_the_graph_is_reported_at_the_users_line(compiled: Report) -> None:
    step = _region(compiled, "step")
    assert compiled.mode == "fake"
    assert step.region == f"{COMPILED}:{_line(COMPILED, '@torch.compile')} step"
    # Dynamo cannot trace dist.broadcast (torch 2.13): the step is two graphs, split at the broadcast's line. Before
    # XcclProcessGroup's methods ran outside Dynamo, the script died there of an InternalTorchDynamoError.
    assert step.graphs == 2
    [brk] = step.breaks
    assert brk.site == f"{COMPILED}:{_line(COMPILED, 'dist.broadcast(')} step"
    assert (brk.collective, brk.ranks, brk.count) == ("torch.distributed.broadcast", 1, 1)
    assert brk.reason.startswith("Attempted to call function marked as skipped")
    assert step.converts is None and step.compiler is None  # torch.compile(backend="aot_eager"): not TorchAir's
    # The broadcast itself ran (eagerly, between the two graphs) and is reported at the same line.
    assert any(c.op == "broadcast" and c.site == brk.site and c.calls == 2 for c in compiled.calls)
    assert {f.error for f in compiled.failures} == {"BackendCompilerFailed"}  # does_not_convert's, below
    table = compiled.table()
    assert f"torch.distributed.broadcast breaks the graph at {brk.site}" in table


def test_torchair_verdict_per_compiled_region_on_ascend(compiled: Report) -> None:
    ok, bad = _region(compiled, "converts"), _region(compiled, "does_not_convert")
    assert (ok.compiler, ok.converts, ok.graphs, ok.problems) == ("TorchAir (simulated)", True, 1, ())
    assert ok.collectives == ("_c10d_functional.all_reduce.default",)
    assert (bad.compiler, bad.converts, bad.graphs) == ("TorchAir (simulated)", False, 1)
    # Every node TorchAir cannot convert is listed (here one), with TorchAir's own error and its source line.
    [problem] = bad.problems
    assert "logcumsumexp" in problem and "ge_converter is not implemented" in problem and "torchair@" in problem
    # The compilation failed at the first call, as it would on the hardware.
    [failure] = compiled.failures
    assert (failure.ranks, failure.kind, failure.error, compiled.exit_code) == ((0,), "script", "BackendCompilerFailed", 1)
    assert "logcumsumexp" in failure.message
    table = compiled.table()
    assert "TorchAir (simulated): converts every node" in table and "DOES NOT CONVERT 1 node(s)" in table
    regions = compiled.to_json()["compiled"]
    assert [r["region"].split()[-1] for r in regions] == ["step", "converts", "does_not_convert"]
    # The HTML page has the same regions and verdicts.
    page = compiled.html()
    assert "<h2>Compiled regions</h2>" in page and "DOES NOT CONVERT 1 node(s)" in page
    assert all(html.escape(r["region"]) in page for r in regions)
    # The compiled all_reduce is the user's: its site is in the script, not the graph's generated code.
    assert {c.site.split(":")[0] for c in compiled.calls if c.op == "all_reduce"} == {COMPILED}, compiled.calls
    assert {"region", "graphs", "breaks", "compiler", "converts", "collectives", "problems"} == set(regions[0])


@pytest.mark.slow
def test_tp_fsdp2_on_ascend_at_16_ranks_per_mesh_dimension_and_torchair_verdict() -> None:
    """The issue's done-when: DTensor TP + FSDP2 on simulated Ascend, 16 ranks on 2 nodes (a fake world: ranks 0
    and 15): tp (8, inside a node) and dp (2, across the nodes) each get their row, and the compiled loss average
    TorchAir's verdict."""
    report = preflight("ascend", 16, [TP_FSDP2, "--steps", "1"], nodes=2, cwd=str(ROOT), timeout=180,
                       cost_model=None)
    assert report.ok, report.table()
    assert (report.mode, report.ranks_run) == ("fake", (0, 15))
    groups = report.by_group
    assert set(groups) == {"dim tp", "dim dp"}
    assert (groups["dim tp"]["group_size"], groups["dim dp"]["group_size"]) == (8, 2)
    ops = {(c.mesh_dim, c.op, c.intra_node) for c in report.calls}
    # TP's all_reduce (RowwiseParallel) inside a node; FSDP2's all_gather and reduce_scatter across the nodes;
    # the compiled loss average's all_reduce on dp.
    assert {("tp", "all_reduce", True), ("dp", "all_gather_into_tensor", False),
            ("dp", "reduce_scatter_tensor", False), ("dp", "all_reduce", False)} <= ops
    [region] = report.compiled
    assert region.region == f"{TP_FSDP2}:{_line(TP_FSDP2, '@xccl.compile')} mean_loss"
    assert (region.compiler, region.converts, region.breaks) == ("TorchAir (simulated)", True, ())
    assert "per group: dim tp[8]" in report.table()


def test_compiled_regions_from_a_ranks_record_in_process(tmp_path: Path) -> None:
    """The report's reading of Dynamo's logs, without a run: a break below two user frames belongs to the compiled
    function (not its caller), a repeat Dynamo logs without its traceback counts to the same site, a resume
    function's graphs to the region it resumes, and frames Dynamo compiled inside torch are not regions."""
    import torch

    from xccl.tools._preflight_compiled import regions

    c10d = os.path.join(os.path.dirname(str(torch.__file__)), "distributed", "distributed_c10d.py")
    wrapper = os.path.join(os.path.dirname(str(torch.__file__)), "distributed", "c10d_logger.py")
    script = str(tmp_path / "train.py")
    full = (f"Graph break in user code at {c10d}:3133\nGraph Break Reason: Encountered graph break when attempting "
            "to trace CALL: a function call, e.g. f(x, y):\n\nAttempted to call function marked as skipped\n  "
            "Explanation: Dynamo does not know how to trace it. More words.\n  Hint: ignore me\n\nUser code "
            f'traceback:\n  File "{script}", line 30, in main\n    step(x)\n  File "{script}", line 12, in step\n'
            f'    dist.broadcast(y, src=0)\n  File "{wrapper}", line 83, in wrapper\n    return func()\n'
            f'  File "{c10d}", line 3133, in broadcast\n    opts = BroadcastOptions()\n')
    repeat = (f"Graph break (user stack suppressed due to duplicate graph break) in user code at {c10d}:3133\n"
              "Graph Break Reason: Attempted to call function marked as skipped")
    record = {"breaks": [{"text": full}, {"text": repeat}], "checks": [], "frames": [
        {"compile_id": "0/0", "co_name": "step", "co_filename": script, "co_firstlineno": 9, "graph_op_count": 1},
        {"compile_id": "1/0", "co_name": "broadcast", "co_filename": c10d, "co_firstlineno": 3100,
         "graph_op_count": 0},
        {"compile_id": "2/0", "co_name": "torch_dynamo_resume_in_step_at_12", "co_filename": script,
         "co_firstlineno": 12, "graph_op_count": 2},
    ]}
    [region] = regions({0: record}, str(tmp_path))
    assert (region.region, region.graphs, region.converts) == ("train.py:9 step", 2, None)
    [brk] = region.breaks
    assert (brk.site, brk.collective, brk.count, brk.ranks) == ("train.py:12 step", "torch.distributed.broadcast",
                                                                 2, 1)
    assert brk.reason == "Attempted to call function marked as skipped: Dynamo does not know how to trace it"


def test_one_failure_row_for_ranks_whose_messages_differ_only_by_object_addresses(tmp_path: Path) -> None:
    # BackendCompilerFailed names its compiler function with its address, which differs by process: still one
    # failure, raised by both ranks (it was one row per rank).
    from xccl.tools._preflight_child import error_path
    from xccl.tools._preflight_report import _failures

    for rank, address in ((0, "0x7f3a1c2b9d30"), (1, "0x7f81e0a4c1f0")):
        Path(error_path(str(tmp_path), rank)).write_text(json.dumps({
            "type": "BackendCompilerFailed", "module": "torch._dynamo.exc", "op": "", "fix": "",
            "message": f"backend='<function compile at {address}>' raised: NotImplementedError", "site": None}))
    [failure] = _failures(str(tmp_path), [0, 1], str(tmp_path))
    assert failure.ranks == (0, 1) and "0x…" in failure.message
