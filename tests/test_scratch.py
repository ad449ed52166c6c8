"""The emulations' scratch buffers: reused per group, dtype and size class; bounded; never lent twice while in
flight; freed by ``xccl.shutdown()`` and by destroying the group.

The pool alone is checked in this process; the multi-rank checks run real 2- and 4-rank gloo groups on the cpu
plugin, whose reduce_scatter_tensor runs as all_to_all_single + a local reduction from ``RS_VIA_ALL_TO_ALL
.min_bytes`` (the composition that takes a scratch buffer per call).
"""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.backends.cpu import RS_VIA_ALL_TO_ALL
from xccl.collectives._groups import state_of
from xccl.collectives._scratch import LIMIT_COUNT, Scratch, size_class
from xccl.collectives._state import GROUPS

MIN = RS_VIA_ALL_TO_ALL.min_bytes
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------- the pool alone


def test_size_classes_cover_the_size_with_at_most_a_quarter_more() -> None:
    last = 0
    for nbytes in [0, 1, 4096, 4097, 5000, 65535, 65536, 65537, 10**6, 64 << 20, (64 << 20) + 1]:
        c = size_class(nbytes)
        assert c >= nbytes and c >= last
        assert nbytes <= 4096 or c <= nbytes * 1.25, (nbytes, c)
        last = c
    assert size_class(64 << 20) == 64 << 20


def test_a_buffer_given_back_is_lent_again_and_one_lent_is_not() -> None:
    pool = Scratch()
    a = pool.take(1000, torch.float32, CPU)
    b = pool.take(1000, torch.float32, CPU)  # a is still lent: another buffer
    assert a.tensor.data_ptr() != b.tensor.data_ptr() and a.tensor.numel() == 1000
    ptr = a.tensor.data_ptr()
    a.release()
    a.release()  # once only: a second release must not put it in the pool twice
    assert len(pool) == 1
    c = pool.take(900, torch.float32, CPU)  # same size class
    assert c.tensor.data_ptr() == ptr and len(pool) == 0
    d = pool.take(900, torch.int32, CPU)  # another dtype: another buffer
    assert d.tensor.data_ptr() != ptr
    for lease in (b, c, d):
        lease.release()
    assert len(pool) == 3


def test_idle_memory_is_bounded_oldest_dropped_first() -> None:
    pool = Scratch(limit=1 << 20)
    leases = [pool.take(256 << 10, torch.uint8, CPU) for _ in range(6)]  # 6 x 256 KiB lent at once
    kept = [lease.tensor.data_ptr() for lease in leases[2:]]
    for lease in leases:
        lease.release()
    assert pool.idle_bytes == 1 << 20 and [t.data_ptr() for t in pool.idle()] == kept
    big = pool.take((1 << 20) + 1, torch.uint8, CPU)  # larger than the limit: never kept
    big.release()
    assert pool.idle_bytes == 1 << 20
    small = [pool.take(10, torch.uint8, CPU) for _ in range(LIMIT_COUNT + 4)]
    for lease in small:
        lease.release()
    assert len(pool) == LIMIT_COUNT


def test_a_cleared_or_closed_pool_keeps_nothing_and_devices_are_not_pooled() -> None:
    pool = Scratch()
    lent = pool.take(100, torch.float64, CPU)
    pool.take(100, torch.float64, CPU).release()
    pool.clear(close=True)
    lent.release()  # given back after closing: dropped
    assert len(pool) == 0 and pool.idle_bytes == 0
    meta = Scratch().take(100, torch.float32, torch.device("meta"))  # not host memory: the allocator's business
    assert meta.tensor.device.type == "meta"
    meta.release()
    off = Scratch(limit=0)
    off.take(100, torch.float32, CPU).release()
    assert len(off) == 0


# --------------------------------------------------------------------------------------------- rank bodies


