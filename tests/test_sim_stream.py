"""The simulated device stream (``xccl.plugin._sim_stream``): a lost peer reaches the host as each vendor has it.

HCCL tells the host nothing of a collective stuck on a dead peer until ``HCCL_EXEC_TIMEOUT`` (EI0002), SCCL never
(../shared/vendor-api/RUNTIME-AUDIT-3.md, L2 and N12); gloo tells the survivors that talked to the peer at once.
With xccl's health watch off, four plain processes lose rank 1 (not the last) at a 300 s collective timeout: on
simulated Ascend no survivor hears anything before the execution timeout, on simulated Sophgo none hears anything
at all (bounded by the test), while on cpu gloo's own error still reaches the survivors next to rank 1 at once. So
the simulation cannot pass a test through gloo's error; what reaches a survivor in time is the health watch
(``tests/test_health.py``). ``ProcessGroupHCCL::shutdown`` synchronises its streams first: the simulated teardown
waits for the stuck collective, unless the device's tasks were stopped (torch_npu's ``stop_device``).
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import xccl
from xccl.collectives._health import _watch as _health
from xccl.plugin import simulated_stream
from xccl.plugin._sim_stream import StreamWork
from xccl.testing import RankPool

VICTIM = 1
EXEC = 4  # HCCL_EXEC_TIMEOUT for these tests, seconds
QUIET = {_health.ENV: "0", "HCCL_EXEC_TIMEOUT": str(EXEC)}  # no health watch


def _die_later(path: str, after: float) -> None:
    def die() -> None:
        Path(path).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Timer(after, die).start()


def _chain(exc: BaseException | None) -> str:
    texts = []
    while exc is not None:
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(texts)


def body_loop(path: str, bound: float | None = None) -> dict[str, Any]:
    """All ranks: all_reduce until an error (each wait bounded by ``bound`` seconds, if given); rank 1 dies from a
    timer."""
    t = torch.ones(1 << 10)
    xccl.all_reduce(t)
    if xccl.get_world().rank == VICTIM:
        _die_later(path, 0.5)
    while True:
        try:
            if bound is None:
                xccl.all_reduce(t)
            else:
                xccl.all_reduce(t, async_op=True).wait(datetime.timedelta(seconds=bound))
        except Exception as exc:
            return {"at": time.time(), "chain": _chain(exc)}


def _lose_rank_1(tmp_path: Path, init: dict[str, Any], wait: float, bound: float | None = None
                 ) -> tuple[float, list[Any]]:
    path = tmp_path / "death"
    with RankPool(4, {"timeout": 300, **init}, env=QUIET, start_method="forkserver", start_timeout=60) as pool:
        try:
            outs = pool.run(body_loop, str(path), bound, timeout=wait)
        except TimeoutError as exc:  # some ranks never answered: the pool was killed
            return float(path.read_text()), [str(exc)]
    return float(path.read_text()), [o for o in outs if o.rank != VICTIM]


def test_simulated_hccl_tells_no_survivor_of_a_lost_peer_before_hccl_exec_timeout(tmp_path):
    died, outs = _lose_rank_1(tmp_path, {"vendor": "ascend", "simulate": True}, 60)
    for o in outs:
        assert o.ok, str(o)
        after = o.value["at"] - died
        # The stuck all_reduce began at most a step before the kill: nothing before HCCL_EXEC_TIMEOUT after it.
        assert after > EXEC - 1, (o.rank, after, o.value)
        assert "EI0002" in o.value["chain"], o.value
        assert "Connection closed" not in o.value["chain"], o.value


@pytest.mark.slow
def test_simulated_sccl_tells_no_survivor_of_a_lost_peer_ever(tmp_path):
    _, outs = _lose_rank_1(tmp_path, {"vendor": "sophgo", "simulate": True}, 12)
    # Not one survivor returned within 12 s of a collective timeout of 300 s: SCCL has no timeout and no error path.
    assert outs == ["ranks [0, 2, 3] did not answer within 12s; the pool was killed"], outs


def test_on_cpu_gloo_still_tells_the_survivors_next_to_the_lost_rank_at_once(tmp_path):
    died, outs = _lose_rank_1(tmp_path, {}, 60, bound=6)  # the far survivor hears nothing: its own bound ends it
    afters = sorted(o.value["at"] - died for o in outs)
    first = min(outs, key=lambda o: o.value["at"]).value["chain"]
    assert afters[0] < 1.0 and "health watch" not in first, (afters, first)  # gloo's own error, typed


def body_teardown(stop: bool) -> dict[str, Any] | None:
    """2 ranks: rank 1 dies; rank 0's all_reduce is stuck on it, then rank 0 destroys the world (after torch_npu's
    stop_device and restart_device when ``stop``) and says how long that took and what it raised."""
    import torch.distributed as dist

    from xccl.collectives._state import PROCESS

    t = torch.ones(4)
    xccl.all_reduce(t)
    if xccl.get_world().rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    work = xccl.all_reduce(t, async_op=True)
    time.sleep(0.5)  # gloo has failed it by now: the simulated stream holds it
    started = time.monotonic()
    error = ""
    try:
        if stop:
            assert PROCESS.runtime is not None
            assert PROCESS.runtime.stop_device()
            PROCESS.runtime.restart_device()  # Huawei's recovery, as xccl's shrink does it
        dist.destroy_process_group()
    except RuntimeError as exc:
        error = str(exc)
    took = time.monotonic() - started
    try:
        work.wait()
        waited = ""
    except Exception as exc:
        waited = _chain(exc)
    return {"took": took, "error": error, "waited": waited}


@pytest.mark.parametrize("stop", [pytest.param(False, marks=pytest.mark.slow), True], ids=["plain", "stop_device"])
def test_simulated_hccl_teardown_waits_for_a_stuck_collective_unless_the_device_is_stopped(stop):
    with RankPool(2, {"timeout": 300, "vendor": "ascend", "simulate": True}, env=QUIET, start_method="forkserver",
                  start_timeout=60) as pool:
        outs = pool.run(body_teardown, stop, timeout=60)
    report = outs[0].value
    assert outs[0].ok, str(outs[0])
    if stop:
        assert report["took"] < 1.0 and not report["error"], report
        assert "FORCE STOP" in report["waited"], report
    else:
        # ProcessGroupHCCL::shutdown synchronises the stream: it waits out HCCL_EXEC_TIMEOUT, then raises.
        assert report["took"] > EXEC - 1.5 and "EI0002" in report["error"], report


# ------------------------------------------------------------------------------------------------ the stream


def test_the_stream_holds_from_the_stuck_collective_on_and_stop_and_restart_release_it():
    stream = simulated_stream()
    stream.reset()
    now = time.monotonic()
    before, epoch = stream.issue()
    stuck, _ = stream.issue()
    stream.hold(stuck, now, 0.3, "EI0002 (test)")
    after, _ = stream.issue()
    assert not stream.behind(before, now) and stream.behind(stuck, now) and stream.behind(after, now)
    assert stream.held()
    with pytest.raises(RuntimeError, match="Operation timed out"):
        stream.wait(epoch, time.monotonic() + 0.05)  # a wait's own bound, first
    with pytest.raises(RuntimeError, match="EI0002"):
        stream.wait(epoch, None)  # then the vendor's execution timeout
    # The vendor failed the stuck collective and what was queued behind it; what is issued now runs.
    assert stream.failed() and not stream.held() and not stream.behind(stream.issue()[0], time.monotonic())
    stream.synchronize()  # a teardown now: nothing held
    stream.stop("FORCE STOP (test)")
    with pytest.raises(RuntimeError, match="FORCE STOP"):
        stream.wait(epoch, None)  # issued before the stop
    new, epoch2 = stream.issue()
    assert stream.stopped(epoch2) == "FORCE STOP (test)" and not stream.behind(new, time.monotonic())
    stream.restart()
    assert not stream.held() and stream.stopped(epoch2) == "" and stream.stopped(epoch) == "FORCE STOP (test)"
    stream.synchronize()  # nothing held: returns
    stream.reset()


class _StoppedMeanwhile:
    """A gloo work still running (a far survivor's collective) whose wait gives up, while another thread (the
    sentinel's verdict) stops the device."""

    def wait(self, timeout: Any = None) -> bool:
        simulated_stream().stop("FORCE STOP (test)")
        raise RuntimeError("Operation timed out!")


def test_a_work_given_up_on_while_the_device_was_stopped_is_not_synchronised_with_after_the_restart():
    """The shrink restarts the device and tears the old world down, which synchronises: a work the abort took off
    the device must not fail it (it did, once the sentinel could stop the device from its own thread)."""
    stream = simulated_stream()
    stream.reset()
    work = StreamWork(_StoppedMeanwhile(), 5.0, "")  # "": gloo's own timeout text
    with pytest.raises(RuntimeError, match="timed out"):  # the wait gave up
        work.wait(datetime.timedelta(seconds=0.01))
    stream.restart()
    stream.synchronize()  # returns at once: nothing of the old epoch is left to wait for
    stream.reset()
