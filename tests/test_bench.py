"""``xccl bench``: the accounting (sizes, nccl-tests' bus-bandwidth factors), the CLI's errors, and one real
two-rank run through the command line that exercises every op once, with the raw comparison and the plot."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import xccl
from xccl.tools import _bench
from xccl.tools._bench import BenchConfig, BenchError, busbw_factor, parse_size, sweep_sizes
from xccl.tools.cli import main

WORLD = 2


# -------------------------------------------------------------------------------------------------- accounting


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", 4), ("4B", 4), ("1K", 1024), ("64M", 64 << 20), ("64MiB", 64 << 20), ("1.5k", 1536), ("2G", 2 << 30)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-4", "4X", "four"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(BenchError, match="not a number of bytes"):
        parse_size(text)


def test_sweep_sizes() -> None:
    assert sweep_sizes(4, 64, 2) == [4, 8, 16, 32, 64]
    assert sweep_sizes(4, 100, 4) == [4, 16, 64]
    assert sweep_sizes(8, 8, 1) == [8]
    with pytest.raises(BenchError):
        sweep_sizes(64, 4, 2)
    with pytest.raises(BenchError):
        sweep_sizes(4, 64, 1)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_factors_follow_nccl_tests(n: int) -> None:
    assert busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in (
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "all_to_all_v",
        "gather",
        "scatter",
    ):
        assert busbw_factor(op, n) == pytest.approx((n - 1) / n), op
    for op in ("broadcast", "reduce", "sendrecv"):
        assert busbw_factor(op, n) == 1.0


def test_every_collective_is_benchmarked() -> None:
    # Every non-fused collective xccl dispatches has a bench op (send and recv together as "sendrecv").
    fused = {xccl.Collective.MM_REDUCE_SCATTER, xccl.Collective.ALL_GATHER_MM, xccl.Collective.MM_ALL_REDUCE}
    covered = {_bench._COLLECTIVE[op] for op in _bench.OPS} | {xccl.Collective.RECV}
    assert covered == set(xccl.Collective) - fused


# ------------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--op", "all_reduce,nope"], "unknown op(s) nope"),
        (["--dtype", "float8"], "unknown dtype 'float8'"),
        (["-b", "64", "-e", "4"], "sizes must satisfy"),
        (["--plugin", "no-such-plugin"], "no xccl plugin named 'no-such-plugin'"),
        (["--plugin", "cpu", "--simulate"], "has no CPU simulation"),
        (["--simulate"], "--simulate needs a plugin"),
        (["--gap-us", "-1"], "--gap-us -1.0: must be 0 (back to back)"),
        (["--gap-us", "500", "--batch", "4"], "--gap-us times calls one at a time"),
        (["--gap-busy"], "--gap-busy is what the gap does: pass --gap-us too"),
    ],
)
def test_bad_configuration_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_plot_without_matplotlib_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without the extra looks like
    assert main(["bench", "--plot", str(tmp_path / "x.png")]) == 1
    assert "pip install 'xccl[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------------------------------- a real run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One launch of two ranks through the CLI: every op, two sizes, two calls, with the raw comparison."""
    out = tmp_path_factory.mktemp("bench")
    argv = [
        sys.executable,
        "-m",
        "xccl",
        "bench",
        "--op",
        "all",
        "--plugin",
        "cpu",
        "-n",
        str(WORLD),
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--compare-raw",
        "--json",
        str(out / "bench.json"),
        "--no-progress",
    ]
    plot = importlib.util.find_spec("matplotlib") is not None
    if plot:
        argv += ["--plot", str(out / "bench.png")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "bench.json").read_text())
    return {"doc": doc, "stdout": proc.stdout, "plot": out / "bench.png" if plot else None}


def test_json_structure(run: dict[str, Any]) -> None:
    doc = run["doc"]
    assert (doc["plugin"], doc["backend"], doc["world_size"], doc["simulate"]) == ("cpu", "gloo", WORLD, False)
    assert [r["op"] for r in doc["results"]] == list(_bench.OPS)
    table = xccl.capabilities("cpu")
    for res in doc["results"]:
        assert res["error"] is None, res
        assert res["busbw_factor"] == pytest.approx(busbw_factor(res["op"], WORLD))
        coll = _bench._COLLECTIVE[res["op"]]
        assert res["level"] == table.entry(coll).level.value, res["op"]
        expected_rows = 1 if res["op"] in ("barrier", "monitored_barrier") else 2
        assert len(res["rows"]) == expected_rows, res["op"]