def _rows(n: int) -> int:
    return -(-MIN // (n * 4))  # float32 rows: the input is at least MIN bytes, above the threshold


def body_in_flight() -> dict[str, Any]:
    """Two asynchronous emulated reduce_scatters, the second issued before the first is waited for, then a third
    after both: both results right, two buffers in the pool, and the third reuses one of them."""
    n, r = dist.get_world_size(), dist.get_rank()
    st = state_of(None)
    st.scratch.clear()
    rows = _rows(n)
    base = torch.arange(float(n * rows))
    x1, x2 = base + r, 3 * base - r  # sums stay exact in float32
    o1, o2 = torch.empty(rows), torch.empty(rows)
    w1 = xccl.reduce_scatter_tensor(o1, x1, async_op=True)
    w2 = xccl.reduce_scatter_tensor(o2, x2, async_op=True)
    lent_while_in_flight = st.scratch.idle_bytes  # both buffers are out until their work completes
    w2.wait()
    w1.wait()
    mine = base.view(n, rows)[r]
    pool = {t.data_ptr() for t in st.scratch.idle()}
    o3 = torch.empty(rows)
    xccl.reduce_scatter_tensor(o3, x1)
    return {
        "first": torch.equal(o1, n * mine + sum(range(n))),
        "second": torch.equal(o2, 3 * n * mine - sum(range(n))),
        "third": torch.equal(o3, o1),
        "lent_while_in_flight": lent_while_in_flight,
        "pooled": len(pool),
        "reused": {t.data_ptr() for t in st.scratch.idle()} == pool,
    }


def _alive_after_release(refs: list[weakref.ref[torch.Tensor]], deadline_s: float = 30.0) -> int:
    """How many of ``refs`` are still alive once nothing but torch's own threads could hold them.

    gloo's worker thread marks a work complete, which wakes ``wait()``, and only then drops its own reference to the
    work and the tensors in it (``ProcessGroupGloo::runLoop`` resets ``workInProgress_`` after ``execute``). On a busy
    machine that reset can come after the body has looked, so the body waits for it, up to a generous deadline: a
    buffer xccl itself still holds stays alive for the whole deadline and fails the test.
    """
    end = time.monotonic() + deadline_s
    while True:
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        if alive == 0 or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def body_destroyed_group() -> dict[str, Any]:
    """A group's pool holds a buffer after an emulated call; destroying the group frees it."""
    n = dist.get_world_size()
    g = xccl.new_group()
    rows = _rows(n)
    out = torch.empty(rows)
    xccl.reduce_scatter_tensor(out, torch.ones(n * rows), group=g)
    st = state_of(g)
    refs = [weakref.ref(t) for t in st.scratch.idle()]
    held = len(refs)
    del st
    dist.destroy_process_group(g)
    return {"held": held, "alive": _alive_after_release(refs), "forgotten": g not in GROUPS.groups,
            "result": torch.equal(out, torch.full((rows,), float(n)))}


def body_shutdown() -> dict[str, Any]:
    """``xccl.shutdown()`` frees every group's pool (this body ends the pool's xccl world)."""
    n = dist.get_world_size()
    rows = _rows(n)
    xccl.reduce_scatter_tensor(torch.empty(rows), torch.ones(n * rows))
    refs = [weakref.ref(t) for t in state_of(None).scratch.idle()]
    held = len(refs)
    xccl.shutdown()
    return {"held": held, "alive": _alive_after_release(refs)}


# ---------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("world_size", [2, 4])
def test_no_buffer_is_lent_twice_while_its_work_is_in_flight(rank_pools: Any, world_size: int) -> None:
    for rank, out in enumerate(rank_pools.get(world_size, vendor="cpu", fallback="emulate").run_ok(body_in_flight)):
        assert out["first"] and out["second"] and out["third"], f"rank {rank}: {out}"
        assert out["lent_while_in_flight"] == 0 and out["pooled"] == 2 and out["reused"], f"rank {rank}: {out}"


def test_destroying_a_group_frees_its_scratch(rank_pools: Any) -> None:
    for rank, out in enumerate(rank_pools.get(2, vendor="cpu", fallback="emulate").run_ok(body_destroyed_group)):
        assert out == {"held": 1, "alive": 0, "forgotten": True, "result": True}, f"rank {rank}: {out}"


def test_shutdown_frees_the_scratch(rank_pools: Any) -> None:
    # A pool of its own (the env sets it apart): the body shuts its world down.
    pool = rank_pools.get(2, env={"XCCL_TEST_POOL": "scratch-shutdown"}, vendor="cpu", fallback="emulate")
    try:
        for rank, out in enumerate(pool.run_ok(body_shutdown)):
            assert out == {"held": 1, "alive": 0}, f"rank {rank}: {out}"
    finally:
        pool.close()
