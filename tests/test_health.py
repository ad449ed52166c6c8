"""The health watch (``xccl.collectives._health._watch``): every survivor names a lost rank within about a second, at a
production collective timeout (300 s), on cpu and on both simulated vendors, in plain calls and under DDP and FSDP2.

Four plain processes (a :class:`~xccl.testing.RankPool`); rank 1 (not the last) is SIGKILLed from a second thread
while the others are inside collectives. gloo tells only the survivors that were talking to rank 1; a survivor on
the far side of the ring hears nothing from the backend until the collective timeout. The control case turns the
watch off (``XCCL_HEALTH_DEADLINE=0``) and shows that far survivor still waiting after 6 s: what the watch fixes
is not something the backend does by itself. Each body bounds its own wait (``Work.wait(timeout)``), so nothing
depends on the 300 s timeout running out.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import xccl
from xccl.collectives._health import _ending
from xccl.collectives._health import _watch as _health
from xccl.collectives._hooks import OBSERVERS
from xccl.errors import InitError
from xccl.plugin import simulated_stream
from xccl.testing import RankPool

VICTIM = 1
BOUND = datetime.timedelta(seconds=6)  # each body's own bound on one wait: well past the watch, far below 300 s


def _die_later(path: str, after: float) -> None:
    def die() -> None:
        Path(path).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Timer(after, die).start()


def _report(exc: BaseException) -> dict[str, Any]:
    return {"at": time.time(), "type": type(exc).__name__, "ranks": list(getattr(exc, "ranks", ())),
            "message": str(exc), "cause": type(exc.__cause__).__name__ if exc.__cause__ else ""}


def body_calls(path: str) -> dict[str, Any]:
    """All ranks: all_reduce until an error, each wait bounded by BOUND; rank 1 dies from a timer."""
    t = torch.ones(1 << 10)
    xccl.all_reduce(t)
    if xccl.get_world().rank == VICTIM:
        _die_later(path, 0.5)
    try:
        while True:
            xccl.all_reduce(t, async_op=True).wait(BOUND)
    except Exception as exc:
        report = _report(exc)
    if os.environ.get(_health.ENV) != "0":  # with the watch: the next call raises at once, before it communicates
        started = time.monotonic()
        try:
            xccl.all_reduce(t, async_op=True).wait(BOUND)
        except Exception as exc:
            report["next"] = {**_report(exc), "took": time.monotonic() - started}
    return report


def body_train(stack: str, path: str) -> dict[str, Any]:
    """All ranks: DDP or FSDP2 steps until an error; rank 1 dies from a timer, mid-training."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    if stack == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (4,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    if xccl.get_world().rank == VICTIM:
        _die_later(path, 0.5)
    try:
        while True:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    except Exception as exc:
        return _report(exc)


def body_ddp(path: str) -> dict[str, Any]:
    return body_train("ddp", path)


def body_fsdp2(path: str) -> dict[str, Any]:
    return body_train("fsdp2", path)


