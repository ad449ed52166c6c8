"""``xccl doctor --first-hour`` (``xccl/tools/cli/doctor_first_hour.py``) runs in simulation and writes its report:
the rounds a hardware owner runs on Ascend or Sophgo, so that the command cannot break unseen."""

from __future__ import annotations

import json

import pytest

from xccl.tools.cli import main
from xccl.tools.cli.doctor_first_hour import ROUNDS, first_hour

SURVIVORS = [0, 2, 3]


def test_first_hour_on_simulated_ascend_reports_each_round(tmp_path):
    report = tmp_path / "first-hour.json"
    result = first_hour("ascend", simulate=True, bound=10, alive_after=0.5, report=report,
                        env={"HCCL_EXEC_TIMEOUT": "4"})
    assert json.loads(report.read_text()) == result
    assert list(result["rounds"]) == list(ROUNDS) and result["lost"] == 1
    for r in result["rounds"]["silent"]:  # the watch off: HCCL's own execution timeout, and nothing sooner
        assert r["failed_step"]["seconds"] > 3 and "EI0002" in r["failed_step"]["message"], r
    for name in ("shrink", "shrink_abort"):
        got = result["rounds"][name]
        assert [r["rank"] for r in got] == SURVIVORS, got
        for r in got:
            assert r["failed_step"]["type"] == "PeerFailure" and r["failed_step"]["ranks"] == [1], r
            assert r["shrink"]["type"] == "" and r["new_world"]["right"] and r["new_world"]["size"] == 3, r
    assert any("simulation" in gap for gap in result["not_checked"]), result["not_checked"]


@pytest.mark.slow
def test_first_hour_on_simulated_sophgo_shows_no_bound_and_the_refused_shrink(tmp_path, capsys):
    report = tmp_path / "first-hour.json"
    code = main(["doctor", "--first-hour", "--vendor", "sophgo", "--simulate", "--bound", "5", "--alive-after", "0",
                 "--report", str(report)])
    assert code == 0
    result = json.loads(report.read_text())
    for r in result["rounds"]["silent"]:  # nothing bounds a missing peer on SCCL
        assert r["failed_step"]["type"] == "" and r["failed_step"]["message"] == "nothing within 5 s", r
    for r in result["rounds"]["shrink"]:  # the watch names rank 1; Sophgo refuses the in-place shrink
        assert r["failed_step"]["ranks"] == [1] and r["shrink"]["type"] == "UnsupportedCollective", r
    assert "rank 2: PeerFailure after" in capsys.readouterr().out


def test_first_hour_needs_a_vendor(capsys, monkeypatch):
    monkeypatch.delenv("XCCL_VENDOR", raising=False)
    assert main(["doctor", "--first-hour", "--ranks", "2", "--lose", "3"]) == 2
    assert "needs --vendor" in capsys.readouterr().out


def test_a_survivor_that_ended_itself_is_reported_as_such():
    """On a vendor without an abort (Sophgo) a survivor still waiting ``--alive-after`` seconds after the verdict ends
    itself with exit code 75 (``xccl.collectives._health._ending``): the report says so rather than a bare death."""
    from xccl.collectives._health._ending import EXIT_CODE
    from xccl.tools.cli.doctor_first_hour import render_hour

    outcome = {"rank": 2, "error": f"rank 2: RankDied exit code {EXIT_CODE}"}
    other = {"rank": 3, "error": "rank 3: RankDied exit code 1"}
    text = render_hour({"vendor": "sophgo", "simulated": True, "world": 4, "lost": 1, "not_checked": [],
                        "rounds": {"shrink": [outcome, other]}})
    assert f"rank 2: ended itself (exit code {EXIT_CODE}) after the loss" in text, text
    assert "rank 3: rank 3: RankDied exit code 1" in text, text


def test_a_synchronisation_released_by_the_vendors_abort_is_reported_with_the_next_calls_verdict():
    """On the hardware, the sentinel's ``stop_device`` fails a survivor's ``.item()`` with FORCE STOP: the report
    shows that, and the next call's ``PeerFailure``, which is the verdict the shrink then uses."""
    from xccl.tools.cli.doctor_first_hour import render_hour

    r = {"rank": 2, "memory_before": 0,
         "failed_step": {"seconds": 0.4, "type": "RuntimeError", "ranks": [], "message": "FORCE STOP"},
         "next_call": {"seconds": 0.001, "type": "PeerFailure", "ranks": [1], "message": "rank 1 is gone"},
         "shrink": {"seconds": 0.3, "type": "", "ranks": [], "message": ""}}
    text = render_hour({"vendor": "ascend", "simulated": False, "world": 4, "lost": 1, "not_checked": [],
                        "rounds": {"shrink": [r]}})
    assert "rank 2: RuntimeError after 0.4 s; next call: PeerFailure after 0.001 s; shrink done in 0.3 s" in text, text