def test_sizes_follow_each_ops_layout(run: dict[str, Any]) -> None:
    by_op = {r["op"]: r for r in run["doc"]["results"]}
    # 8 and 64 bytes of float32: 2 and 16 elements; split evenly over two ranks for the chunked ops.
    assert [(r["size"], r["count"]) for r in by_op["all_reduce"]["rows"]] == [(8, 2), (64, 16)]
    assert [(r["size"], r["count"]) for r in by_op["reduce_scatter_tensor"]["rows"]] == [(8, 2), (64, 16)]
    # uneven: rank j holds unit*(j+1) rows, unit = count // 3
    assert [r["count"] for r in by_op["all_gather_into_tensor_uneven"]["rows"]] == [3, 15]
    assert by_op["barrier"]["rows"][0]["size"] == 0


def test_bandwidths_are_consistent_with_size_time_and_factor(run: dict[str, Any]) -> None:
    for res in run["doc"]["results"]:
        for row in res["rows"]:
            for variant in ("xccl", "raw"):
                s = row[variant]
                assert len(s["samples_us"]) == 2  # --iters 2: one slowest-rank time per round
                assert s["time_us"] == pytest.approx(statistics.median(s["samples_us"]))
                assert s["time_us"] > 0
                algbw = row["size"] / (s["time_us"] * 1e-6) / 1e9
                assert s["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
                assert s["busbw_gbps"] == pytest.approx(algbw * res["busbw_factor"], rel=1e-9)
            pairs = zip(row["xccl"]["samples_us"], row["raw"]["samples_us"], strict=True)
            assert row["ratio"] == pytest.approx(statistics.median(r / x for x, r in pairs))


def test_raw_comparison_names_the_equivalent(run: dict[str, Any]) -> None:
    by_op = {r["op"]: r for r in run["doc"]["results"]}
    assert by_op["all_reduce"]["raw"] == "dist.all_reduce"
    assert by_op["all_to_all_v"]["raw"] == "dist.all_to_all_single with splits"
    assert all(r["raw_unavailable"] is None for r in by_op.values())


def test_table_on_stdout_has_the_ratio_column(run: dict[str, Any]) -> None:
    lines = run["stdout"].splitlines()
    heads = [ln for ln in lines if ln.startswith("#") and "time(us)" in ln]
    assert len(heads) == len(_bench.OPS)
    assert all(h.split()[-1] == "ratio" for h in heads)
    rows = [ln.split() for ln in lines if ln and not ln.startswith("#")]
    # size count type, time algbw busbw twice, ratio
    assert rows and all(len(r) == 10 for r in rows)
    all_reduce = next(r for r in run["doc"]["results"] if r["op"] == "all_reduce")
    first = rows[0]
    assert int(first[0]) == all_reduce["rows"][0]["size"]
    assert math.isclose(float(first[9]), all_reduce["rows"][0]["ratio"], abs_tol=5e-4)


def test_plot_is_a_png(run: dict[str, Any]) -> None:
    if run["plot"] is None:
        pytest.skip("matplotlib (the 'plot' extra) is not installed")
    assert run["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_is_checked_before_launching() -> None:
    with pytest.raises(BenchError, match="--iters"):
        BenchConfig(iters=0).check()


def test_simulated_vendor_reports_what_it_refuses(tmp_path: Path) -> None:
    # Sophgo's SCCL has no reduce_scatter: xccl runs its emulation, and the raw call is refused by the
    # simulation exactly as on the hardware, which the results say instead of failing the run.
    info = next((i for i in xccl.plugins() if i.name == "sophgo"), None)
    if info is None or info.plugin is None or info.plugin.simulation() is None:
        pytest.skip("the xccl-sophgo plugin (plugins/sophgo) is not installed")
    argv = [
        sys.executable,
        "-m",
        "xccl",
        "bench",
        "--op",
        "reduce_scatter_tensor,all_reduce",
        "--plugin",
        "sophgo",
        "--simulate",
        "-n",
        str(WORLD),
        "-b",
        "64",
        "-e",
        "64",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--compare-raw",
        "--json",
        str(tmp_path / "sim.json"),
        "--no-progress",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "sim.json").read_text())
    assert (doc["plugin"], doc["backend"], doc["simulate"]) == ("sophgo", "sccl", True)
    rs, ar = doc["results"]
    table = xccl.capabilities("sophgo")
    assert (rs["level"], rs["via"]) == ("emulated", table.entry("reduce_scatter_tensor").via)
    assert "SimulatedVendorError" in rs["raw_unavailable"]
    assert "raw" not in rs["rows"][0] and rs["rows"][0]["xccl"]["time_us"] > 0
    assert ar["raw_unavailable"] is None and ar["rows"][0]["raw"]["time_us"] > 0
