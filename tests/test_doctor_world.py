"""``xccl doctor --world``: every rank reports, rank 0 compares, through the launcher's store only.

The multi-rank tests start real processes (``python -m xccl doctor --world``), 2 or 4, with the variables torchrun
sets and a free port, so that each rank can be given its own environment; one runs under torchrun itself, whose
agent hosts the store. "Hosts" are named with ``XCCL_DOCTOR_HOST`` (the rank's reported host name), so that one
machine shows differences across hosts. The facts are made to differ legitimately: ``XCCL_SIMULATE=sophgo`` on
one host makes its ranks select another plugin, of another distribution and vendor. Every wait is bounded: a run
that does not finish fails the test as a hang. The comparison itself is also tested in-process on the facts of
this node, changed the way another host's would be (a torch version, ``WORLD_SIZE``, a doubled rank).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from xccl.testing import free_port
from xccl.tools.cli import main
from xccl.tools.cli.doctor_checks import collect
from xccl.tools.cli.doctor_facts import RankFacts, compare, gather, rank_list

DATA = Path(__file__).parent / "data" / "ranktables"
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
           "XCCL_VENDOR", "XCCL_SIMULATE", "XCCL_CHECK", "XCCL_TIMEOUT", "RANK_TABLE_FILE", "CUDA_VISIBLE_DEVICES",
           "ASCEND_RT_VISIBLE_DEVICES", "TPU_VISIBLE_DEVICES", "CHIP_MAP", "XCCL_DOCTOR_HOST",
           "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")
#: Beyond --timeout: starting python and importing torch on a loaded 2-CPU machine. Only a bound against hangs.
_STARTUP = 90.0


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH}
    env.update(extra)
    return env


@dataclass
class Ran:
    rank: int
    code: int
    out: str
    err: str
    seconds: float


def launch(world: int, *, timeout: float, absent: tuple[int, ...] = (), json_out: bool = False,
           env: dict[int, dict[str, str]] | None = None) -> dict[int, Ran]:
    """Start ranks ``0..world-1`` except ``absent`` as torchrun would (host ``node<i>``: the first half of the
    ranks on node0, the rest on node1), and wait, bounded, for every one to exit."""
    port = free_port()
    procs = {}
    start = time.monotonic()
    for r in reversed(range(world)):  # rank 0 last: its --timeout then starts after the others have started
        if r in absent:
            continue
        host = f"node{r * 2 // world}"
        local = r - (world // 2 if r >= world // 2 and world > 1 else 0)
        rank_env = clean_env(
            RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(max(world // 2, 1)),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), XCCL_DOCTOR_HOST=host, **(env or {}).get(r, {}),
        )
        cmd = [sys.executable, "-m", "xccl", "doctor", "--world", "--timeout", str(timeout)]
        procs[r] = subprocess.Popen(cmd + (["--json"] if json_out else []), env=rank_env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    try:
        for r, proc in sorted(procs.items()):
            left = start + timeout + _STARTUP - time.monotonic()
            stdout, stderr = proc.communicate(timeout=max(left, 1.0))
            out[r] = Ran(r, proc.returncode, stdout, stderr, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        pytest.fail(f"xccl doctor --world hung: rank {r} still running {timeout + _STARTUP:g} s after the start")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    return out


def rows(text: str) -> dict[int, dict[str, str]]:
    """Rank 0's table as ``{rank: {host, local, pid, status}}`` (cells are separated by two or more spaces)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("host "))
    out = {}
    for line in lines[at + 2:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        out[int(cells[1])] = {"host": cells[0], "local": cells[2], "pid": cells[3], "status": cells[-1]}
    return out


# ------------------------------------------------------------------------------------------- real processes


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: breadth, second tier
def test_every_rank_agrees_and_only_rank_0_prints(world):
    ran = launch(world, timeout=60)
    assert [r.code for r in ran.values()] == [0] * world, {r: (x.out, x.err[-2000:]) for r, x in ran.items()}
    table = ran[0].out
    assert f"{world} of {world} ranks answered, on 2 host(s)" in table
    assert f"all {world} ranks agree: plugin 'cpu', torch {torch.__version__}" in table
    assert "differences" not in table
    got = rows(table)
    assert sorted(got) == list(range(world))
    for r, row in got.items():
        assert row["host"] == f"node{r * 2 // world}" and row["status"] == "ok"
    assert len({row["pid"] for row in got.values()}) == world  # one row per process, not rank 0's facts copied
    assert all(not x.out for r, x in ran.items() if r != 0), "only rank 0 prints"


def test_under_torchrun_through_its_agent_store():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "xccl", "doctor", "--world", "--json", "--timeout", "60"]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=60 + _STARTUP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # one document: the other rank printed nothing
    assert report["ok"] and report["missing"] == [] and report["answered"] == 2
    assert [f["rank"] for f in report["ranks"]] == [0, 1]
    assert all(f["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True" for f in report["ranks"])


def test_a_host_with_another_plugin_is_flagged_on_every_rank():
    sim = {"XCCL_SIMULATE": "sophgo"}
    ran = launch(4, timeout=60, env={2: sim, 3: sim})
    assert [r.code for r in ran.values()] == [1, 1, 1, 1], {r: x.err[-2000:] for r, x in ran.items()}
    table = ran[0].out
    for line in (
        "FAIL  plugin: 'cpu' on host node0 (ranks 0-1); 'sophgo' on host node1 (ranks 2-3)",
        "FAIL  plugin version: 'xccl 0.1.0' on host node0 (ranks 0-1); 'xccl-sophgo 0.1.0' on host node1 (ranks 2-3)",
        "FAIL  backend: 'gloo (native)' on host node0 (ranks 0-1); 'sccl (simulated)' on host node1 (ranks 2-3)",
    ):
        assert line in table, table
    assert "WARN  XCCL_SIMULATE" not in table  # env differences are reported through what they change
    assert "problem(s) across the world: plugin, plugin version, vendor, backend" in table
    assert "sophgo (sim)" in table and "cpu (simulated tpu)" in table
    assert all(not x.out for r, x in ran.items() if r != 0)


def test_a_rank_that_never_starts_is_named_after_the_timeout():
    ran = launch(4, timeout=12, absent=(2,))
    assert sorted(ran) == [0, 1, 3] and [r.code for r in ran.values()] == [1, 1, 1]
    table = ran[0].out
    assert "3 of 4 ranks answered" in table
    assert "FAIL  missing: rank 2 of 4 never answered within 12 s" in table
    assert rows(table)[2]["status"] == "MISSING" and rows(table)[2]["host"] == "?"
    assert max(r.seconds for r in ran.values()) < 12 + _STARTUP


def test_when_rank_0_never_starts_the_others_say_so():
    ran = launch(2, timeout=5, absent=(0,))
    assert ran[1].code == 1 and not ran[1].out
    assert "could not reach the store at 127.0.0.1" in ran[1].err
    assert "Rank 0 hosts it: it has not started" in ran[1].err
    assert "This rank: host node1, plugin cpu" in ran[1].err


# -------------------------------------------------------------------------------------------------- in-process


def test_without_a_launcher_it_says_how_to_run_it(monkeypatch, capsys):
    for name in _LAUNCH:
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor", "--world"]) == 2
    err = capsys.readouterr().err
    assert "no RANK and WORLD_SIZE" in err
    assert "torchrun --nproc-per-node 8 --no-python xccl doctor --world" in err


def test_a_world_without_master_port_says_what_is_missing(monkeypatch, capsys):
    for name in _LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["doctor", "--world", "--timeout", "1"]) == 2
    assert "MASTER_ADDR=(unset) MASTER_PORT=(unset)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def here() -> RankFacts:
    env = clean_env(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    return gather(collect(env), env, 0, 4, 0)


def world(here: RankFacts, size: int = 4) -> list[RankFacts]:
    return [dataclasses.replace(here, rank=r, local_rank=r % 2, host=f"node{r // 2}", pid=100 + r)
            for r in range(size)]


def test_this_nodes_facts(here):
    assert here.torch == torch.__version__ and here.plugin == "cpu" and here.mode == "native"
    assert here.plugin_dist.startswith("xccl ") and here.device == "cpu" and not here.problems
    assert here.env["MASTER_PORT"] == "29500"
    assert RankFacts.from_dict(json.loads(json.dumps(here.to_dict()))) == here


def test_a_torch_version_that_differs_between_hosts_is_flagged(here):
    ranks = world(here)
    ranks[2:] = [dataclasses.replace(f, torch="2.12.1+cpu") for f in ranks[2:]]
    verdict = compare(ranks, timeout=5)
    assert not verdict.ok and verdict.missing == ()
    (diff,) = [d for d in verdict.differences if d.what == "torch"]
    assert diff.status == "fail"
    assert str(diff) == f"{here.torch!r} on host node0 (ranks 0-1); '2.12.1+cpu' on host node1 (ranks 2-3)"
    assert verdict.to_dict()["differences"][0]["values"] == {here.torch: {"node0": [0, 1]}, "2.12.1+cpu": {"node1": [2, 3]}}


def test_world_size_told_differently_widens_the_world_and_names_the_missing(here):
    ranks = world(here)
    ranks[3] = dataclasses.replace(ranks[3], world_size=6)
    verdict = compare(ranks, timeout=5)
    assert verdict.expected == 6 and verdict.missing == (4, 5)
    assert {d.what for d in verdict.differences if d.status == "fail"} == {"missing", "WORLD_SIZE"}


def test_a_doubled_rank_and_a_shared_device_are_flagged(here):
    ranks = [dataclasses.replace(f, device=f"npu:{f.local_rank}") for f in world(here)]
    ranks[1] = dataclasses.replace(ranks[1], local_rank=0, device="npu:0")  # LOCAL_RANK repeated on node0
    ranks[3] = dataclasses.replace(ranks[3], rank=2)  # RANK repeated on node1
    verdict = compare(ranks, timeout=5)
    assert verdict.missing == (3,)
    summaries = {d.what: str(d) for d in verdict.differences}
    assert summaries["shared device"] == "ranks 0-1 on host node0 would all drive npu:0: their LOCAL_RANKs repeat"
    assert summaries["duplicate rank"].startswith("rank 2 answered 2 times (host node1 pid 102, host node1 pid 103)")


def test_a_warning_alone_does_not_fail(here):
    ranks = world(here)
    ranks[3] = dataclasses.replace(ranks[3], python="3.10.0")
    verdict = compare(ranks, timeout=5)
    assert verdict.ok and [d.what for d in verdict.differences] == ["python"]


def test_facts_from_another_xccl_version_are_read_not_fatal():
    facts = RankFacts.from_dict({"rank": 1, "world_size": 2, "torch": "2.9.0", "something_new": [1, 2]})
    assert facts.rank == 1 and facts.torch == "2.9.0" and facts.plugin == "?" and facts.local_rank == -1


@pytest.mark.parametrize(("table", "rank", "entry"), [
    ("sophgo_template.json", 1, "nodes[0].devices[1]: device_id=1 rank=1"),
    ("hccl_v1.0.json", 1, "servers[1].devices[0]: server_id=node_1 device_id=0 rank_id=1"),
])
def test_each_rank_reports_its_rank_table_entry(table, rank, entry):
    env = clean_env(RANK_TABLE_FILE=str(DATA / table))
    facts = gather(collect(env), env, rank, 2, rank)
    assert facts.rank_table["entry"].startswith(entry) and facts.rank_table["world_size"] == "2"
    assert len(facts.rank_table["sha256"]) == 16


def test_rank_list():
    assert rank_list([3]) == "rank 3" and rank_list([5, 0, 1, 2]) == "ranks 0-2, 5"
