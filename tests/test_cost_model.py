"""The cost model's fit and calibration (xccl/tools/_cost_fit.py) and the vendors' published figures.

No ranks are spawned here: the fit is checked on synthetic points with known answers, on ``xccl bench --json``
documents of the real schema, on a published nccl-tests log and on the HCCL Test format from Ascend's docs
(tests/data/cost/SOURCES.md). How well a fitted model predicts real steps is a benchmark
(benchmarks/cost_model.py, docs/performance.md), not a timed test.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from xccl.errors import InvalidArgument
from xccl.plugin import Collective
from xccl.plugin._cost import CostModel, LinkCost, bus_factor
from xccl.tools._cost_fit import Point, calibrate, fit, read_points
from xccl.tools._cost_model import predict

C = Collective
DATA = Path(__file__).parent / "data" / "cost"
SIZES = [2**k for k in range(10, 24, 2)]


def _time(op: Collective, nbytes: int, n: int, lat_us: float, busbw: float) -> float:
    return lat_us * 1e-6 + nbytes * bus_factor(op, n) / (busbw * 1e9)


@pytest.mark.parametrize("noise", [0.0, 0.05], ids=["exact", "5%-noise"])
def test_fit_recovers_latency_and_busbw(noise: float) -> None:
    truth = {C.ALL_REDUCE: (40.0, 3.0), C.ALL_GATHER_INTO_TENSOR: (25.0, 5.0)}
    rng = random.Random(7)
    points = [
        Point(op, s, n, _time(op, s, n, lat, bw) * (1 + rng.uniform(-noise, noise)))
        for op, (lat, bw) in truth.items() for n in (2, 4) for s in SIZES
    ]
    got = fit(points, source="synthetic")
    tol = 1e-6 if noise == 0 else 0.15
    for op, (lat, bw) in truth.items():
        assert got[op].latency_us == pytest.approx(lat, rel=tol)
        assert got[op].busbw_gbps == pytest.approx(bw, rel=tol)
        assert got[op].source == "synthetic"


def _bench_doc(n: int, ops: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """An ``xccl bench --json`` document (the fields calibrate reads, as xccl/tools/_bench.py writes them)."""
    results = []
    for op, (lat, bw) in ops.items():
        rows = []
        for s in SIZES:
            t = _time(C(op), s, n, lat, bw) * 1e6
            rows.append({"size": s, "count": s // 4, "rounds": 3, "xccl": {
                "time_us": t, "iqr_us": [0.8 * t, 1.5 * t], "samples_us": [0.5 * t, t, 2 * t]}})
        results.append({"op": op, "level": "native", "error": None, "rows": rows})
    results.append({"op": "barrier", "level": "native", "error": None,
                    "rows": [{"size": 0, "count": 0, "xccl": {"time_us": 30.0}}]})
    results.append({"op": "gather", "level": "unsupported", "error": "UnsupportedCollective: ...", "rows": []})
    return {"xccl_bench": 1, "plugin": "cpu", "world_size": n, "results": results}


def test_calibrate_reads_bench_json_into_the_link_it_measured(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench_doc(4, {"all_reduce": (60.0, 1.5), "broadcast": (30.0, 2.0)})))
    published = LinkCost(9.0, 99.0, "vendor doc")
    base = CostModel("X", intra={C.SCATTER: published}, inter={C.ALL_REDUCE: published})

    inter = calibrate(path, generation="my cluster", intra_node=False, base=base)

    assert inter.generation == "my cluster"
    assert inter.inter[C.ALL_REDUCE].latency_us == pytest.approx(60.0)
    assert inter.inter[C.ALL_REDUCE].busbw_gbps == pytest.approx(1.5)
    assert inter.inter[C.ALL_REDUCE].source == f"fitted: {path}"
    assert inter.intra == {C.SCATTER: published}  # the other link and unmeasured ops keep the published figures
    assert set(inter.inter) == {C.ALL_REDUCE, C.BROADCAST}  # barrier moves no data, gather failed: not fitted
    assert calibrate(path, generation="g").intra[C.BROADCAST].busbw_gbps == pytest.approx(2.0)
    q1 = calibrate(path, generation="g", stat="q1").intra[C.ALL_REDUCE]  # every time x 0.8: latency x 0.8, bw / 0.8
    assert (q1.latency_us, q1.busbw_gbps) == (pytest.approx(48.0), pytest.approx(1.875))
    assert calibrate(path, generation="g", stat="min").intra[C.ALL_REDUCE].latency_us == pytest.approx(30.0)


def test_calibrate_a_published_nccl_tests_log() -> None:
    path = DATA / "nccl_tests_all_reduce.txt"
    points = read_points(path)
    assert {p.group_size for p in points} == {8}  # no rank list: busbw / algbw = 1.75 names 8 ranks
    assert len(points) == 11 and points[0].where == f"{path}:9"
    model = calibrate(path, generation="8 GPUs (Mooncake PR #3484)")
    cost = model.intra[C.ALL_REDUCE]
    assert cost.latency_us is not None and 15 < cost.latency_us < 22  # the log's small sizes take 18.7-19.5 us
    assert cost.busbw_gbps is not None and 250 < cost.busbw_gbps < 320  # its 32 MiB row reached 300.5 GB/s
    for p in points:  # the bar, on the log the model was fitted to
        got = predict(model, p.op, p.nbytes, p.group_size, intra_node=True).seconds
        assert got == pytest.approx(p.seconds, rel=0.25)


def test_calibrate_an_hccl_test_log_converts_algbw_with_the_nccl_tests_factor() -> None:
    path = DATA / "hccl_test_all_reduce.txt"
    points = read_points(path)
    assert {(p.op, p.group_size) for p in points} == {(C.ALL_REDUCE, 8)}  # from "mpirun -n 8 ./bin/all_reduce_test"
    # HCCL's "GB/s" is 2**30 bytes per second (64 MiB in 2630.20 us printed as 23.76245; 33554432 B in 1714.85 us
    # as 18.22317), where nccl-tests' and xccl's are 10**9: the fit works from the times, so it reads the same.
    for p, algbw in ((points[-1], 23.76245), (points[-2], 18.22317)):
        assert p.nbytes / p.seconds / 2**30 == pytest.approx(algbw, rel=1e-5)
    model = calibrate(path, generation="Atlas (Ascend docs example)")
    cost = model.intra[C.ALL_REDUCE]
    # The fit's busbw is algbw x 2(n-1)/n at the large end: the slope is above the last row's algbw x 1.75.
    assert cost.busbw_gbps is not None and cost.busbw_gbps > 23.76245 * 1.75


@pytest.mark.parametrize(
    ("text", "kwargs", "says"),
    [
        (None, {}, "cannot read it"),
        ('{"xccl_bench": 1}', {"stat": "mean"}, "stat='mean'"),
        ('{"results": []}', {}, "not 'xccl bench --json' output"),
        ('{"xccl_bench": 1, "world_size": 2, "results": [{"op": "all_reduce", "rows": [{"size": 8}]}]}', {},
         "results[0] (all_reduce).rows[0]"),
        ("# size count type redop root time algbw busbw #wrong\n 8 2 float sum -1 12.5 x y 0\n",
         {"op": "all_reduce", "world_size": 2}, ":2: not an nccl-tests row"),
        ("# all_reduce_perf\n# size count type redop root time algbw busbw #wrong\n", {"world_size": 2},
         "no nccl-tests table"),
        ("# size count type redop root time algbw busbw #wrong\n 8 2 float sum -1 12.5 0.0 0.0 0\n", {},
         "pass op="),
        ("all_reduce_test -p 2\ndata_size(Bytes): | avg_time(us): | alg_bandwidth(GB/s): | check_result:\n"
         "8192 | 700.0 | 0.01 | failed\n", {}, ":3: check_result is 'failed'"),
        ("all_reduce_test\ndata_size(Bytes): | avg_time(us): | alg_bandwidth(GB/s): | check_result:\n", {},
         "pass world_size="),
        ("mpirun -n 2 ./all_reduce_test -p 2\ndata_size(Bytes): | avg_time(us): | alg: | check:\n"
         "8192 | 700.0 | 0.01 | success\n", {}, "at least two sizes"),
    ],
    ids=["missing", "bad-stat", "not-bench-json", "bench-row", "nccl-row", "nccl-empty", "nccl-no-op", "hccl-failed",
         "hccl-no-n", "one-size"],
)
def test_bad_measurements_name_the_file_and_line(tmp_path: Path, text: str | None, kwargs: dict[str, Any],
                                                 says: str) -> None:
    path = tmp_path / "m.log"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InvalidArgument, match="calibrate") as info:
        calibrate(path, generation="g", **kwargs)
    assert str(path) in str(info.value) and says in str(info.value)


def test_fit_rejects_points_that_are_not_measurements() -> None:
    with pytest.raises(InvalidArgument, match="not a measurement"):
        fit([(C.ALL_REDUCE, 1024, 2, 0.0), (C.ALL_REDUCE, 2048, 2, 1e-3)])
    with pytest.raises(InvalidArgument, match="does not grow with size"):
        fit([(C.ALL_REDUCE, 1024, 2, 2e-3), (C.ALL_REDUCE, 1 << 20, 2, 1e-3)])


def test_every_vendor_figure_has_a_source_or_says_unknown() -> None:
    from xccl.plugin._registry import plugins

    published = {info.name: info.plugin.cost_models() for info in plugins() if info.plugin is not None}
    assert [m.generation for m in published["ascend"]] == ["Atlas A2", "Atlas A3"]
    assert [m.generation for m in published["sophgo"]] == ["SG2260"]
    assert published["cpu"] == ()  # the cpu plugin's model is fitted from `xccl bench` here, never fixed figures
    for name in ("ascend", "sophgo"):
        for model in published[name]:
            assert model.intra and model.inter, (name, model.generation)
            for cost in (*model.intra.values(), *model.inter.values()):
                assert cost.source, (name, model.generation)
                if cost.latency_us is None or cost.busbw_gbps is None:
                    assert cost.source.startswith("unknown: "), cost.source
    gaps = predict(published["sophgo"][0], C.ALL_REDUCE, 1 << 20, 8, intra_node=False)
    assert gaps.seconds is None and "one machine only" in gaps.source
