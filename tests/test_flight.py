"""The flight recorder on real processes: what it records, dumps in torch's layout that torch's own analyzer reads,
every rank dumping when one times out, and ``xccl trace`` naming the missing rank and the straggler.

One 2-rank pool serves the recording tests (bodies set their own dump prefix); the fault scenario breaks its
group, so it gets a 4-rank pool of its own (forked from a server that imported torch once).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.collectives import _flight
from xccl.errors import InitError
from xccl.testing import RankPool
from xccl.tools._trace import analyse, load, render

TIMEOUT = 3.0
#: The recorder is off by default (its cost, docs/performance.md): torch's switch turns it on.
ON = {"TORCH_FR_BUFFER_SIZE": "2000"}
ANALYZER = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


@pytest.fixture(scope="module")
def pool2():
    with RankPool(2, {"timeout": 20}, env=ON, start_method="forkserver") as p:
        yield p


def _load(directory: Path, prefix: str = "rank_") -> dict[int, dict[str, Any]]:
    return {int(f.name[len(prefix):]): pickle.loads(f.read_bytes()) for f in directory.iterdir()
            if f.name.startswith(prefix) and not f.name.endswith(".tmp")}


# ---------------------------------------------------------------------------------------------- rank bodies


def body_calls(prefix: str) -> str | None:
    """Each entry point once: xccl's API, torch.distributed on xccl's group, async, an emulated op; then dump."""
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    t = torch.ones(3)
    xccl.all_reduce(t)  # line A: the flat all_reduce
    dist.all_reduce(t, async_op=True).wait()  # line B: torch.distributed, async
    dist.all_reduce(t, async_op=True).get_future().wait()  # line C: waited on its future, as DDP's reducer does
    out = torch.empty(6, dtype=torch.bfloat16)
    xccl.all_gather_into_tensor(out, torch.ones(3, dtype=torch.bfloat16))
    xccl.all_gather_into_tensor_uneven(torch.empty(6), torch.ones(3), [3, 3])  # emulated on gloo
    xccl.barrier()
    return xccl.dump_trace()


def body_signal(prefix: str) -> str:
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    xccl.all_reduce(torch.ones(1))
    os.kill(os.getpid(), signal.SIGUSR1)  # as `kill -USR1 <pid>` from a shell; the handler runs before kill returns
    return pickle.loads(Path(f"{prefix}{dist.get_rank()}").read_bytes())["xccl"]["reason"]


def body_skip(prefix: str, skipper: int) -> str:
    """Every rank but ``skipper`` calls a second all_reduce (and times out); the skipper waits elsewhere."""
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    t = torch.ones(2)
    xccl.all_reduce(t)
    if dist.get_rank() == skipper:
        mine = Path(f"{prefix}{skipper}")
        deadline = time.monotonic() + 3 * TIMEOUT + 10
        while not mine.exists() and time.monotonic() < deadline:  # stuck elsewhere, until its watcher dumps
            time.sleep(0.1)
        return "dumped" if mine.exists() else "never dumped"
    try:
        xccl.all_reduce(t)  # the call the skipper never makes
    except (xccl.CollectiveTimeout, xccl.PeerFailure) as exc:
        return type(exc).__name__
    return "completed?"


def body_die(prefix: str, victim: int) -> str:
    """The victim is SIGKILLed before the second all_reduce; the survivors fail typed and dump."""
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    t = torch.ones(2)
    xccl.all_reduce(t)
    if dist.get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        xccl.all_reduce(t)
    except (xccl.CollectiveTimeout, xccl.PeerFailure) as exc:
        return type(exc).__name__
    return "completed?"


def body_straggle(prefix: str, slow: int, delay: float, steps: int) -> dict[str, Any]:
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    t = torch.ones(1)
    xccl.barrier()  # the ranks start this body at different times: line them up first
    for _ in range(steps):
        if dist.get_rank() == slow:
            time.sleep(delay)
        xccl.all_reduce(t)
    xccl.dump_trace()
    return xccl.trace_summary(last=steps)["0"]


# ---------------------------------------------------------------------------------------------- recording


def test_every_entry_point_is_recorded_with_group_seq_sizes_site_and_times(pool2, tmp_path):
    outs = pool2.run_ok(body_calls, str(tmp_path / "rank_"))
    assert outs == [str(tmp_path / "rank_0"), str(tmp_path / "rank_1")]
    dumps = _load(tmp_path)
    assert set(dumps) == {0, 1}
    d = dumps[1]
    assert d["version"] == "2.10"  # torch 2.13's FlightRecorder.hpp version_val
    assert d["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    names = [e["profiling_name"] for e in d["entries"]]
    assert names == ["xccl:all_reduce"] * 3 + ["xccl:_all_gather_base", "xccl:all_gather_v", "xccl:barrier"]
    assert [e["collective_seq_id"] for e in d["entries"]] == [1, 2, 3, 4, 5, 6]
    assert d["pg_status"]["0"]["last_completed_collective"] == 6
    first, second, third, gather, uneven = d["entries"][:5]
    assert first["input_sizes"] == [[3]] and first["input_dtypes"] == ["Float"]
    assert gather["input_sizes"] == [[3]] and gather["output_sizes"] == [[6]] and gather["input_dtypes"] == ["BFloat16"]
    src = Path(__file__).read_text().splitlines()
    for entry, marker in ((first, "# line A"), (second, "# line B"), (third, "# line C")):
        (frame,) = entry["frames"]
        assert frame["filename"] == __file__ and frame["name"] == "body_calls"
        assert marker in src[frame["line"] - 1]  # the user's line, not torch's or xccl's
    for e in d["entries"]:
        assert e["state"] == "completed" and e["retired"]
        assert e["time_created_ns"] <= e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"]
    # The async calls' completions: found by wait(), and from the future's callback (no wait() on the handle).
    # wait() stamps before it returns; the callback may run just after the waiter wakes (torch's Future notifies
    # its waiters, then invokes callbacks: ATen/core/ivalue_inl.h markCompleted), so only its presence is certain.
    assert second["time_discovered_completed_ns"] < third["time_created_ns"]
    assert third["time_discovered_completed_ns"] >= third["time_discovered_started_ns"]
    # Emulated on gloo: the user's op is recorded, with its parts.
    assert uneven["xccl_op"] == "all_gather_into_tensor_uneven" and uneven["xccl_parts"] == ["all_to_all_single"]


def test_torch_analyzer_reads_a_directory_of_xccl_dumps(pool2, tmp_path):
    pool2.run_ok(body_calls, str(tmp_path / "rank_"))
    run = subprocess.run([*ANALYZER, str(tmp_path), "-p", "rank_"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "missing ranks" not in run.stdout + run.stderr


def test_sigusr1_dumps(pool2, tmp_path):
    assert pool2.run_ok(body_signal, str(tmp_path / "sig_")) == ["signal SIGUSR1"] * 2


@pytest.mark.parametrize(("env", "want"), [
    ({}, _flight.DEFAULT_ENTRIES), ({"TORCH_FR_BUFFER_SIZE": "64"}, 64), ({"TORCH_FR_BUFFER_SIZE": "0"}, 0),
    ({"XCCL_TRACE": "0", "TORCH_FR_BUFFER_SIZE": "64"}, 0), ({"XCCL_TRACE": "1"}, _flight.DEFAULT_ENTRIES),
    ({"XCCL_TRACE": "300"}, 300),
], ids=["default-on", "torch-size", "torch-off", "xccl-off-wins", "xccl-on", "xccl-size"])
def test_switches(monkeypatch, env, want):
    for name in ("XCCL_TRACE", "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _flight.capacity() == want


def test_bad_switch_is_a_typed_error(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "lots")
    with pytest.raises(InitError, match="TORCH_FR_BUFFER_SIZE"):
        _flight.capacity()


def test_ring_keeps_the_last_n_calls():
    class St:  # what an entry reads of its group
        name, rank, ranks = "g", 0, (0,)

    from xccl.ops import _specs as S

    ring = _flight.Flight(4)
    recorded = _flight._Recorder(St(), ring).stage(lambda *call: None)  # a call that completes at once
    for _ in range(10):
        recorded(S.ALL_REDUCE, (torch.ones(1), None), None, False)
    assert [e.seq for e in ring.entries()] == [7, 8, 9, 10]
    assert all(e.completed for e in ring.entries())


def _kargs(name: str) -> tuple[Any, ...]:
    """Kernel arguments of one call of the op ``name`` on a group of two (tensors of distinct shapes and dtypes)."""
    a, b, c = torch.ones(3, dtype=torch.bfloat16), torch.ones(6, dtype=torch.bfloat16), torch.ones(2, 2)
    return {"all_reduce": (c, None), "broadcast": (c, 0), "all_gather_into_tensor": (b, a),
            "reduce_scatter_tensor": (a, b, None), "all_to_all_single": (b, b.clone(), None, None),
            "all_gather": ([c, c.clone()], c), "all_to_all_single_uneven": (b, b.clone(), [2, 4], [3, 3])}[name]


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "all_to_all_single", "all_gather", "all_to_all_single_uneven"])
def test_every_stored_form_reads_back_as_the_general_description(name):
    # The recorder stores a one-tensor op (Spec.solo_index) and a read-one-write-one op (Spec.pair) compactly; the
    # entry must read back what the general description (every tensor read, every tensor written) gives.
    class St:
        name, rank, ranks = "g", 0, (0, 1)

    from xccl.ops._specs import SPECS

    spec = SPECS[xccl.Collective(name)]
    kargs = _kargs(name)
    ring = _flight.Flight(4)
    _flight._Recorder(St(), ring).stage(lambda *call: None)(spec, kargs, None, False)
    (entry,) = ring.entries()
    assert (entry.inputs, entry.outputs) == _flight._describer(spec)(kargs)
    assert entry.inputs and entry.outputs


# ---------------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("vendor", ["cpu", pytest.param("sophgo", marks=pytest.mark.slow),
                                    pytest.param("ascend", marks=pytest.mark.slow)])
def test_a_rank_that_skips_a_collective_is_named_by_torchs_analyzer(tmp_path, vendor):
    """Rank 3 skips an all_reduce: the survivors time out and dump, rank 3 (asleep elsewhere) dumps when asked over
    the store, and torch's own analyzer names rank 3 as missing (on cpu, and on the simulated vendors)."""
    prefix = str(tmp_path / "rank_")
    sim = {} if vendor == "cpu" else {"XCCL_SIMULATE": vendor}
    if vendor == "ascend":  # HCCL ends a hung collective after HCCL_EXEC_TIMEOUT (default 1836 s), not at timeout=
        sim["HCCL_EXEC_TIMEOUT"] = str(int(TIMEOUT))
    with RankPool(4, {"timeout": TIMEOUT}, env={**ON, **sim, "XCCL_TRACE_POLL": "0.2"}, start_method="forkserver",
                  start_timeout=60) as pool:
        outs = pool.run(body_skip, prefix, 3, timeout=4 * TIMEOUT + 30)
    # A survivor times out; on HCCL a survivor may see a peer's communicator torn down first (PeerFailure).
    survivors = [o.value for o in outs[:3]]
    assert "CollectiveTimeout" in survivors and set(survivors) <= {"CollectiveTimeout", "PeerFailure"}, outs
    assert outs[3].value == "dumped", [str(o) for o in outs]
    dumps = _load(tmp_path)
    assert set(dumps) == {0, 1, 2, 3}
    assert dumps[3]["xccl"]["reason"].startswith("asked by rank"), dumps[3]["xccl"]
    assert [e["state"] for e in dumps[0]["entries"]] == ["completed", "started"]
    run = subprocess.run([*ANALYZER, str(tmp_path), "-p", "rank_"], capture_output=True, text=True, timeout=60)
    text = run.stdout + run.stderr
    assert "Not all ranks joining collective" in text and "missing ranks: {3}" in text, text
    # xccl's own verdict: the stuck call, its site, and who never called it.
    trace = subprocess.run([sys.executable, "-m", "xccl", "trace", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert trace.returncode == 1, trace.stderr
    assert "#2 all_reduce not completed: entered by ranks [0, 1, 2]" in trace.stdout, trace.stdout
    assert "rank 3 never called #2 (its last call here: #1 all_reduce at " in trace.stdout, trace.stdout
    assert f"{__file__}:" in trace.stdout


_SKIP_UNDER_TORCHRUN = """
import datetime, sys, torch, xccl
xccl.init(timeout=datetime.timedelta(seconds=float(sys.argv[1])))
from tests.test_flight import body_skip
print(f"rank {xccl.get_world().rank}: {body_skip(sys.argv[2], 1)}", flush=True)
"""


def test_every_rank_dumps_under_torchrun_standalone(tmp_path):
    """torchrun --standalone gives MASTER_ADDR=localhost, a name: the rank that times out still reaches the store
    to ask the other to dump (every path that knocks on the store resolves it), so both dumps are written."""
    script = tmp_path / "skip.py"
    script.write_text(_SKIP_UNDER_TORCHRUN)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(ON, XCCL_TRACE_POLL="0.2", PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]),
                                                                      env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(TIMEOUT), str(tmp_path / "rank_")], capture_output=True, text=True,
                         env=env, timeout=4 * TIMEOUT + 90)
    assert "rank 1: dumped" in run.stdout and "rank 0: CollectiveTimeout" in run.stdout, run.stdout + run.stderr
    assert set(_load(tmp_path)) == {0, 1}


