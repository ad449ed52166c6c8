"""``xccl bench --compare-raw``'s statistics and its A/A control: the confidence interval of a median, the rounds a
time budget buys, the summary, and one real two-rank run with the control, passes and a time budget."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from xccl.tools._bench import BenchConfig, BenchError, summarize
from xccl.tools._bench_config import MIN_ROUNDS
from xccl.tools._bench_measure import median_ci, paired, plan_rounds
from xccl.tools.cli import main

WORLD = 2


# ------------------------------------------------------------------------------------------------- statistics


def test_median_ci_is_the_order_statistics_around_the_middle() -> None:
    xs = [float(i) for i in range(100)]
    random.Random(0).shuffle(xs)
    # n = 100: ranks 50 -+ 1.96 * 10 / 2 = 9.8, i.e. the 41st to the 60th value.
    assert median_ci(xs) == (40.0, 59.0)
    assert median_ci([3.0]) == (3.0, 3.0)
    assert median_ci([2.0, 1.0]) == (1.0, 2.0)


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time() -> None:
    # Heavy-tailed noise, as on a shared machine: the interval makes no assumption about its shape.
    rng = random.Random(1)
    trials, covered = 2000, 0
    for _ in range(trials):
        sample = [rng.lognormvariate(0.0, 1.0) for _ in range(51)]
        lo, hi = median_ci(sample)
        covered += lo <= 1.0 <= hi  # the median of lognormal(0, 1) is e^0
    assert 0.93 <= covered / trials <= 0.985


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    raw = [10.0, 20.0, 30.0, 40.0, 50.0]
    xccl = [5.0, 20.0, 60.0, 20.0, 50.0]  # per-round ratios 2, 1, 0.5, 2, 1
    out = paired(raw, xccl)
    assert out["ratio"] == 1.0
    lo, hi = out["ratio_ci"]
    assert lo <= out["ratio"] <= hi
    assert out["ratio_iqr"][0] <= out["ratio"] <= out["ratio_iqr"][1]


def test_rounds_follow_the_time_budget_within_bounds() -> None:
    assert plan_rounds(BenchConfig(iters=20), 1e-6, 3) == 20  # no budget: exactly --iters
    cfg = BenchConfig(iters=4000, time_per_size=1.0)
    assert plan_rounds(cfg, 100e-6, 2) == 4000  # 5000 fit: capped at --iters
    assert plan_rounds(cfg, 250e-6, 2) == 2000  # 1 s / (2 variants x 250 us)
    assert plan_rounds(cfg, 0.1, 3) == MIN_ROUNDS  # 100 ms calls: the floor, not 3 rounds
    assert plan_rounds(BenchConfig(iters=4000, time_per_size=1.0, min_iters=200), 0.1, 3) == 200  # --min-iters
    assert plan_rounds(BenchConfig(iters=5, time_per_size=1.0), 0.1, 3) == 5  # never more than --iters


def test_summary_counts_sizes_within_the_tolerance() -> None:
    rows: list[dict[str, Any]] = [
        {"size": 4, "ratio": 1.01, "ratio_ci": [0.99, 1.03], "control": {"ratio": 1.0, "ratio_ci": [0.98, 1.02]}},
        {"size": 8, "ratio": 0.97, "ratio_ci": [0.90, 1.01], "control": {"ratio": 1.06, "ratio_ci": [1.0, 1.1]}},
        {"size": 16, "ratio": 0.90, "ratio_ci": [0.88, 0.93], "control": {"ratio": 0.99, "ratio_ci": [0.97, 1.0]}},
    ]
    s = summarize(rows, 0.05)
    assert s is not None
    assert (s["xccl_vs_raw"]["within"], s["xccl_vs_raw"]["resolved_within"]) == (2, 1)
    assert s["xccl_vs_raw"]["outside"] == [(16, 0.90)]
    assert (s["aa_control"]["within"], s["aa_control"]["resolved_within"]) == (2, 2)
    assert summarize([{"size": 4, "xccl": {}}]) is None  # no raw comparison, no summary


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (BenchConfig(control=True), "--aa-control is a control for --compare-raw"),
        (BenchConfig(compare_raw=True, iters=3, passes=4), "--passes must be between 1 and --iters"),
        (BenchConfig(time_per_size=-1.0), "--time-per-size must be >= 0"),
        (BenchConfig(min_iters=0), "--min-iters must be >= 1"),
    ],
)
def test_bad_control_configuration(cfg: BenchConfig, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        cfg.check()


def test_control_without_compare_raw_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--aa-control"]) == 2
    assert "--aa-control is a control for --compare-raw" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- a real run


def _bench(tmp: Path, *extra: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "xccl", "bench", "--op", "all_reduce,reduce_scatter_tensor,sendrecv", "--plugin", "cpu",
        "-n", str(WORLD), "-b", "8", "-e", "512", "-f", "8", "--warmup", "2", "--compare-raw", "--no-progress",
        "--json", str(tmp / "bench.json"), *extra,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {"doc": json.loads((tmp / "bench.json").read_text()), "stdout": proc.stdout}


@pytest.fixture(scope="module")
def controlled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two ranks with the A/A control, 2 passes and a small time budget (at most 40 rounds per size)."""
    return _bench(
        tmp_path_factory.mktemp("aa"), "--aa-control", "--passes", "2", "--time-per-size", "0.02", "--iters", "40"
    )


