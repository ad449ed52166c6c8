"""The world check of ``xccl.init``: ranks told different worlds fail at init, on every rank, at once, and ranks
that never arrive are named.

Each test starts real rank processes on loopback, each with the environment torchrun would give it (some told
something else), running ``PROGRAM``: ``xccl.init`` and, when it succeeds, one all_reduce. Every process writes
what it saw as JSON. ``tests/test_multihost.py`` runs the same cases across namespaced hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from xccl.testing import free_port

#: xccl.init(timeout=...) of every rank.
TIMEOUT = 4.0

PROGRAM = r'''
import json, os, sys, time

OUT, TAG, TIMEOUT, PROCS, VICTIM = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])


def record(**kw):
    kw.update(tag=TAG, pid=os.getpid(), at=time.time(), init_at=started, check_at=checked.get("at"))
    with open(f"{OUT}/.{TAG}.tmp", "w") as f:
        json.dump(kw, f)
    os.replace(f"{OUT}/.{TAG}.tmp", f"{OUT}/{TAG}.json")


import torch  # noqa: E402

import xccl  # noqa: E402
from xccl.runtime import _rendezvous  # noqa: E402

checked = {}
real_check = _rendezvous.check_world


def timed_check(*args, **kwargs):
    checked["at"] = time.time()
    t0 = time.perf_counter()
    try:
        return real_check(*args, **kwargs)
    finally:
        checked["s"] = time.perf_counter() - t0


_rendezvous.check_world = timed_check
# Start init together: importing torch takes seconds, and more on a loaded machine.
open(f"{OUT}/ready-{TAG}", "w").close()
end = time.monotonic() + 120
while not os.path.exists(f"{OUT}/go") and time.monotonic() < end:
    time.sleep(0.01)
started = time.time()
try:
    world = xccl.init(timeout=TIMEOUT, setup_timeout=TIMEOUT)
except Exception as exc:
    record(ok=False, error_types=[c.__name__ for c in type(exc).__mro__], message=str(exc),
           took=time.time() - started, cause=type(exc.__cause__).__name__)
    sys.exit(3)
took = time.time() - started
x = torch.ones(2)
xccl.all_reduce(x)
if VICTIM >= 0:
    # A rank dies mid-run; the others are in all_reduce and must name it.
    t = torch.ones(1 << 12)
    try:
        for i in range(100000):
            if world.rank == VICTIM and i == 20:
                os._exit(9)
            xccl.all_reduce(t)
    except Exception as exc:
        record(ok=False, rank=world.rank, error_types=[c.__name__ for c in type(exc).__mro__], message=str(exc),
               took=took)
        sys.exit(3)
facts = {}
from xccl.collectives._state import PROCESS# noqa: E402

live = PROCESS.liveness
if live is not None:
    import datetime

    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore

    store = PrefixStore(live.prefix, dist.TCPStore(*live.store, is_master=False,
                                                   timeout=datetime.timedelta(seconds=10)))
    raw = store.multi_get([f"rank/{r}" for r in range(world.world_size)])
    facts = {r: json.loads(v) for r, v in enumerate(raw)}
xccl.barrier()
record(ok=True, rank=world.rank, sum=x.tolist(), took=took, check_s=checked.get("s"), facts=facts)
# Rank 0's process hosts the store: keep it up until every process has said what it saw (a rank started twice
# may come late).
end = time.monotonic() + 60
while time.monotonic() < end and len([f for f in os.listdir(OUT) if f.endswith(".json")]) < PROCS:
    time.sleep(0.05)
'''


def _launch(tmp_path: Path, ranks: Sequence[tuple[int, int, Mapping[str, str]]], victim: int = -1
            ) -> dict[str, dict[str, Any]]:
    """Start one process per ``(RANK, WORLD_SIZE, extra environment)``; wait for all; what each saw, by tag
    ``p<index>``. Rank ``victim`` (if any) exits in the middle of a loop of all_reduce."""
    prog = tmp_path / "world_check_program.py"
    prog.write_text(PROGRAM)
    port = str(free_port())
    keep = ("PATH", "HOME", "PYTHONPATH", "LANG", "TMPDIR")
    procs = []
    for i, (rank, size, extra) in enumerate(ranks):
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1", **extra)
        log = open(tmp_path / f"p{i}.log", "wb")  # noqa: SIM115 - closed once the process is reaped
        argv = [sys.executable, str(prog), str(tmp_path), f"p{i}", str(TIMEOUT), str(len(ranks)), str(victim)]
        procs.append((subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    for p, log in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        log.close()
    out = {}
    for i in range(len(ranks)):
        path = tmp_path / f"p{i}.json"
        out[f"p{i}"] = json.loads(path.read_text()) if path.exists() else {
            "ok": False, "error_types": ["no result"], "message": (tmp_path / f"p{i}.log").read_text()[-3000:]}
    return out


def _show(res: Mapping[str, Mapping[str, Any]]) -> str:
    return "\n".join(f"  {tag}: {'ok' if d.get('ok') else d['error_types'][0]} ({d.get('took', 0):.1f} s) "
                     f"{d.get('message', '')}" for tag, d in sorted(res.items()))


def test_ranks_that_agree_initialise_and_publish_their_facts(tmp_path):
    res = _launch(tmp_path, [(r, 4, {}) for r in range(4)])
    assert all(d["ok"] for d in res.values()), _show(res)
    assert all(d["sum"] == [4.0, 4.0] for d in res.values())
    # Every rank reads every rank's facts from the store: what `xccl doctor --world` and the fault path use.
    for d in res.values():
        facts = d["facts"]
        assert sorted(int(r) for r in facts) == [0, 1, 2, 3]
        assert all(f["rank"] == int(r) and f["world_size"] == 4 and f["plugin"] == "cpu" and f["port"] > 0
                   for r, f in facts.items()), facts
        assert {f["pid"] for f in facts.values()} == {x["pid"] for x in res.values()}
    checks = sorted(d["check_s"] for d in res.values())
    print(f"\nworld check of 4 ranks on loopback: {checks[0] * 1000:.1f} to {checks[-1] * 1000:.1f} ms per rank "
          f"(waiting for the last rank to arrive included); xccl.init {max(d['took'] for d in res.values()):.2f} s")


def _failed_at_init(res: Mapping[str, Mapping[str, Any]], kind: str, within: float) -> list[str]:
    """Every process raised ``kind`` in init, at most ``within`` s after the last one began the world check
    (what comes before it in init, the plugin's imports, is slow on a loaded machine and not the check's)."""
    problems = []
    last = max(d["check_at"] or d["init_at"] for d in res.values() if "init_at" in d)
    for tag, d in sorted(res.items()):
        if d.get("ok"):
            problems.append(f"{tag} initialised")
        elif kind not in d["error_types"]:
            problems.append(f"{tag} raised {d['error_types'][0]}, not {kind}")
        elif d["at"] - last > within:
            problems.append(f"{tag} raised {d['at'] - last:.1f} s after the last rank began the world check "
                            f"(> {within:g})")
    return problems


def test_ranks_told_different_world_sizes_fail_at_init_on_every_rank(tmp_path):
    res = _launch(tmp_path, [(0, 2, {}), (1, 3, {})])
    print("\n" + _show(res))
    problems = _failed_at_init(res, "InitError", 1.5)
    assert not problems, "\n".join(problems) + "\n" + _show(res)
    for d in res.values():
        assert "They differ in WORLD_SIZE: rank 0 on " in d["message"] and "has 2; rank 1 on " in d["message"], (
            d["message"])


@pytest.mark.parametrize(
    ("env", "field"),
    [({"XCCL_SIMULATE": "sophgo"}, "plugin"), ({"XCCL_CHECK": "1"}, "mismatch detector")],
    ids=["vendor", "check"],
)
def test_ranks_that_disagree_on_a_setting_fail_at_init_naming_it(tmp_path, env, field):
    res = _launch(tmp_path, [(0, 4, {}), (1, 4, {}), (2, 4, env), (3, 4, env)])
    problems = _failed_at_init(res, "InitError", 1.5)
    assert not problems, "\n".join(problems) + "\n" + _show(res)
    for d in res.values():
        assert f"{field} " in d["message"] and "ranks [0, 1]" in d["message"] and "ranks [2, 3]" in d["message"], (
            d["message"])


def test_ranks_that_never_arrive_are_named_by_every_rank(tmp_path):
    res = _launch(tmp_path, [(0, 4, {}), (1, 4, {}), (2, 4, {})])
    print("\n" + _show(res))
    problems = _failed_at_init(res, "RendezvousTimeout", TIMEOUT + 5)
    assert not problems, "\n".join(problems) + "\n" + _show(res)
    for d in res.values():
        assert "rank 3 (with 4 ranks per node: node 0) did not arrive; 3 of 4 did: ranks [0, 1, 2]" in d["message"], (
            d["message"])
        assert d["took"] >= TIMEOUT - 0.5 and d["cause"] == "DistStoreError", d


def test_a_rank_started_twice_is_refused_and_the_others_run(tmp_path):
    res = _launch(tmp_path, [(0, 2, {}), (1, 2, {}), (1, 2, {})])
    print("\n" + _show(res))
    refused = [d for d in res.values() if not d.get("ok")]
    assert len(refused) == 1 and "InitError" in refused[0]["error_types"], _show(res)
    assert "rank 1 was started twice" in refused[0]["message"] and refused[0]["took"] < TIMEOUT, refused
    ran = [d for d in res.values() if d.get("ok")]
    assert sorted(d["rank"] for d in ran) == [0, 1] and all(d["sum"] == [2.0, 2.0] for d in ran), _show(res)


@pytest.mark.parametrize("victim", [2, 0], ids=["rank2", "rank0-the-store"])
def test_peer_failure_names_the_rank_that_died(tmp_path, victim):
    """The facts published at init name the dead rank at the fault: by its liveness port, or, when it hosted the
    store (rank 0 without torchrun's agent), as the store's host."""
    res = _launch(tmp_path, [(r, 4, {}) for r in range(4)], victim=victim)
    print("\n" + _show(res))
    survivors = {d["rank"]: d for tag, d in res.items() if tag != f"p{victim}"}
    assert sorted(survivors) == [r for r in range(4) if r != victim], _show(res)
    for r, d in survivors.items():
        assert "PeerFailure" in d.get("error_types", []), (r, d)
        msg = d["message"]
        assert f"rank {victim} on " in msg and "is gone" in msg, msg
        if victim:
            # The store is up: survivors that already exited are known as such, so only the dead rank is named.
            assert "ranks [" not in msg, msg