@pytest.mark.slow
def test_a_killed_rank_leaves_the_survivors_dumps_and_xccl_trace_says_whose_is_missing(tmp_path):
    with RankPool(4, {"timeout": TIMEOUT}, env=ON, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run(body_die, str(tmp_path / "rank_"), 1, timeout=4 * TIMEOUT + 30)
    assert outs[1].raised("RankDied")
    assert {outs[r].value for r in (0, 2, 3)} <= {"PeerFailure", "CollectiveTimeout"}, [str(o) for o in outs]
    deadline = time.monotonic() + 10
    while len(_load(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(_load(tmp_path)) == {0, 2, 3}
    trace = subprocess.run([sys.executable, "-m", "xccl", "trace", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert "no dump from ranks [1]" in trace.stdout, trace.stdout


# ---------------------------------------------------------------------------------------------- xccl trace


def test_xccl_trace_names_the_straggler_and_its_delay(tmp_path):
    """Rank 2 sleeps 0.2 s before every all_reduce: ``xccl trace`` names it, with its delay within 20%."""
    delay, steps = 0.2, 8
    with RankPool(4, {"timeout": 20}, env={"XCCL_TRACE": "1"}, start_method="forkserver", start_timeout=60) as pool:
        summaries = pool.run_ok(body_straggle, str(tmp_path / "rank_"), 2, delay, steps, timeout=60)
    reports = analyse(load(tmp_path, "rank_"), window=steps)  # the all_reduces, not the barrier before them
    (world,) = reports
    assert world.stuck_seq is None and not world.missing
    top = world.stragglers[0]
    assert (top.rank, top.last_in, top.window) == (2, steps, steps), world.stragglers
    assert abs(top.by_ms - delay * 1000) <= 0.2 * delay * 1000, top
    # Each rank's own summary, no communication: the straggler waits least, the others wait about its delay.
    assert [x["calls"] for x in summaries] == [steps] * 4 and summaries[0]["completed"] == steps + 1
    assert min(range(4), key=lambda r: summaries[r]["wait_ms"]) == 2
    assert all(abs(summaries[r]["wait_ms"] - delay * 1000) <= 0.2 * delay * 1000 for r in (0, 1, 3)), summaries
    text = render(reports)
    assert f"straggler: rank 2 entered last by {top.by_ms:.1f} ms on group '0' in {steps} of the last {steps}" in text


def test_xccl_trace_on_a_directory_without_dumps_says_so(tmp_path, capsys):
    from xccl.tools.cli import main

    assert main(["trace", str(tmp_path)]) == 2
    assert "cannot tell the dumps' prefix" in capsys.readouterr().err