def test_aa_control_is_in_the_json(controlled: dict[str, Any]) -> None:
    doc = controlled["doc"]
    assert doc["config"]["control"] is True and doc["config"]["passes"] == 2
    for res in doc["results"]:
        assert res["error"] is None and res["raw_unavailable"] is None, res
        assert res["xccl_group"] == "raw"  # xccl adopts the raw calls' group: one communicator for both
        assert len(res["rows"]) == 3, res["op"]
        for row in res["rows"]:
            n = row["rounds"]
            assert min(40, MIN_ROUNDS) <= n <= 40
            raw, aa = row["raw"], row["control"]
            for variant in (row["xccl"], raw, aa):
                assert len(variant["samples_us"]) == n  # every round timed every variant once
                assert variant["time_us"] == pytest.approx(statistics.median(variant["samples_us"]))
                assert variant["iqr_us"][0] <= variant["time_us"] <= variant["iqr_us"][1]
            # The A/A ratio is raw's time over the second raw call's, round by round, like xccl's ratio.
            pairs = zip(raw["samples_us"], aa["samples_us"], strict=True)
            assert aa["ratio"] == pytest.approx(statistics.median(r / c for r, c in pairs), rel=1e-6)
            for r in (row, aa):
                lo, hi = r["ratio_ci"]
                assert lo <= r["ratio"] <= hi
        summary = res["summary"]
        assert summary["sizes"] == 3 and "aa_control" in summary


def test_aa_control_in_the_table(controlled: dict[str, Any]) -> None:
    lines = controlled["stdout"].splitlines()
    heads = [ln for ln in lines if ln.startswith("#") and "time(us)" in ln]
    assert len(heads) == 3 and all("A/A" in h for h in heads)
    rows = [ln.split() for ln in lines if ln and not ln.startswith("#")]
    # size count type, time algbw busbw twice, ratio, its CI, A/A, its CI
    assert len(rows) == 9 and all(len(r) == 13 for r in rows)
    first = controlled["doc"]["results"][0]["rows"][0]
    assert float(rows[0][11]) == pytest.approx(first["control"]["ratio"], abs=5e-4)
    assert any(ln.startswith("# A/A control (raw/raw): median") for ln in lines)


def test_xccl_on_world_is_recorded(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "--xccl-on-world", "--iters", "2")["doc"]
    assert [r["xccl_group"] for r in doc["results"]] == ["world"] * 3
    assert all("control" not in row for r in doc["results"] for row in r["rows"])
