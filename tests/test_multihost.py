"""xccl across hosts: torchrun's multi-node rendezvous over a real network, with hosts that die, partition, lag,
or disagree about the world.

Each "host" is a network namespace with its own address and hostname (:mod:`netns`, tests/netns); the hosts
reach one another only over a test bridge, so gloo, torchrun's c10d rendezvous and xccl see the network as they
do between machines. Every rank runs ``PROGRAM`` through ``xccl.init(timeout=TIMEOUT)`` and writes what it saw
(result, typed error, when) as JSON; each test asserts what every rank saw, and how fast.

The default run has one short test (a 2x2 world: every collective, parallel groups); the rest are marked
``multihost`` and ``slow``: ``pytest -m multihost tests/test_multihost.py`` runs them (about 5 minutes on 2 CPUs),
``pytest tests/test_multihost.py -s`` runs everything and prints each scenario's timings. They need root (to
create namespaces) and are skipped, with the reason, without it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from netns import Hosts, Job

#: xccl.init(timeout=...) of every rank: the collective and rendezvous timeout.
TIMEOUT = 10.0
#: What the issue allows beyond the timeout for every rank to see a typed error.
GRACE = 5.0
NPROC = 2
TYPED = ("PeerFailure", "CollectiveTimeout")
LONG = [pytest.mark.multihost, pytest.mark.slow]

# The program every rank runs. argv[1] is the mode; every result is a JSON file in $XCCL_NETNS_OUT.
PROGRAM = r'''
import faulthandler
import json
import os
import socket
import sys
import time

OUT = os.environ["XCCL_NETNS_OUT"]
RANK = int(os.environ.get("RANK", "-1"))
TIMEOUT = float(os.environ["XCCL_NETNS_TIMEOUT"])
MODE = sys.argv[1]


def record(**kw):
    kw.setdefault("rank", RANK)
    kw.update(host=socket.gethostname(), addr=os.environ.get("XCCL_NETNS_ADDR"), pid=os.getpid(), mode=MODE,
              env_world_size=os.environ.get("WORLD_SIZE"))
    tmp = f"{OUT}/.rank-{kw['rank']}.tmp"
    with open(tmp, "w") as f:
        json.dump(kw, f)
    os.replace(tmp, f"{OUT}/rank-{kw['rank']}.json")


def mark(name):
    open(f"{OUT}/{name}-{RANK}", "w").close()


def wait_for(name, timeout=300.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(f"{OUT}/{name}"):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the test did not write {name} within {timeout:g} s")


def fault(exc):
    cause = exc.__cause__
    attrs = {k: getattr(exc, k, None) for k in ("rank", "op", "group", "elapsed", "world_size")}
    return {
        "ok": False,
        "error_types": [c.__name__ for c in type(exc).__mro__],
        "message": str(exc),
        "cause": f"{type(cause).__name__}: {cause}" if cause is not None else "",
        "at": time.time(),
        "attrs": {k: v for k, v in attrs.items() if isinstance(v, (int, float, str))},
    }


import warnings  # noqa: E402

import torch  # noqa: E402

import xccl  # noqa: E402

warnings.filterwarnings("ignore", category=xccl.EmulationWarning)  # the conformance batch emulates some ops on gloo
INIT_AT = time.time()
try:
    world = xccl.init(timeout=TIMEOUT, setup_timeout=TIMEOUT)
except Exception as exc:
    record(phase="init", init_at=INIT_AT, **fault(exc))
    sys.exit(3)
RANK = world.rank
INIT_S = time.time() - INIT_AT


def conformance():
    from xccl.testing._bodies import eager_batch

    started = time.time()
    reports = eager_batch()
    batch_s = time.time() - started
    failures = [f for r in reports.values() for f in r["failures"]]
    ran = sum(len(r["ran"]) for r in reports.values())
    pg = xccl.parallel_groups(tp=int(os.environ["LOCAL_WORLD_SIZE"]))
    groups = {}
    for g in pg:
        x = torch.tensor([float(RANK + 1)])
        xccl.all_reduce(x, group=g.group)
        groups[g.kind] = {"ranks": list(g.ranks), "rank": g.rank, "comm_name": g.comm_name, "sum": x.item(),
                          "want": float(sum(r + 1 for r in g.ranks))}
    hosts = [None] * world.world_size
    torch.distributed.all_gather_object(hosts, socket.gethostname())
    record(ok=not failures, failures=failures, ran=ran, batch_s=batch_s, init_s=INIT_S, groups=groups,
           world_comm_name=xccl.comm_name(), world_size=world.world_size, hosts=hosts,
           layout={k: [list(g) for g in v] for k, v in pg.layout.items()})


def mixed():
    from xccl.collectives._mixed import MixedGroup
    from xccl.collectives._groups import state_of
    from mixed_bodies import collectives  # tests/, on PYTHONPATH for this mode

    failures = collectives()
    pg = xccl.parallel_groups(tp=int(os.environ["LOCAL_WORLD_SIZE"]))
    groups = {}
    for g in pg:
        x = torch.tensor([float(RANK + 1)] * 4)
        torch.distributed.all_reduce(x, group=g.group)
        groups[g.kind] = {"ranks": list(g.ranks), "composed": isinstance(state_of(g.group), MixedGroup),
                          "sum": x[0].item(), "want": float(sum(r + 1 for r in g.ranks))}
    record(ok=not failures, failures=failures, plugin=world.plugin, groups=groups,
           islands=[[i.plugin, list(i.ranks)] for i in world.map.islands], hosts=list(world.map.hosts))


def loop():
    t = torch.ones(1 << 14)
    n = 0
    end = time.monotonic() + 120
    try:
        while time.monotonic() < end:
            t.fill_(1.0)
            xccl.all_reduce(t)
            if t[0].item() != world.world_size:
                raise AssertionError(f"all_reduce gave {t[0].item()}, not {world.world_size}")
            n += 1
            if n == 3:
                mark("ready")
                # The faults come now. A rank still looping when the timeout and a grace have passed is hung: its
                # stacks in the log say where (the test then reports "left no result" with the log).
                faulthandler.dump_traceback_later(TIMEOUT + 15, exit=False)
    except Exception as exc:
        record(iterations=n, **fault(exc))
        sys.exit(3)
    record(ok=True, iterations=n, message="no error within 120 s", at=time.time())


def shrink():
    """loop(), then survive: on the typed error, shrink the world to the survivors and run collectives on it."""
    t = torch.ones(1 << 14)
    n = 0
    try:
        while True:
            t.fill_(1.0)
            xccl.all_reduce(t)
            n += 1
            if n == 3:
                mark("ready")
                faulthandler.dump_traceback_later(TIMEOUT + 30, exit=False)
    except xccl.PeerFailure as exc:
        first = fault(exc)
        lost = list(exc.ranks)
    torch.distributed.shrink_group(lost)
    shrunk = time.time()
    sums = []
    for _ in range(3):
        t.fill_(1.0)
        xccl.all_reduce(t)
        sums.append(t[0].item())
    w = xccl.get_world()
    record(ok=True, iterations=n, lost=lost, first=first, at=first["at"], shrunk=shrunk, step=time.time(), sums=sums,
           new_rank=w.rank, new_size=w.world_size, dist_rank=torch.distributed.get_rank(), message="")


def timed(fn, reps):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - started)
    ts.sort()
    return {"median_ms": 1000 * ts[len(ts) // 2], "min_ms": 1000 * ts[0], "max_ms": 1000 * ts[-1], "reps": reps}


def slow():
    from xccl.testing._bodies import eager_batch

    phases = sys.argv[2:]
    small, big = torch.ones(256), torch.ones(1 << 18)
    wrong, res = [], {}
    for phase in phases:
        wait_for(f"go-{phase}")
        xccl.barrier()

        def ar(t, phase=phase):
            t.fill_(1.0)
            xccl.all_reduce(t)
            if not bool((t == world.world_size).all()):
                wrong.append(f"{phase}: all_reduce of ones gave {t.unique().tolist()}")

        res[phase] = {"all_reduce 1 KiB": timed(lambda: ar(small), 30), "all_reduce 1 MiB": timed(lambda: ar(big), 5)}
        if phase == phases[-1]:
            started = time.time()
            reports = eager_batch()
            res[phase]["every collective (conformance batch) s"] = time.time() - started
            wrong += [f for r in reports.values() for f in r["failures"]]
        mark(f"done-{phase}")
    record(ok=not wrong, failures=wrong, timings=res)


def first_collective():
    x = torch.ones(1)
    try:
        xccl.all_reduce(x)
    except Exception as exc:
        record(phase="first collective", init_at=INIT_AT, init_s=INIT_S, **fault(exc))
        sys.exit(3)
    record(ok=True, init_at=INIT_AT, init_s=INIT_S, at=time.time(), sum=x.item())


{"conformance": conformance, "loop": loop, "slow": slow, "init": first_collective, "mixed": mixed, "shrink": shrink}[MODE]()
'''


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "multihost_program.py"
    path.write_text(PROGRAM)
    return path


ENV = {"XCCL_NETNS_TIMEOUT": f"{TIMEOUT:g}"}
#: The mixed mode imports tests/mixed_bodies.py.
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)}


# ---------------------------------------------------------------------------------------------- helpers


def _gone_at(pids: dict[int, int], since: float, timeout: float) -> dict[int, float | None]:
    """rank -> seconds after ``since`` at which its process ``pids[rank]`` was seen gone (None: still there)."""
    seen: dict[int, float | None] = dict.fromkeys(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(v is None for v in seen.values()):
        for rank, pid in pids.items():
            if seen[rank] is None and not _running(pid):
                seen[rank] = time.time() - since
        time.sleep(0.05)
    return seen


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _show(res: dict[int, dict[str, Any]], ref: float | None = None, what: str = "") -> str:
    lines = []
    for r, d in sorted(res.items()):
        if d.get("ok"):
            lines.append(f"  rank {r} on {d.get('host')}: ok")
            continue
        when = f" {d['at'] - ref:+.2f} s after {what}" if ref is not None and "at" in d else ""
        kind = (d.get("error_types") or ["?"])[0]
        lines.append(f"  rank {r} on {d.get('host')}:{when} {kind}: {d.get('message', '')}")
    return "\n".join(lines)


#: "rank 4", "ranks 4 and 5", "ranks [4, 5]", "ranks 4-5": the numbers of each such phrase.
_RANK_PHRASE = re.compile(r"\branks?\s*[\[(]?\s*(\d+(?:\s*(?:,|and|-|to)\s*\d+)*)")


def _names(message: str, ranks: list[int], *, every: bool = False) -> bool:
    """Whether ``message`` names one (``every``: each) of ``ranks`` in a phrase that names only such ranks.

    A phrase listing other ranks too (``"a peer of ranks [0, 1, 2, 3]"``: the whole group) names none of them.
    """
    target = set(ranks)
    named: set[int] = set()
    for phrase in _RANK_PHRASE.findall(message):
        nums = {int(x) for x in re.findall(r"\d+", phrase)}
        if nums and nums <= target:
            named |= nums
    return named == target if every else bool(named)


#: A clause of a PeerFailure that declares ranks gone or lost: "ranks [2, 3] on host1 (10.0.0.11) are gone".
_LOST_CLAUSE = re.compile(r"(?:^|[:;] )([^:;]*?) (?:is|are) (?:gone|lost)\b")


def _declared_lost(message: str) -> set[int]:
    """The ranks a PeerFailure message declares gone or lost."""
    out: set[int] = set()
    for clause in _LOST_CLAUSE.findall(message):
        for one, many in re.findall(r"\brank (\d+)|\branks \[([\d, ]+)\]", clause):
            out |= {int(one)} if one else {int(x) for x in many.split(",")}
    return out


# ---------------------------------------------------------------------------------------------- the world


def _check_world(job: Job, hosts: Hosts, n: int, codes: list[int | None]) -> dict[str, Any]:
    res = job.results()
    world = n * NPROC
    assert sorted(res) == list(range(world)), f"results from ranks {sorted(res)}; exit codes {codes}\n{job.log()}"
    failures = {r: d["failures"] for r, d in res.items() if d["failures"]}
    assert not failures, f"collectives that went wrong across {n} hosts: {failures}"
    assert all(d["ran"] == res[0]["ran"] > 100 for d in res.values()), {r: d["ran"] for r, d in res.items()}
    # Every rank is where torchrun put it: node r holds global ranks [r*NPROC, (r+1)*NPROC), one hostname per node.
    host_of = res[0]["hosts"]
    assert all(d["hosts"] == host_of for d in res.values())
    assert len(set(host_of)) == n and all(res[r]["host"] == host_of[r] for r in res)
    # TP inside a host, DP across hosts; every group's members agree on its comm name and reduce right.
    for kind in ("tp", "pp", "dp"):
        for ranks in res[0]["layout"][kind]:
            names = {res[r]["groups"][kind]["comm_name"] for r in ranks}
            assert len(names) == 1, f"{kind} group {ranks}: comm names differ across ranks: {names}"
            for r in ranks:
                g = res[r]["groups"][kind]
                assert g["ranks"] == ranks and g["sum"] == g["want"], (kind, r, g)
        places = [{host_of[r] for r in ranks} for ranks in res[0]["layout"][kind]]
        if kind == "tp":
            assert all(len(p) == 1 for p in places), f"a TP group spans hosts: {places}"
        if kind == "dp":
            assert all(len(p) == n for p in places), f"a DP group does not span every host: {places}"
    names = {d["world_comm_name"] for d in res.values()}
    assert len(names) == 1, names
    assert codes == [0] * n, f"every result was right, but torchrun's exit codes are {codes}:\n{job.log()}"
    return res


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=LONG)], ids=["2x2", "3x2"])
def test_every_collective_and_parallel_groups_across_hosts(make_hosts, program, n):
    hosts = make_hosts(n)
    started = time.time()
    job = hosts.run_torchrun(program, nproc=NPROC, args=["conformance"], env=ENV)
    codes = job.wait(timeout=240)
    res = _check_world(job, hosts, n, codes)
    d = res[0]
    print(f"\n{n}x{NPROC} world over {hosts.subnet}.0/24: {d['ran']} collective calls per rank right, "
          f"xccl.init {max(r['init_s'] for r in res.values()):.1f} s, conformance batch {d['batch_s']:.1f} s, "
          f"job {time.time() - started:.1f} s; tp {d['layout']['tp']} dp {d['layout']['dp']}, "
          f"comm names {[res[r]['groups']['dp']['comm_name'] for r in sorted(res)]} (dp)")


# ---------------------------------------------------------------------------------------------- host loss


@pytest.mark.parametrize(
    ("n", "victim", "launch"),
    [pytest.param(2, 1, "torchrun", marks=LONG), pytest.param(2, 0, "ranks", marks=LONG),
     pytest.param(2, 0, "torchrun", marks=LONG), pytest.param(3, 1, "torchrun", marks=LONG)],
    ids=["2x2-lose-host1", "2x2-lose-host0-the-store", "2x2-lose-host0-the-store-under-torchrun", "3x2-lose-host1"],
)
def test_host_loss_gives_every_survivor_peer_failure_naming_the_lost_host(make_hosts, program, n, victim, launch):
    hosts = make_hosts(n)
    # "ranks": no agent, the store in rank 0's process (xccl's own rendezvous); "torchrun": the store in node 0's
    # agent, and an agent on every host that watches it.
    start = hosts.run_torchrun if launch == "torchrun" else hosts.run_ranks
    job = start(program, nproc=NPROC, args=["loop"], env=ENV)
    ready = job.wait_files("ready-*", n * NPROC, timeout=180)
    assert len(ready) == n * NPROC, f"only {len(ready)} ranks started\n{job.log()}"
    lost = list(range(victim * NPROC, (victim + 1) * NPROC))
    killed = hosts.kill_host(victim)
    survivors = [r for r in range(n * NPROC) if r not in lost]
    job.wait_files("rank-*.json", len(survivors), timeout=TIMEOUT + GRACE + 10)
    res = job.results()
    gone = _gone_at({r: res[r]["pid"] for r in survivors if r in res}, killed, TIMEOUT + GRACE + 30)
    exits = job.wait_exit(timeout=TIMEOUT + 60)
    codes = job.wait(timeout=10)
    # Under torchrun, when node 0 (whose agent hosts the store) goes, every other agent stops its workers within
    # its monitor interval (0.2 s here, 0.1 s by default): a worker may be stopped before it sees the fault.
    stopped = [r for r in survivors if r not in res and launch == "torchrun" and victim == 0
               and "RendezvousConnectionError" in _host_log(job, r // NPROC)]
    report = (f"host {victim} (ranks {lost}) killed ({launch}); what each survivor saw:\n"
              f"{_show(res, killed, 'the kill')}\n"
              + (f"  ranks {stopped}: stopped by their torchrun agent, which lost the store, before reporting\n"
                 if stopped else "")
              + f"  survivors' processes gone (s after the kill): {gone}\n"
              f"  {launch} processes' exit codes {codes}, exited (s after the kill): "
              f"{ {job.procs[i][0]: round(t - killed, 2) for i, t in exits.items()} }")
    print("\n" + report)
    problems = []
    for r in survivors:
        d = res.get(r)
        if d is None:
            if r not in stopped:
                problems.append(f"rank {r} left no result (and its agent did not say it lost the store)")
            continue
        if "PeerFailure" not in d.get("error_types", []):
            problems.append(f"rank {r} saw {(d.get('error_types') or ['no error'])[0]}, not PeerFailure")
        elif d["at"] - killed > TIMEOUT + GRACE:
            problems.append(f"rank {r} saw PeerFailure {d['at'] - killed:.1f} s after the kill (> {TIMEOUT + GRACE})")
        if gone.get(r) is None:
            problems.append(f"rank {r}'s process did not exit")
    for i, (host, _) in enumerate(job.procs):
        if host != victim and i not in exits:
            problems.append(f"a {launch} process of host {host} did not exit")
    assert not problems, "\n".join(problems) + "\n" + report
    # The message says which host went: its ranks by number, declared gone or lost, and no other rank so.
    declared = {r: _declared_lost(res[r]["message"]) for r in survivors if r in res}
    wrong = {r: sorted(d) for r, d in declared.items() if not d or not d <= set(lost)}
    assert not wrong, (f"PeerFailure does not declare (only) ranks of the lost host {victim} (ranks {lost}) lost: "
                       f"{wrong}\n{report}")
    last = max((res[r]["at"] - killed for r in declared), default=float("nan"))
    print(f"  ranks declared lost by each survivor: { {r: sorted(d) for r, d in declared.items()} }; last "
          f"survivor's PeerFailure {last:.2f} s after the kill")


@pytest.mark.multihost
def test_survivors_of_a_lost_host_shrink_the_world_and_go_on(make_hosts, program):
    """2 hosts x 2 ranks, plain processes (no agent to stop the survivors), the store in rank 0's process: host 1 is
    killed; ranks 0 and 1 get PeerFailure naming ranks [2, 3], call dist.shrink_group with them, and run on the world
    of 2 within the timeout + 5 s of the kill."""
    hosts = make_hosts(2)
    job = hosts.run_ranks(program, nproc=NPROC, args=["shrink"], env=ENV)
    ready = job.wait_files("ready-*", 2 * NPROC, timeout=180)
    assert len(ready) == 2 * NPROC, f"only {len(ready)} ranks started\n{job.log()}"
    killed = hosts.kill_host(1)
    job.wait_files("rank-*.json", NPROC, timeout=TIMEOUT + GRACE + 60)
    res = job.results()
    job.wait(timeout=TIMEOUT + 30)
    for r in range(NPROC):
        d = res.get(r)
        assert d is not None and d.get("ok"), f"rank {r}: {d}\n{job.log()}"
        assert d["lost"] == [2, 3] and d["new_rank"] == r == d["dist_rank"] and d["new_size"] == NPROC, d
        assert d["sums"] == [float(NPROC)] * 3, d
        assert d["step"] - killed < TIMEOUT + GRACE, f"rank {r} ran on the shrunk world {d['step'] - killed:.1f} s after"
    took = {r: (round(res[r]["at"] - killed, 2), round(res[r]["step"] - killed, 2)) for r in range(NPROC)}
    print(f"\nhost 1 killed: (PeerFailure, first collective on the shrunk world) s after the kill per rank: {took}")


def _host_log(job: Job, host: int) -> str:
    return "".join(path.read_text(errors="replace") for (h, _), path in zip(job.procs, job.logs, strict=True)
                   if h == host)


# ---------------------------------------------------------------------------------------------- partition


@pytest.mark.parametrize(
    ("n", "cut"),
    [pytest.param(2, 1, marks=LONG), pytest.param(3, 0, marks=LONG)],
    ids=["2x2-cut-host1", "3x2-cut-host0-the-store"],
)
def test_partition_gives_every_rank_a_typed_error_within_the_timeout(make_hosts, program, n, cut):
    hosts = make_hosts(n)
    job = hosts.run_torchrun(program, nproc=NPROC, args=["loop"], env=ENV)
    ready = job.wait_files("ready-*", n * NPROC, timeout=180)
    assert len(ready) == n * NPROC, f"only {len(ready)} ranks started\n{job.log()}"
    down = hosts.link_down(cut)  # mid-collective: every rank is looping all_reduce
    job.wait_files("rank-*.json", n * NPROC, timeout=TIMEOUT + GRACE + 10)
    res = job.results()
    gone = _gone_at({r: d["pid"] for r, d in res.items()}, down, TIMEOUT + 30)
    agents = job.wait_exit(timeout=15)
    report = (f"host {cut}'s link down; what each rank saw:\n{_show(res, down, 'link down')}\n"
              f"  ranks' processes gone (s after link down): {gone}\n"
              f"  torchrun agents exited (s after link down): "
              f"{ {job.procs[i][0]: round(t - down, 2) for i, t in agents.items()} }; the others were still "
              "waiting on the rendezvous store and were killed at teardown")
    print("\n" + report)
    problems = []
    for r in range(n * NPROC):
        d = res.get(r)
        if d is None:
            problems.append(f"rank {r} left no result")
        elif not set(TYPED) & set(d.get("error_types", [])):
            problems.append(f"rank {r} saw {(d.get('error_types') or ['no error'])[0]}, not {' or '.join(TYPED)}")
        elif d["at"] - down > TIMEOUT + GRACE:
            problems.append(f"rank {r} saw {d['error_types'][0]} {d['at'] - down:.1f} s after link down")
        if gone.get(r) is None:
            problems.append(f"rank {r}'s process did not exit")
    assert not problems, "\n".join(problems) + "\n" + report + "\n" + job.log()


# ---------------------------------------------------------------------------------------------- slow host


@pytest.mark.multihost
@pytest.mark.slow
def test_slow_host_gives_right_results_and_the_slowdown(make_hosts, program):
    delay_ms = 50.0
    hosts = make_hosts(2)
    job = hosts.run_torchrun(program, nproc=NPROC, args=["slow", "direct", "path", "delayed"], env=ENV)
    (job.out / "go-direct").touch()
    assert len(job.wait_files("done-direct-*", 2 * NPROC, timeout=180)) == 2 * NPROC, job.log()
    # A phase with the delay at 0 ms first: it separates the cost of the path (the relay's, where the kernel has no
    # netem) from the delay's.
    how = hosts.delay(1, 0.0)
    (job.out / "go-path").touch()
    assert len(job.wait_files("done-path-*", 2 * NPROC, timeout=120)) == 2 * NPROC, job.log()
    hosts.delay(1, delay_ms)
    (job.out / "go-delayed").touch()
    assert len(job.wait_files("done-delayed-*", 2 * NPROC, timeout=400)) == 2 * NPROC, job.log()
    codes = job.wait(timeout=60)
    res = job.results()
    assert sorted(res) == list(range(2 * NPROC)), f"results from ranks {sorted(res)}; exit codes {codes}\n{job.log()}"
    wrong = {r: d["failures"] for r, d in res.items() if d["failures"]}
    assert not wrong, f"results went wrong with {delay_ms:g} ms on host 1: {wrong}"
    lines = [f"host 1 egress delayed {delay_ms:g} ms ({how}); medians over ranks of each rank's median:"]
    slowdown = {}
    for what in ("all_reduce 1 KiB", "all_reduce 1 MiB"):
        med = {p: sorted(d["timings"][p][what]["median_ms"] for d in res.values())[NPROC] for p in
               ("direct", "path", "delayed")}
        slowdown[what] = med["delayed"] / med["direct"]
        lines.append(f"  {what}: direct {med['direct']:.1f} ms, through the {how} at 0 ms {med['path']:.1f} ms, "
                     f"{delay_ms:g} ms delay {med['delayed']:.1f} ms: x{slowdown[what]:.1f}")
    batch = res[0]["timings"]["delayed"]["every collective (conformance batch) s"]
    lines.append(f"  every collective (conformance batch, {delay_ms:g} ms delay): {batch:.1f} s, all right")
    print("\n" + "\n".join(lines))
    # A 1 KiB all_reduce waits for host 1 at least once per step: the delay must show.
    assert slowdown["all_reduce 1 KiB"] > 2, "\n".join(lines)
    assert codes == [0, 0], f"every result was right, but torchrun's exit codes are {codes}:\n{job.log()}"


# ---------------------------------------------------------------------------------------------- rendezvous


def _init_errors(res: dict[int, dict[str, Any]], ranks: list[int], kind: str) -> list[str]:
    problems = []
    for r in ranks:
        d = res.get(r)
        if d is None:
            problems.append(f"rank {r} left no result")
            continue
        if d.get("ok"):
            problems.append(f"rank {r} initialised and ran a collective")
            continue
        if d.get("phase") != "init":
            problems.append(f"rank {r} failed at the {d.get('phase')}, not at init")
        if kind not in d.get("error_types", []):
            problems.append(f"rank {r} raised {d['error_types'][0]}, not {kind}")
        if d["at"] - d["init_at"] > TIMEOUT + GRACE:
            problems.append(f"rank {r} raised {d['at'] - d['init_at']:.1f} s after calling init "
                            f"(> {TIMEOUT + GRACE:g})")
    return problems


def _init_report(res: dict[int, dict[str, Any]]) -> str:
    lines = []
    for r, d in sorted(res.items()):
        took = f"{d['at'] - d['init_at']:.1f} s after init was called" if "init_at" in d and "at" in d else ""
        kind = "ok" if d.get("ok") else (d.get("error_types") or ["?"])[0]
        lines.append(f"  rank {r} on {d['host']} (WORLD_SIZE={d.get('env_world_size')}): {d.get('phase', '')} "
                     f"{took}: {kind}: {d.get('message', '')}")
    return "\n".join(lines)


@pytest.mark.multihost
@pytest.mark.slow
def test_missing_host_under_torchrun_c10d_never_starts_the_program(make_hosts, program):
    """What torchrun does itself: its c10d rendezvous waits for --nnodes and gives up; no rank ever starts."""
    hosts = make_hosts(3)
    job = hosts.run_torchrun(program, nproc=NPROC, hosts=[0, 1], args=["init"], env=ENV, rdzv_timeout=15)
    codes = job.wait(timeout=120)
    log = job.log()
    raised = sorted(set(re.findall(r"torch\.distributed\.elastic\.rendezvous\.api\.(Rendezvous\w+)", log)))
    print(f"\ntorchrun --nnodes 3 with hosts 0 and 1 only: agents exit {codes}, raising {raised}; no rank started")
    assert codes == [1, 1], log
    assert not job.results(), "a rank started although the rendezvous never completed"
    assert "RendezvousClosedError" in log or "RendezvousTimeoutError" in log, log


@pytest.mark.multihost
@pytest.mark.slow
def test_missing_host_gives_rendezvous_timeout_naming_the_missing_ranks(make_hosts, program):
    # Ranks started with torchrun's environment and no agent (torchrun's own rendezvous would wait instead, see
    # the test above): host 2 (ranks 4, 5) never arrives, so xccl.init's rendezvous is what waits.
    hosts = make_hosts(3)
    job = hosts.run_ranks(program, nproc=NPROC, hosts=[0, 1], args=["init"], env=ENV)
    codes = job.wait(timeout=TIMEOUT + 90)
    res = job.results()
    report = "host 2 (ranks 4, 5) never started; what each rank saw:\n" + _init_report(res)
    print("\n" + report)
    problems = _init_errors(res, [0, 1, 2, 3], "RendezvousTimeout")
    problems += [f"rank {r}'s message does not name the missing ranks 4 and 5 or host 2"
                 for r, d in res.items() if not d.get("ok") and not _names_missing(d["message"], [4, 5], hosts[2])]
    assert codes == [3] * 4 and not problems, "\n".join(problems) + "\n" + report


def _names_missing(message: str, ranks: list[int], host: Any) -> bool:
    return host.hostname in message or host.addr in message or _names(message, ranks, every=True)


@pytest.mark.multihost
@pytest.mark.slow
def test_hosts_that_disagree_on_world_size_fail_at_init_on_every_rank(make_hosts, program):
    # Host 1's ranks are told WORLD_SIZE=6 (a launch script with the wrong node count), host 0's ranks 4.
    hosts = make_hosts(2)
    job = hosts.run_ranks(program, nproc=NPROC, args=["init"], env=ENV, host_env={1: {"WORLD_SIZE": "6"}})
    codes = job.wait(timeout=TIMEOUT + 90)
    res = job.results()
    report = f"host 0 (ranks 0, 1) says WORLD_SIZE=4, host 1 (ranks 2, 3) says 6; exit codes {codes}; what each rank saw:\n"
    report += _init_report(res)
    print("\n" + report)
    problems = _init_errors(res, [0, 1, 2, 3], "InitError")
    problems += _disagreement_named(res, hosts, ("WORLD_SIZE",))
    assert not problems, "\n".join(problems) + "\n" + report


@pytest.mark.multihost
@pytest.mark.slow
def test_hosts_that_disagree_on_the_vendor_fail_at_init_on_every_rank(make_hosts, program):
    # Under torchrun's c10d rendezvous; host 1 has XCCL_SIMULATE=sophgo in its environment, host 0 runs cpu.
    hosts = make_hosts(2)
    job = hosts.run_torchrun(program, nproc=NPROC, args=["init"], env=ENV, host_env={1: {"XCCL_SIMULATE": "sophgo"}})
    codes = job.wait(timeout=TIMEOUT + 90)
    res = job.results()
    report = f"host 0 runs plugin cpu, host 1 sophgo (simulated); agents exit {codes}; what each rank saw:\n"
    report += _init_report(res)
    print("\n" + report)
    problems = _init_errors(res, [0, 1, 2, 3], "InitError")
    problems += _disagreement_named(res, hosts, ("vendor", "plugin"))
    assert not problems, "\n".join(problems) + "\n" + report


def _disagreement_named(res: dict[int, dict[str, Any]], hosts: Hosts, words: tuple[str, ...]) -> list[str]:
    """Each failed rank's message says what differs (one of ``words``) and names the other host or its ranks."""
    problems = []
    for r, d in res.items():
        if d.get("ok"):
            continue
        msg = d.get("message", "")
        if not any(w.lower() in msg.lower() for w in words):
            problems.append(f"rank {r}'s message does not say {' or '.join(words)}: {_first_line(msg)}")
        other = 1 - r // NPROC
        theirs = list(range(other * NPROC, (other + 1) * NPROC))
        if not (hosts[other].hostname in msg or hosts[other].addr in msg or _names(msg, theirs)):
            problems.append(f"rank {r}'s message names neither host {other} nor its ranks {theirs}")
    return problems


