"""Typed faults on real processes: a rank SIGKILLed before, during and after collectives, a silent rank, a
rendezvous that never completes, and an asynchronous handle whose peer dies.

Every scenario kills a rank, so each gets a fresh pool; pools fork from a server that imported torch once
(``start_method="forkserver"``), which keeps a 4-rank start well under a second. The collective timeout is short
(``TIMEOUT``): every survivor must raise :class:`~xccl.PeerFailure` or :class:`~xccl.CollectiveTimeout` within
``TIMEOUT + 5`` seconds of the death.
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
from xccl.collectives._faults import TypedWork, classify, translate
from xccl.errors import CollectiveTimeout, PeerFailure
from xccl.testing import RankPool, free_port

TIMEOUT = 3.0
TYPED = ("PeerFailure", "CollectiveTimeout")

# Messages as gloo and the store print them (torch 2.13), for the classification tests.
GLOO_CLOSED = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28361. "
    "This is typically caused by a remote worker crashing."
)
GLOO_RESET = "[/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:51091: Connection reset by peer. ... hanging"
GLOO_TIMEOUT = "[/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete"


# ---------------------------------------------------------------------------------------------- rank bodies


def _die(path: str) -> None:
    Path(path).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _fault_report(exc: BaseException) -> dict[str, Any]:
    cause = exc.__cause__
    return {
        "types": [c.__name__ for c in type(exc).__mro__],
        "at": time.time(),
        "attrs": {k: getattr(exc, k, None) for k in ("rank", "op", "group", "elapsed", "ranks")},
        "cause": f"{type(cause).__name__}: {cause}" if cause is not None else "",
        "message": str(exc),
    }


def body_kill(when: str, victim: int, path: str, async_op: bool) -> dict[str, Any]:
    """All ranks: collectives until an error; the victim dies before, during or after the first one."""
    rank = xccl.get_world().rank
    t = torch.ones(1 << 16)
    if when == "after":
        xccl.broadcast(t, src=0)  # one collective that completes on every rank
    if rank == victim:
        if when == "during":
            # Die from a second thread while the main thread is inside a collective.
            threading.Timer(0.3, _die, (path,)).start()
        else:
            _die(path)
    elif when != "during":
        time.sleep(0.5)  # the victim is dead before the survivors call
    try:
        for _ in range(100_000):
            if async_op:
                work = xccl.broadcast(t, src=rank, async_op=True)
                work.wait()
            else:
                xccl.broadcast(t, src=(rank + 1) % xccl.get_world().world_size)
    except Exception as exc:
        return _fault_report(exc)
    return {"types": ["no error"], "at": time.time()}


def body_silent(silent_rank: int, seconds: float) -> dict[str, Any] | str:
    if xccl.get_world().rank == silent_rank:
        time.sleep(seconds)
        return "slept"
    try:
        xccl.all_reduce(torch.ones(4))
    except Exception as exc:
        return _fault_report(exc)
    return "no error"


def body_ok() -> float:
    t = torch.ones(1)
    xccl.all_reduce(t)
    return t.item()


# ---------------------------------------------------------------------------------------------- SIGKILL


def _kill(tmp_path: Path, world: int, victim: int, when: str, async_op: bool = False) -> list[dict[str, Any]]:
    path = tmp_path / "death"
    with RankPool(world, {"timeout": TIMEOUT}, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run(body_kill, when, victim, str(path), async_op, timeout=TIMEOUT + 30)
    died = float(path.read_text())
    assert outs[victim].raised("RankDied"), str(outs[victim])
    reports = []
    for o in outs:
        if o.rank == victim:
            continue
        assert o.ok, str(o)
        report = o.value
        assert any(t in report["types"] for t in TYPED), report
        assert "XcclError" in report["types"]
        report["after_death"] = report["at"] - died
        assert report["after_death"] < TIMEOUT + 5, report
        assert report["attrs"]["rank"] == o.rank and report["attrs"]["op"] == "broadcast", report
        assert report["attrs"]["group"] and report["attrs"]["elapsed"] >= 0
        if report["cause"]:
            assert report["cause"].startswith("RuntimeError:"), report  # the backend's error, chained
        else:  # a survivor the backend told nothing: xccl's health watch named the lost rank (_health)
            assert "PeerFailure" in report["types"] and report["attrs"]["ranks"] == (victim,), report
            assert "health watch" in report["message"], report
        reports.append(report)
    return reports


# 5-6 s a case: the first tier kills at each moment at 2 ranks, and rank 0 (the store's host) at 4; the other two
# at 4 ranks are the second tier's.
@pytest.mark.slow_cases("4-before", "4-during")
@pytest.mark.parametrize(
    ("world", "victim", "when"),
    [(2, 1, "before"), (2, 1, "during"), (2, 0, "after"), (4, 3, "before"), (4, 1, "during"), (4, 0, "after")],
    ids=["2-before", "2-during", "2-after-rank0", "4-before", "4-during", "4-after-rank0"],
)
def test_sigkill_gives_every_survivor_a_typed_error_within_the_timeout(tmp_path, world, victim, when):
    reports = _kill(tmp_path, world, victim, when)
    assert len(reports) == world - 1


def test_async_wait_raises_typed_error_when_the_peer_dies(tmp_path):
    reports = _kill(tmp_path, 2, 1, "during", async_op=True)
    assert "PeerFailure" in reports[0]["types"], reports


# ---------------------------------------------------------------------------------------------- silent peer


def test_peer_that_stops_calling_gives_collective_timeout():
    with RankPool(2, {"timeout": 3}, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run(body_silent, 1, 4.5, timeout=40)
        report = outs[0].value
        assert "CollectiveTimeout" in report["types"], report
        assert 3 <= report["attrs"]["elapsed"] < 3 + 5, report
        assert report["attrs"] == {**report["attrs"], "rank": 0, "op": "all_reduce"}
        assert "Timed out" in report["cause"]
        assert "timeout is 3 s" in report["message"]
        assert outs[1].value == "slept"


# ---------------------------------------------------------------------------------------------- rendezvous


def _lonely_rank(port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="2")
    try:
        xccl.init("cpu", timeout=2, setup_timeout=2)
        queue.put(("no error", {}, ""))
    except Exception as exc:
        attrs = {k: getattr(exc, k, None) for k in ("rank", "world_size", "elapsed")}
        queue.put(([c.__name__ for c in type(exc).__mro__], attrs, type(exc.__cause__).__name__))


def test_rendezvous_that_never_completes_is_rendezvous_timeout():
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    queue = ctx.Queue()
    proc = ctx.Process(target=_lonely_rank, args=(free_port(), queue))
    proc.start()
    try:
        types, attrs, cause = queue.get(timeout=60)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    assert "RendezvousTimeout" in types and "XcclError" in types, types
    assert attrs["rank"] == 0 and attrs["world_size"] == 2 and 2 <= attrs["elapsed"] < 10, attrs
    assert cause == "DistStoreError"


def _late_rank(rank: int, port: int, late: float, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    time.sleep(late)  # a rank that is slow to start: imports, device setup, a loaded machine
    try:
        xccl.init("cpu", timeout=1)
        xccl.barrier()
        queue.put((rank, "ok"))
    except Exception as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        xccl.shutdown()


def test_a_short_collective_timeout_does_not_bound_the_start():
    # The collective timeout is 1 s; one rank arrives 3 s after the other. The rendezvous waits the setup timeout
    # (at least 300 s unless set), so both start; before, the 1 s ran out while the second rank was starting.
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_late_rank, args=(r, port, 3.0 * r, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert got == {0: "ok", 1: "ok"}, got


# ---------------------------------------------------------------------------------------------- translation


class _Ctx:
    """The three fields translate() reads from a GroupContext."""

    ranks = (0, 1, 2, 3)
    rank = 2
    name = "7"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (GLOO_CLOSED, PeerFailure),
        (GLOO_RESET, PeerFailure),
        ("[pair.cc:600] Write error [127.0.0.1]:1: Broken pipe", PeerFailure),
        ("NCCL error: remote process exited or there was a network error, NCCL version 2.21", PeerFailure),
        (GLOO_TIMEOUT, CollectiveTimeout),
        ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE)", CollectiveTimeout),
        ("ProcessGroupGloo::alltoall: invalid tensor size at index 1", None),
        ("Tensors must be contiguous", None),
    ],
    ids=["gloo-closed", "gloo-reset", "broken-pipe", "nccl-remote", "gloo-timeout", "nccl-watchdog", "size", "other"],
)
def test_classify_backend_messages(text, kind):
    assert classify(text) is kind


def test_translate_keeps_context_and_leaves_other_errors_alone():
    started = time.monotonic() - 2.0
    err = translate(RuntimeError(GLOO_RESET), _Ctx(), "all_gather", started)
    assert isinstance(err, PeerFailure) and isinstance(err, xccl.XcclError)
    assert (err.rank, err.op, err.group) == (2, "all_gather", "7") and 2.0 <= err.elapsed < 3.0
    assert "Connection reset by peer" in str(err) and "ranks [0, 1, 2, 3]" in str(err)
    timeout = translate(RuntimeError(GLOO_TIMEOUT), _Ctx(), "all_reduce")  # no clock: the backend's own figure
    assert isinstance(timeout, CollectiveTimeout) and timeout.elapsed == 5.0
    other = RuntimeError("invalid tensor size")
    assert translate(other, _Ctx(), "all_to_all") is other


class _FailingWork:
    def __init__(self, text: str) -> None:
        self.text = text
        self.waited_with: Any = "never"

    def wait(self, timeout: Any = None) -> bool:
        self.waited_with = timeout
        raise RuntimeError(self.text)

    def is_completed(self) -> bool:
        return True

    def vendor_extra(self) -> str:  # something of a vendor's Work that torch's Work does not have
        return "extra"


def test_typed_work_translates_wait_and_forwards_the_rest():
    inner = _FailingWork(GLOO_CLOSED)
    work = TypedWork(inner, _Ctx(), "broadcast", time.monotonic())
    with pytest.raises(PeerFailure) as info:
        work.wait(datetime.timedelta(seconds=1))
    assert info.value.__cause__ is not None and "Connection closed by peer" in str(info.value.__cause__)
    assert inner.waited_with == datetime.timedelta(seconds=1)
    assert work.is_completed() is True and work.vendor_extra() == "extra"
    # A torch.distributed.Work itself, so that xccl's process group can hand it to torch and to C++ callers.
    assert isinstance(work, torch.distributed.Work)
    plain = TypedWork(_FailingWork("something else"), _Ctx(), "broadcast", time.monotonic())
    with pytest.raises(RuntimeError, match="something else"):
        plain.wait()