def _lose_rank_1(tmp_path: Path, body: Any, init: dict[str, Any], env: dict[str, str] | None = None
                 ) -> list[dict[str, Any]]:
    path = tmp_path / "death"
    with RankPool(4, {"timeout": 300, **init}, env=env, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run(body, str(path), timeout=60)
    died = float(path.read_text())
    assert outs[VICTIM].raised("RankDied"), str(outs[VICTIM])
    reports = []
    for o in outs:
        if o.rank != VICTIM:
            assert o.ok, str(o)
            reports.append({**o.value, "rank": o.rank, "after": o.value["at"] - died})
    return reports


VENDORS = {"cpu": {}, "ascend": {"vendor": "ascend", "simulate": True}, "sophgo": {"vendor": "sophgo", "simulate": True}}


@pytest.mark.slow_cases("ddp-ascend", "ddp-sophgo", "fsdp2-sophgo", "fsdp2-ascend")
@pytest.mark.parametrize("vendor", list(VENDORS))
@pytest.mark.parametrize("body", [body_calls, body_ddp, body_fsdp2], ids=["calls", "ddp", "fsdp2"])
def test_every_survivor_names_the_lost_rank_within_a_second_at_a_300s_timeout(tmp_path, vendor, body):
    reports = _lose_rank_1(tmp_path, body, VENDORS[vendor])
    for r in reports:
        assert r["type"] == "PeerFailure" and r["ranks"] == [VICTIM], r
        # 1 s of deadline and a look of milliseconds; 2.5 s leaves a loaded machine its scheduling delays.
        assert r["after"] < 2.5, r
    if body is body_calls:
        for r in reports:
            nxt = r.get("next", {})
            assert nxt.get("type") == "PeerFailure" and nxt["ranks"] == [VICTIM] and nxt["took"] < 0.5, r
    watched = [r for r in reports if "health watch" in r["message"]]
    assert all(r["cause"] == "" for r in watched), watched
    if body is not body_fsdp2:  # FSDP2's all-gathers and reduce-scatters talk to every rank: gloo tells them all
        # A ring all_reduce's far survivor was not talking to rank 1: the backend told it nothing, the watch did.
        assert watched, reports


def test_without_the_watch_a_survivor_hears_nothing_from_the_backend(tmp_path):
    reports = _lose_rank_1(tmp_path, body_calls, {}, env={_health.ENV: "0"})  # the watch off in every rank
    # The far survivor hears of rank 1 only when its own 6 s bound runs out (a wait that timed out, which the
    # typed faults then explain by a look): the backend never told it.
    slowest = max(reports, key=lambda r: r["after"])
    assert slowest["after"] > BOUND.total_seconds() - 1, reports
    assert not any("health watch" in r["message"] for r in reports), reports


@pytest.mark.parametrize("vendor", list(VENDORS))
def test_the_sentinels_alarm_brings_the_look_forward_from_a_long_deadline(tmp_path, vendor):
    """With a deadline of 30 s, only the sentinel's alarm (``_sentinel``) can make the far survivor look within its
    own 6 s bound: its neighbours read rank 1's reset as it dies, and the alarm reaches every survivor."""
    reports = _lose_rank_1(tmp_path, body_calls, VENDORS[vendor], env={_health.ENV: "30"})
    for r in reports:
        assert r["type"] == "PeerFailure" and r["ranks"] == [VICTIM], r
        assert r["after"] < BOUND.total_seconds() - 2, r  # well before any survivor's own bound runs out
    assert any("health watch" in r["message"] for r in reports), reports


def body_idle_at_the_loss(path: str) -> dict[str, Any]:
    """Rank 1 dies while the others are in no call of xccl's (computing, or blocked on their device outside xccl,
    as on a device vendor's hardware); 3 s later they call again."""
    t = torch.ones(64)
    xccl.all_reduce(t)
    if xccl.get_world().rank == VICTIM:
        _die_later(path, 0.3)
    time.sleep(3)
    started = time.monotonic()
    try:
        xccl.all_reduce(t)
    except Exception as exc:
        return {**_report(exc), "took": time.monotonic() - started}
    return {"type": "none"}


@pytest.mark.parametrize("vendor", list(VENDORS))
def test_a_loss_while_no_call_waits_is_found_by_the_sentinel(tmp_path, vendor):
    """No call of xccl's waits, so only the sentinel's own look can reach a verdict: the next call raises it before it
    communicates (on cpu, the far survivor would otherwise wait for its deadline), and on Sophgo, where nothing
    releases a host blocked on the device, the process ends itself while it is still idle (after 1 s here)."""
    path = tmp_path / "death"
    with RankPool(4, {"timeout": 300, **VENDORS[vendor]}, env={_ending.ENV: "1"}, start_method="forkserver",
                  start_timeout=60) as pool:
        outs = pool.run(body_idle_at_the_loss, str(path), timeout=60)
    for o in outs:
        if o.rank == VICTIM:
            assert o.raised("RankDied"), str(o)
        elif vendor == "sophgo":
            assert o.raised("RankDied") and f"exit code {_ending.EXIT_CODE}" in o.message, str(o)
        else:
            assert o.ok and o.value["type"] == "PeerFailure" and o.value["ranks"] == [VICTIM], str(o)
            assert o.value["took"] < 0.5, o.value  # known before the call: no look, no wait


def body_leave_then_lose(path: str) -> dict[str, int]:
    """Rank 3 shuts xccl down and ends; later rank 2 is SIGKILLed. Ranks 0 and 1, in no call at all, count the
    sentinel's alarms after each."""
    from xccl.collectives._health._liveness import alarms

    rank = xccl.get_world().rank
    xccl.all_reduce(torch.ones(4))
    if rank == 3:
        xccl.shutdown()
        os._exit(0)  # ends without a word more: only the goodbye tells its neighbours it left on purpose
    time.sleep(1.0)
    after_leave = alarms()
    if rank == 2:
        _die_later(path, 0.0)
        time.sleep(60)
    end = time.monotonic() + BOUND.total_seconds()
    while alarms() == after_leave and time.monotonic() < end:
        time.sleep(0.01)
    return {"after_leave": after_leave, "after_loss": alarms()}


def test_a_rank_that_leaves_is_no_alarm_and_one_that_dies_is_heard_outside_any_call(tmp_path):
    with RankPool(4, {"timeout": 300}, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run(body_leave_then_lose, str(tmp_path / "death"), timeout=60)
    for o in outs[:2]:
        assert o.ok and o.value["after_leave"] == 0 and o.value["after_loss"] > 0, str(o)


def body_silent_peer() -> dict[str, Any] | str:
    """Rank 1 is alive but 3 s late; rank 0 waits on its handle with a bound of its own, 1.5 s."""
    if xccl.get_world().rank == 1:
        time.sleep(3)
        xccl.all_reduce(torch.ones(4))
        return "late"
    started = time.monotonic()
    try:
        xccl.all_reduce(torch.ones(4), async_op=True).wait(datetime.timedelta(seconds=1.5))
    except Exception as exc:
        report = _report(exc)
        report["after"] = time.monotonic() - started
        return report
    return "no error"


def test_a_live_peer_that_is_late_is_no_loss_and_a_waits_own_timeout_holds():
    """The look at the deadline (1 s) finds rank 1 alive: nothing is raised for it, and the caller's own bound
    (1.5 s) ends the wait as the backend's would, typed as a timeout."""
    with RankPool(2, {"timeout": 300}, start_method="forkserver", start_timeout=60) as pool:
        report, late = pool.run_ok(body_silent_peer, timeout=60)
    assert late == "late"
    assert report["type"] == "CollectiveTimeout" and 1.4 < report["after"] < 2.9, report


def body_gloo_wait(op: str) -> float:
    """Rank 0: how long torch's own gloo work of ``op`` (a plain gloo group: no xccl on its path) takes to answer a
    wait of 0.3 s while rank 1 is 2 s late."""
    import torch.distributed as dist

    g = dist.new_group(backend="gloo")
    t, out = torch.ones(8), torch.empty(4)
    if dist.get_rank() == 1:
        time.sleep(2)
    if op == "all_reduce":
        work = dist.all_reduce(t, group=g, async_op=True)
    else:
        work = dist.reduce_scatter_tensor(out, t, group=g, async_op=True)
    started = time.monotonic()
    with contextlib.suppress(RuntimeError):  # the wait gave up (on time, or not)
        work.wait(datetime.timedelta(seconds=0.3))
    took = time.monotonic() - started
    work.wait()
    dist.destroy_process_group(g)
    return took


@pytest.mark.parametrize("op", ["reduce_scatter_tensor", "all_reduce"])
def test_which_gloo_works_ignore_a_waits_timeout(op):
    """Why the watch waits for the reduce-scatters in a thread (``_watch.IN_THREAD``): on this torch, gloo's reduce-scatter work waits
    for the whole collective whatever timeout its wait is given, while the others give up on time. Should a torch
    honour it, this fails, and IN_THREAD can lose the op."""
    with RankPool(2, {"timeout": 60}, start_method="forkserver", start_timeout=60) as pool:
        took = pool.run_ok(body_gloo_wait, op, timeout=60)[0]
    assert (took > 1.0) == (op in _health.IN_THREAD), took


def body_late_sender() -> str:
    """Rank 1 receives (asynchronously, then waits) what rank 0 sends 2.5 s late: past the watch's deadline."""
    t = torch.zeros(4)
    if xccl.get_world().rank == 0:
        time.sleep(2.5)
        xccl.send(torch.ones(4), 1)
        return "sent"
    xccl.irecv(t, 0).wait()
    return f"received {t.tolist()}"


@pytest.mark.parametrize("vendor", list(VENDORS))
def test_a_receive_that_waits_past_the_deadline_for_a_late_sender_completes(vendor):
    """The watch waits for a point-to-point work in a thread: a sliced wait would close gloo's pair (below) and fail
    the late sender as if its peer had died (CI saw it: torch.distributed.pipelining's first recv on simulated
    Sophgo, whose send and recv run on the host's gloo group)."""
    with RankPool(2, {"timeout": 300, **VENDORS[vendor]}, start_method="forkserver", start_timeout=60) as pool:
        sent, received = pool.run_ok(body_late_sender, timeout=60)
    assert sent == "sent" and received == "received [1.0, 1.0, 1.0, 1.0]", (sent, received)


def body_gloo_recv() -> str:
    """Rank 0 waits 0.3 s for a receive that rank 1 sends 2 s late, on a plain gloo group; what rank 1's send and
    rank 0's next wait then say."""
    import torch.distributed as dist

    g = dist.new_group(backend="gloo")
    t = torch.ones(4)
    if dist.get_rank() == 1:
        time.sleep(2)
        try:
            dist.send(t, 0, group=g)
            return "sent"
        except RuntimeError as exc:
            return f"send failed: {exc}"
    work = dist.irecv(t, 1, group=g)
    with contextlib.suppress(RuntimeError):  # the wait gave up
        work.wait(datetime.timedelta(seconds=0.3))
    try:
        work.wait()
        return "received"
    except RuntimeError as exc:
        return f"recv failed: {exc}"


def test_a_gloo_receive_whose_wait_times_out_closes_its_pair():
    """Why the watch waits for point-to-point works in a thread (``_watch.IN_THREAD``): on this torch, a receive's
    wait that runs out closes the connection, and the late sender fails as if its peer had died. Should a torch keep
    the pair, this fails, and IN_THREAD can lose send and recv."""
    with RankPool(2, {"timeout": 60}, start_method="forkserver", start_timeout=60) as pool:
        recv, send = pool.run_ok(body_gloo_recv, timeout=60)
    assert recv.startswith("recv failed") and send.startswith("send failed"), (recv, send)
    assert {"send", "recv", "isend", "irecv"} <= _health.IN_THREAD


# ------------------------------------------------------------------------------------------------ the setting


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
@pytest.mark.parametrize("setting", [_health.deadline, _ending.exit_after], ids=[_health.ENV, _ending.ENV])
def test_a_bad_setting_is_an_init_error_naming_the_variable(monkeypatch, raw, setting):
    name = _health.ENV if setting is _health.deadline else _ending.ENV
    monkeypatch.setenv(name, raw)
    with pytest.raises(InitError, match=name):
        setting()
    with pytest.raises(InitError, match=name):
        xccl.init(vendor="cpu", rank=0, world_size=1)
    xccl.shutdown()


def test_the_watch_is_on_groups_that_can_lose_a_rank_only(monkeypatch):
    assert _health.hook in OBSERVERS
    monkeypatch.delenv(_health.ENV, raising=False)
    assert _health.deadline() == _health.DEFAULT_DEADLINE

    class Group:
        size, device_type = 4, "cpu"

    assert _health.hook(Group()) is not None
    Group.size = 1  # a world of one: nobody to lose
    assert _health.hook(Group()) is None
    Group.size, Group.device_type = 4, "cuda"  # a device vendor's wait does not block the host: a known loss only
    assert type(_health.hook(Group())).__name__ == "_Known"
    Group.device_type = "cpu"
    monkeypatch.setenv(_health.ENV, "0")
    assert _health.hook(Group()) is None


def body_synchronise_after(path: str) -> dict[str, Any]:
    """All ranks: all_reduce until an error; rank 1 dies from a timer. A survivor then synchronises with its device,
    as ``.item()`` or a checkpoint's copy to the host does after the step (the simulated stream: SCCL's never
    returns), its stderr to a file of its own."""
    t = torch.ones(1 << 10)
    xccl.all_reduce(t)
    rank = xccl.get_world().rank
    if rank == VICTIM:
        _die_later(path, 0.5)
    try:
        while True:
            xccl.all_reduce(t)
    except xccl.PeerFailure as exc:
        report = _report(exc)
    with open(f"{path}.{rank}.err", "wb") as err:
        os.dup2(err.fileno(), 2)  # the worker's stderr, for the line a process that ends itself writes
    started = time.monotonic()
    try:
        simulated_stream().synchronize()
        report["synchronised"] = "returned"
    except RuntimeError as exc:
        report["synchronised"] = str(exc)
    report["took"] = time.monotonic() - started
    return report


@pytest.mark.parametrize("vendor", ["ascend", "sophgo"])
def test_a_host_blocked_on_the_device_after_the_verdict_is_released_by_the_vendors_abort_or_ends_itself(tmp_path,
                                                                                                       vendor):
    """Ascend: the verdict ran ``stop_device``, so the synchronisation fails at once (FORCE STOP) instead of at
    ``HCCL_EXEC_TIMEOUT`` (300 s here). Sophgo has no abort and no timeout: the process ends itself
    ``XCCL_LOSS_EXIT_AFTER`` seconds (1 here) after the verdict, with exit code 75 and one line that names rank 1."""
    path = tmp_path / "death"
    env = {_ending.ENV: "1", "HCCL_EXEC_TIMEOUT": "300"}
    with RankPool(4, {"timeout": 300, **VENDORS[vendor]}, env=env, start_method="forkserver",
                  start_timeout=60) as pool:
        outs = pool.run(body_synchronise_after, str(path), timeout=60)
    assert outs[VICTIM].raised("RankDied"), str(outs[VICTIM])
    for o in outs:
        if o.rank == VICTIM:
            continue
        said = Path(f"{path}.{o.rank}.err").read_text()
        if vendor == "ascend":
            assert o.ok and o.value["ranks"] == [VICTIM], str(o)
            assert "FORCE STOP" in o.value["synchronised"] and o.value["took"] < 1, o.value
            assert "ends itself" not in said, said
        else:
            assert o.raised("RankDied") and f"exit code {_ending.EXIT_CODE}" in o.message, str(o)
            line = [s for s in said.splitlines() if s.startswith("xccl: ")]
            assert len(line) == 1 and f"rank {o.rank} ends itself with exit code 75: ranks [1] were lost" in line[0], said