@pytest.mark.multihost
@pytest.mark.slow
def test_one_vendor_per_host_is_a_mixed_world_with_tp_inside_and_dp_across(make_hosts, program):
    # docs/mixed.md: host 0 simulates Ascend, host 1 Sophgo; every collective on the world across the islands, and
    # parallel_groups puts TP inside a host (one island: the vendor's group) and DP across (a mixed group).
    hosts = make_hosts(2)
    job = hosts.run_torchrun(program, nproc=NPROC, args=["mixed"], env={**ENV, "XCCL_HETEROGENEOUS": "1", **TESTS_ON_PATH},
                             host_env={0: {"XCCL_SIMULATE": "ascend"}, 1: {"XCCL_SIMULATE": "sophgo"}})
    codes = job.wait(timeout=240)
    res = job.results()
    assert sorted(res) == [0, 1, 2, 3], job.log()
    for r, d in res.items():
        assert d.get("ok"), (r, d, job.log())
        assert d["plugin"] == ("ascend" if r < NPROC else "sophgo")
        assert d["islands"] == [["ascend", [0, 1]], ["sophgo", [2, 3]]]
        assert d["hosts"] == [hosts[0].hostname] * 2 + [hosts[1].hostname] * 2
        assert d["groups"]["tp"]["composed"] is False and d["groups"]["dp"]["composed"] is True
        assert all(g["sum"] == g["want"] for g in d["groups"].values()), d["groups"]
    assert codes == [0, 0], job.log()


def test_program_modes_are_known() -> None:
    # Guards PROGRAM's dispatch table against a renamed mode (every test above passes one).
    table = re.search(r"\{(\"conformance\".*?)\}\[MODE\]", PROGRAM)
    assert table is not None
    assert set(re.findall(r'"(\w+)":', table.group(1))) == {"conformance", "loop", "slow", "init", "mixed", "shrink"}
    json.dumps(ENV)
