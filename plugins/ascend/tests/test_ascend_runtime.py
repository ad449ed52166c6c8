"""torch_npu's and HCCL's run time, simulated, and xccl's policy on it, on real rank processes.

Each behaviour is first reproduced by the simulation as the hardware would show it (``_vendor.py`` cites the
sources), then xccl's answer is checked:

* torch_npu 2.13 has no ``all_to_all_vc``: ``all_to_all_v`` runs emulated (a runtime probe refines the table);
* torch_npu's watchdog (TearDown by default) kills a process whose collective outlasts the group's timeout, and
  HCCL's own execution timeout ends a collective with EI0002: xccl keeps the watchdog above the execution timeout,
  chooses CleanUpOnly, and the failure reaches every rank as a typed error;
* HCCL connects a communicator at the group's first collective within HCCL_CONNECT_TIMEOUT: xccl connects the
  world at ``xccl.init`` and names the late rank on the other groups;
* code that tests ``get_backend() == "hccl"`` (torch_npu's ``_AllGatherBase.backward`` among it) takes the HCCL
  path on xccl's world;
* torch_npu's ``dist.gather`` bypasses xccl's dispatch, its ``dist.batch_isend_irecv`` does so only before CANN
  9.0 or off Atlas A2/A3 (``test_ascend_vendor_runtime``); ``xccl.gather`` / ``xccl.batch_isend_irecv`` never do.
"""

from __future__ import annotations

import os
import time
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.plugin import Collective, installed_patches
from xccl.testing import RankPool

#: torch_npu 2.13.0, the release these tests read (on torch 2.8 the simulation is 2.8.0's: test_ascend_releases.py).
SIM = {"XCCL_SIMULATE": "ascend", "XCCL_SIM_TORCH_NPU": "2.13.0"}
#: HCCL's execution timeout in the watchdog pools: short enough for a test, longer than the slow rank's delay.
EXEC = 3
WATCHDOG = {**SIM, "HCCL_EXEC_TIMEOUT": str(EXEC)}
#: HCCL_CONNECT_TIMEOUT within CANN's [120, 7200]; the simulated connect waits 2 s of it (XCCL_SIM_CONNECT_TIMEOUT).
CONNECT = {**SIM, "HCCL_CONNECT_TIMEOUT": "120", "XCCL_SIM_CONNECT_TIMEOUT": "2", "HCCL_EXEC_TIMEOUT": "8"}


def _planned(group: Any, op: Collective) -> bool:
    """Whether xccl's dispatch planned ``op`` on ``group`` (it does on the first call it sees)."""
    from xccl.collectives._groups import state_of

    return any(key[0] is op for key in state_of(group).plans)


# --------------------------------------------------------------------------------------------- all_to_all_vc


def body_all_to_all_v() -> dict[str, Any]:
    """all_to_all_v with a count matrix; what the table says and whether the native kernel ran."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    matrix = [[i + j + 1 for j in range(n)] for i in range(n)]  # rank i sends i+j+1 elements to rank j
    inp = torch.cat([torch.full((matrix[r][j],), float(10 * r + j)) for j in range(n)])
    out = torch.empty(sum(matrix[i][r] for i in range(n)))
    xccl.all_to_all_v(out, inp, matrix)
    want = torch.cat([torch.full((matrix[i][r],), float(10 * i + r)) for i in range(n)])
    entry = xccl.capabilities().entry(Collective.ALL_TO_ALL_V)
    return {"ok": torch.equal(out, want), "level": entry.level.value, "note": entry.note}


def test_all_to_all_v_runs_emulated_on_torch_npu_2_13(rank_pools: Any) -> None:
    """torch_npu 2.13.0 (the simulated default) exports no all_to_all_vc: the table says emulated, and it runs."""
    outs = rank_pools.get(2, env=SIM, fallback="emulate").run_ok(body_all_to_all_v)
    for o in outs:
        assert o["ok"], outs
        assert o["level"] == "emulated", o
        assert "all_to_all_vc" in o["note"] and "2.13.0" in o["note"], o["note"]


def test_all_to_all_v_runs_native_where_torch_npu_has_all_to_all_vc() -> None:
    """On a build that exports it (the development branch v2.12.0), the probe finds all_to_all_vc and the table
    says native."""
    with RankPool(2, {"fallback": "emulate"}, {**SIM, "XCCL_SIM_TORCH_NPU": "v2.12.0"}, start_method="forkserver") as pool:
        outs = pool.run_ok(body_all_to_all_v)
    assert all(o["ok"] and o["level"] == "native" for o in outs), outs


# ------------------------------------------------------------------------------------------------ watchdog


@pytest.fixture(scope="module")
def watchdog_pool() -> Any:
    """2 ranks, HCCL_EXEC_TIMEOUT=3, timeout=30 (forked: a killed pool restarts in a second)."""
    with RankPool(2, {"timeout": 30}, WATCHDOG, start_method="forkserver", start_timeout=60) as pool:
        yield pool


def body_slow_peer(delay: float) -> dict[str, Any]:
    """On a group created with timeout=2 s, rank 1 reaches an all_reduce ``delay`` seconds after rank 0."""
    from xccl.collectives._state import GROUPS, PROCESS
    from xccl.plugin import simulated_group_of

    g = xccl.new_group(timeout=2)
    xccl.all_reduce(torch.ones(1), group=g)  # connects the group and lines the ranks up
    if xccl.get_world().rank == 1:
        time.sleep(delay)
    t = torch.ones(4)
    xccl.all_reduce(t, group=g)
    w, settings, sim = xccl.get_world(), PROCESS.watchdog, simulated_group_of(g)
    return {"sum": t.tolist(), "timeout": w.timeout.total_seconds(),
            "collective_timeout": w.collective_timeout.total_seconds(),
            "group watchdog": None if sim is None else sim.simulated_runtime.settings.timeout,
            "mode": None if settings is None else settings.mode.name, "warned": sorted(GROUPS.warned)}


def test_a_slow_peer_below_the_execution_timeout_does_not_kill_the_process(watchdog_pool: RankPool) -> None:
    """A group with timeout=2 s, HCCL_EXEC_TIMEOUT=3, a rank 2.5 s late. torch_npu's TearDown watchdog would take
    rank 0 down at 2 s; xccl gives the watchdog HCCL_EXEC_TIMEOUT + 1800 s and chooses CleanUpOnly, so the
    collective completes, and World says what bounds collectives (the world's timeout=30 s is kept, above the
    floor, but HCCL's 3 s comes first)."""
    outs = watchdog_pool.run(body_slow_peer, 2.5, timeout=60)
    assert all(o.ok for o in outs), "\n".join(map(str, outs))
    for o in outs:
        v = o.value
        assert v["sum"] == [2.0] * 4
        assert round(v["group watchdog"]) == EXEC + 1800  # torch keeps timeouts in ms
        assert v["timeout"] == 30 and v["collective_timeout"] == EXEC
        assert v["mode"] == "CLEAN_UP_ONLY"
        assert ["timeout", "ascend"] in [list(k) for k in v["warned"]], v["warned"]


def body_hung_peer(delay: float) -> dict[str, str]:
    """On a fresh group with timeout=2 s, rank 1 arrives ``delay`` seconds late, beyond HCCL's execution timeout."""
    g = xccl.new_group(timeout=2)
    xccl.all_reduce(torch.ones(1), group=g)  # connected, so only the execution timeout is at stake
    if xccl.get_world().rank == 1:
        time.sleep(delay)
    try:
        xccl.all_reduce(torch.ones(4), group=g)
    except Exception as exc:  # what reaches Python is the point
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": "", "message": "completed"}


def test_a_peer_beyond_the_execution_timeout_gets_every_rank_a_typed_timeout(watchdog_pool: RankPool) -> None:
    """HCCL ends the collective after HCCL_EXEC_TIMEOUT with EI0002: xccl turns it into CollectiveTimeout naming
    the variable and its value; the late rank gets a typed error too; no process dies."""
    outs = watchdog_pool.run(body_hung_peer, EXEC + 1.5, timeout=60)
    assert all(o.ok for o in outs), "\n".join(map(str, outs))
    first, late = outs[0].value, outs[1].value
    assert first["type"] == "CollectiveTimeout", first
    assert f"HCCL_EXEC_TIMEOUT={EXEC} s" in first["message"] and "EI0002" in first["message"], first
    # The simulation's gloo closes the connection of a collective that timed out, so the late rank sees its peer
    # gone at once; HCCL's late rank would wait out its own execution timeout (EI0002, CollectiveTimeout).
    assert late["type"] in ("CollectiveTimeout", "PeerFailure"), late


# ------------------------------------------------------------------------------------------------ lazy connect


def body_late_first_collective(delay: float) -> list[float]:
    """Rank 1 reaches the world's first collective ``delay`` seconds late."""
    if xccl.get_world().rank == 1:
        time.sleep(delay)
    t = torch.ones(2)
    xccl.all_reduce(t)
    return t.tolist()


def test_a_rank_late_to_the_worlds_first_collective_is_not_a_connect_timeout() -> None:
    """A connect timeout of 2 s (simulated): a rank 3 s late to its first collective makes HCCL's connect fail on
    its peer.
    xccl connects the world at xccl.init, where every rank is, so the late rank is bounded by the execution
    timeout (8 s) instead, and the collective completes."""
    with RankPool(2, {}, CONNECT, start_method="forkserver") as pool:  # fresh: the world's first collective is ours
        outs = pool.run(body_late_first_collective, 3.0, timeout=60)
    assert all(o.ok and o.value == [2.0, 2.0] for o in outs), "\n".join(map(str, outs))


def body_late_on_third_party_group(delay: float) -> dict[str, str]:
    """A group created by torch.distributed (as DeviceMesh does) connects at its first collective; rank 1 is late."""
    g = dist.new_group([0, 1])
    if xccl.get_world().rank == 1:
        time.sleep(delay)
    try:
        dist.all_reduce(torch.ones(2), group=g)
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": "", "message": "completed"}


def test_a_rank_late_to_a_groups_first_collective_is_named() -> None:
    """Rank 0 gives up after HCCL_CONNECT_TIMEOUT with EI0006: a typed CollectiveTimeout naming the variable and
    the late rank; the late rank, whose peer gave up, gets one too."""
    with RankPool(2, {}, CONNECT, start_method="forkserver") as pool:
        outs = pool.run(body_late_on_third_party_group, 3.0, timeout=60)
    assert all(o.ok for o in outs), "\n".join(map(str, outs))
    first, late = outs[0].value, outs[1].value
    assert first["type"] == late["type"] == "CollectiveTimeout", outs
    assert "HCCL_CONNECT_TIMEOUT" in first["message"] and "rank(s) [1]" in first["message"], first
    assert "HCCL_CONNECT_TIMEOUT" in late["message"], late


# ------------------------------------------------------------------------------------------------ backend name


def body_backend_name() -> dict[str, Any]:
    """What code that branches on the backend name sees on xccl's world."""
    backend = dist.get_backend()
    sub = dist.new_group(backend=backend)
    return {
        "eq": backend == "hccl", "req": backend == "hccl", "ne": backend != "hccl", "in": backend in ("nccl", "hccl"),
        "HCCL": backend == dist.Backend.HCCL,  # type: ignore[attr-defined]  # registered by (simulated) torch_npu
        "name": str(backend), "gloo": backend == "gloo",
        "sub": type(sub).__name__, "sub_eq": dist.get_backend(sub) == "hccl",
        "device": "npu" if dist.get_backend() == "hccl" else "cpu",
    }


def test_code_that_tests_for_hccl_takes_the_hccl_path(rank_pools: Any) -> None:
    """dist.get_backend() compares equal to "hccl" on xccl's Ascend world (and its sub-groups), while it is still
    xccl's backend: str() is "xccl_hccl", a new_group on it is xccl's group."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_backend_name)
    for o in outs:
        assert o["eq"] and o["req"] and o["in"] and o["HCCL"] and not o["ne"] and not o["gloo"], o
        assert o["name"] == "xccl_hccl" and o["sub"] == "XcclProcessGroup" and o["sub_eq"], o
        assert o["device"] == "npu"


def body_all_gather_base_backward() -> list[float]:
    """torch.distributed.nn.functional._all_gather_base forward and backward (torch_npu's backward: its check)."""
    from torch.distributed.nn import functional as F

    w = xccl.get_world()
    x = torch.full((2,), float(w.rank + 1), requires_grad=True)
    out = F._all_gather_base(torch.empty(2 * w.world_size), x)
    (out * torch.arange(1.0, 2 * w.world_size + 1)).sum().backward()
    assert x.grad is not None
    return x.grad.tolist()


def test_all_gather_base_backward_passes_torch_npus_backend_check(rank_pools: Any) -> None:
    """torch_npu's _AllGatherBase.backward raises "Backend not supported!" unless the backend is nccl, xccl or
    hccl; on xccl's world it reduce-scatters the gradient."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_all_gather_base_backward)
    assert outs == [[2.0, 4.0], [6.0, 8.0]]


# ------------------------------------------------------------------------------------------ torch_npu's patches


def body_gather_paths() -> dict[str, Any]:
    """dist.gather / dist.batch_isend_irecv (torch_npu's) next to xccl.gather / xccl.batch_isend_irecv."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    report: dict[str, Any] = {"patched": dist.gather.__module__}
    g1, g2 = xccl.new_group(), xccl.new_group()
    out = [torch.empty(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), out, dst=0, group=g1)
    report["dist.gather"] = [t.tolist() for t in out] if out else None
    report["dist.gather planned"] = _planned(g1, Collective.GATHER)
    out = [torch.empty(2) for _ in range(n)] if r == 0 else None
    xccl.gather(torch.full((2,), float(r)), out, dst=0, group=g2)
    report["xccl.gather"] = [t.tolist() for t in out] if out else None
    report["xccl.gather planned"] = _planned(g2, Collective.GATHER)
    try:  # validation before any communication: a root outside the group, refused on every rank
        xccl.gather(torch.zeros(2), None, dst=n, group=g2)
    except xccl.InvalidArgument as exc:
        report["invalid"] = type(exc).__name__
    peer = (r + 1) % n
    recv = torch.empty(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(r)), peer, g1),
           dist.P2POp(dist.irecv, recv, (r - 1) % n, g1)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    report["dist.batch"] = (recv.tolist(), _planned(g1, Collective.SEND) or _planned(g1, Collective.RECV))
    ops = [xccl.P2POp(xccl.isend, torch.full((2,), float(r)), peer, g2),
           xccl.P2POp(xccl.irecv, recv, (r - 1) % n, g2)]
    for work in xccl.batch_isend_irecv(ops):
        work.wait()
    report["xccl.batch"] = (recv.tolist(), _planned(g2, Collective.SEND) and _planned(g2, Collective.RECV))
    return report


def test_torch_npus_gather_bypasses_xccl_and_xccls_does_not(rank_pools: Any) -> None:
    """With torch_npu's patches applied, dist.gather reaches the HCCL backend directly: correct values, but xccl's
    dispatch never sees it. dist.batch_isend_irecv, on the simulation's defaults (CANN 9.0, Atlas A2), runs torch's
    coalescing manager over the group's send/recv, xccl's dispatch (its other branch: test_ascend_vendor_runtime).
    xccl.gather and xccl.batch_isend_irecv go through it (planned, validated)."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_gather_paths)
    want = [[0.0, 0.0], [1.0, 1.0]]
    root, other = outs
    assert root["patched"] == "xccl_ascend._torch_npu_sim"
    assert root["dist.gather"] == want and root["xccl.gather"] == want
    assert not root["dist.gather planned"] and root["xccl.gather planned"]
    assert root["invalid"] == other["invalid"] == "InvalidArgument"
    assert root["dist.batch"] == ([1.0, 1.0], True) and root["xccl.batch"] == ([1.0, 1.0], True)
    assert other["dist.batch"] == ([0.0, 0.0], True) and other["xccl.batch"] == ([0.0, 0.0], True)


def test_the_simulated_import_patches_torch_distributed_and_shutdown_undoes_it(monkeypatch: Any) -> None:
    """The simulated runtime applies torch_npu's declared patches when it loads the SDK; shutdown restores
    torch's own functions."""
    import xccl_ascend

    monkeypatch.setenv("XCCL_SIM_TORCH_NPU", "2.13.0")
    from torch.distributed.nn import functional as F

    originals = (dist.gather, dist.batch_isend_irecv, F._AllGatherBase.backward)
    runtime = xccl_ascend.plugin.runtime(simulate=True)
    try:
        assert set(installed_patches("ascend")) == {p.target for p in xccl_ascend.plugin.vendor_runtime().patches}
        assert dist.gather is not originals[0] and dist.batch_isend_irecv is not originals[1]
        assert F._AllGatherBase.backward is not originals[2]
    finally:
        runtime.shutdown()
    assert (dist.gather, dist.batch_isend_irecv, F._AllGatherBase.backward) == originals
    assert installed_patches("ascend") == ()


# -------------------------------------------------------------------------------------- memory and doctor


def body_communicators() -> dict[str, Any]:
    """The communicators this rank holds before and after a new group's first collective, and doctor's lines."""
    from xccl.tools.cli.doctor_checks import collect

    g = dist.new_group()
    name = str(g.group_name)
    before = {c.group: c for c in xccl.runtime.communicators()}
    dist.all_reduce(torch.ones(1), group=g)
    after = {c.group: c for c in xccl.runtime.communicators()}
    lines = [f"{f.name}: {f.summary}" for f in collect(try_import=False).findings if f.section == "vendor runtime"]
    return {"world": (before["0"].kind, before["0"].connected, before["0"].memory_mb),
            "new": (before[name].connected, after[name].connected),
            "kinds": sorted({c.kind for c in after.values()}), "doctor": lines}


def test_every_group_holds_one_hccl_communicator_and_doctor_shows_them(rank_pools: Any) -> None:
    """One HCCL communicator per group (no host-side gloo group on Ascend), 2 x HCCL_BUFFSIZE each; the world's is
    connected at xccl.init, a new group's at its first collective; doctor lists them in a job."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_communicators)
    for o in outs:
        assert o["world"] == ("vendor", True, 400) and o["new"] == (False, True), o
        assert "host gloo" not in o["kinds"], o  # raw groups other tests made with vendor_group() may be listed
        assert any(line.startswith("group 0: vendor communicator (hccl) over ranks [0, 1]: connected, 400 MB")
                   for line in o["doctor"]), o["doctor"]
        assert any(line.startswith("device memory: ") for line in o["doctor"]), o["doctor"]


def _doctor(env: dict[str, str]) -> dict[str, Any]:
    from xccl.tools.cli.doctor_checks import collect

    with mock.patch.dict(os.environ, {"XCCL_SIM_TORCH_NPU": "2.13.0"}):
        return {f.name: f for f in collect(env, try_import=False).findings if f.section == "vendor runtime"}


def test_doctor_shows_the_watchdog_settings_xccl_will_apply() -> None:
    """Without a process: the mode xccl sets, what bounds a collective, the groups' timeout, memory, patches."""
    env = {"XCCL_SIMULATE": "ascend", "HCCL_EXEC_TIMEOUT": "3", "XCCL_TIMEOUT": "2"}
    found = _doctor(env)
    wd = found["watchdog"]
    assert wd.status == "ok" and "mode 2 (CLEAN_UP_ONLY; set by xccl.init" in wd.summary, wd
    assert "fails after 3 s (HCCL_EXEC_TIMEOUT=3 s); the process groups get 1803 s" in wd.summary, wd
    assert "HCCL_CONNECT_TIMEOUT=120 s" in found["connect"].summary
    assert "HCCL_BUFFSIZE=200 MB" in found["communicators"].summary
    assert "host-side gloo group per group: none" in found["communicators"].summary
    assert "xccl.gather and xccl.batch_isend_irecv" in found["patches"].summary
    teardown = _doctor({**env, "TORCH_HCCL_ASYNC_ERROR_HANDLING": "1"})["watchdog"]
    assert teardown.status == "warn" and "takes the whole process down" in teardown.fix
    assert _doctor({**env, "TORCH_HCCL_ASYNC_ERROR_HANDLING": "7"})["watchdog"].status == "fail"


@pytest.mark.parametrize(("text", "typed"), [
    ("EI0002: The wait execution of the Notify register times out.", "CollectiveTimeout"),
    ("EI0006: Getting socket times out.", "CollectiveTimeout"),
    ("SUSPECT REMOTE ERROR happened with workEnqueue.[ERROR] ... ERR00100", "PeerFailure"),
    ("FORCE STOP.[ERROR] ... ERR00100", "PeerFailure"),
    ("HCCL function error: something else", "RuntimeError"),
])
def test_hccl_messages_become_typed_errors(text: str, typed: str) -> None:
    """What the plugin declares of HCCL's messages (VendorRuntime.faults) decides the typed error; others pass."""
    from types import SimpleNamespace

    import xccl_ascend

    from xccl.collectives._faults import translate

    ctx = SimpleNamespace(runtime=SimpleNamespace(plugin=xccl_ascend.plugin), ranks=(0, 1), rank=0, name="0",
                          group=None)
    assert type(translate(RuntimeError(text), ctx, "all_reduce", None)).__name__ == typed
