"""Code written for torch.distributed runs with its collective calls replaced by xccl's, without a difference.

Three comparisons, each made on every rank of a real 2-rank world:

* ``torch.distributed.<fn>(..., group=raw)`` on the vendor's own group (``xccl.runtime.vendor_group()``: plain
  gloo, no xccl) against ``xccl.<fn>(...)`` on the world: the same values, the same return values, or an
  exception of the same family (``ValueError``/``RuntimeError``) where torch raises. Complex tensors, receives
  from any source, ``P2POp`` batches and the coalesced forms are where a reimplementation most easily differs.
* On simulated Sophgo, whose SCCL lacks some of these (point-to-point goes through a host gloo group, the
  coalesced all_reduce is composed), the same calls through xccl against a reference every rank computes.
* ``torch.distributed.<fn>`` called directly on the world (xccl's process group: the c10d path) against
  ``xccl.<fn>`` (the eager path): the same results, on the cpu plugin and on simulated Sophgo.

Each case runs the torch variant and the xccl variant in one body and returns both outcomes; the parent compares.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.runtime import vendor_group

SOPHGO = {"XCCL_SIMULATE": "sophgo"}
C64, C128, F32 = torch.complex64, torch.complex128, torch.float32
SUM, AVG, MAX = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX
TIMEOUT = 60.0
#: The exception family torch's refusals belong to (``xccl.UnsupportedCollective`` is a RuntimeError,
#: ``xccl.InvalidArgument`` a ValueError).
FAMILY = ("ValueError", "RuntimeError")

# ---------------------------------------------------------------------------------------------------------------
# Helpers run on the ranks
# ---------------------------------------------------------------------------------------------------------------

_RAW: dict[int, Any] = {}


def _raw() -> Any:
    """The vendor's own group over every rank, made once per world (every rank calls this in the same body)."""
    key = id(dist.group.WORLD)
    if key not in _RAW:
        _RAW[key] = vendor_group()
    return _RAW[key]


def _me() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _data(rank: int, shape: tuple[int, ...] | int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank-dependent values, exact in every dtype used here (small integers and halves)."""
    shape = (shape,) if isinstance(shape, int) else shape
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.float64).reshape(shape) + 10 * rank + salt
    if dtype.is_complex:
        return torch.complex(base, 0.5 * base - rank).to(dtype)
    return base.to(dtype)


def _attempt(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """``("ok", value)``, or ``("raised", class names most derived first, message)``."""
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates some of these entry points (all_reduce_coalesced, all_gather_coalesced, ...)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return ("ok", fn())
    except Exception as exc:  # compared by the parent
        return ("raised", tuple(c.__name__ for c in type(exc).__mro__), str(exc))


# ------------------------------------------------- torch.distributed on the vendor group vs xccl, by case
# Each case takes the implementation ("torch" or "xccl") and returns what the caller observes: the return value
# and the tensors it wrote.


def _all_reduce(dtype: torch.dtype, op: Any) -> Callable[[str], Any]:
    def case(impl: str) -> Any:
        rank, _ = _me()
        t = _data(rank, (2, 3), dtype)
        ret = dist.all_reduce(t, op=op, group=_raw()) if impl == "torch" else xccl.all_reduce(t, op=op)
        return ret, t

    return case


def case_all_gather(impl: str) -> Any:
    rank, n = _me()
    t = _data(rank, 3, C64)
    outs = [torch.zeros(3, dtype=C64) for _ in range(n)]
    ret = dist.all_gather(outs, t, group=_raw()) if impl == "torch" else xccl.all_gather(outs, t)
    return ret, outs


def case_broadcast(impl: str) -> Any:
    rank, _ = _me()
    t = _data(rank, (2, 2), C128)
    ret = dist.broadcast(t, src=1, group=_raw()) if impl == "torch" else xccl.broadcast(t, src=1)
    return ret, t


def case_scatter(impl: str) -> Any:
    rank, n = _me()
    out = torch.zeros(4, dtype=C64)
    lst = [_data(r, 4, C64, salt=100) for r in range(n)] if rank == 0 else None
    if impl == "torch":
        ret = dist.scatter(out, lst, src=0, group=_raw())
    else:
        ret = xccl.scatter(out, lst, src=0)
    return ret, out


def case_gather(impl: str) -> Any:
    # torch 2.13's gather, unlike its other collectives, does not view complex tensors as real, and gloo refuses
    # them ("Invalid scalar type"); xccl gathers them. The torch side therefore does the view itself, as torch
    # does for scatter and all_gather: what a complex gather means on gloo.
    rank, n = _me()
    t = _data(rank, 4, C64)
    lst = [torch.zeros(4, dtype=C64) for _ in range(n)] if rank == 0 else None
    if impl == "torch":
        real = None if lst is None else [torch.view_as_real(x) for x in lst]
        ret = dist.gather(torch.view_as_real(t), real, dst=0, group=_raw())
    else:
        ret = xccl.gather(t, lst, dst=0)
    return ret, lst


def case_all_to_all_single(impl: str) -> Any:
    rank, n = _me()
    inp = _data(rank, (2 * n, 3), C64)
    out = torch.zeros(2 * n, 3, dtype=C64)
    ret = dist.all_to_all_single(out, inp, group=_raw()) if impl == "torch" else xccl.all_to_all_single(out, inp)
    return ret, out


def case_all_to_all_single_splits(impl: str) -> Any:
    # Rank i sends 1 + i + j rows to rank j: uneven splits, different on every rank.
    rank, n = _me()
    isz = [1 + rank + j for j in range(n)]
    osz = [1 + i + rank for i in range(n)]
    inp = _data(rank, (sum(isz), 2), C128)
    out = torch.zeros(sum(osz), 2, dtype=C128)
    if impl == "torch":
        ret = dist.all_to_all_single(out, inp, osz, isz, group=_raw())
    else:
        ret = xccl.all_to_all_single(out, inp, osz, isz)
    return ret, out


def case_recv_any_source(impl: str) -> Any:
    # Rank 1 sends, rank 0 receives without naming the source: recv returns the sender's global rank.
    rank, _ = _me()
    send, recv = (dist.send, dist.recv) if impl == "torch" else (xccl.send, xccl.recv)
    kw = {"group": _raw()} if impl == "torch" else {}
    buf = torch.zeros(3, dtype=C64)
    if rank == 1:
        return send(_data(1, 3, C64), dst=0, tag=5, **kw), buf
    if rank == 0:
        return recv(buf, tag=5, **kw), buf
    return None, buf


def case_irecv_any_source(impl: str) -> Any:
    rank, _ = _me()
    isend, irecv = (dist.isend, dist.irecv) if impl == "torch" else (xccl.isend, xccl.irecv)
    kw = {"group": _raw()} if impl == "torch" else {}
    buf = torch.zeros(4, dtype=F32)
    if rank == 1:
        isend(_data(1, 4, F32), dst=0, tag=3, **kw).wait()
        return None, buf
    if rank == 0:
        work = irecv(buf, tag=3, **kw)
        work.wait()
        if impl == "torch":
            return work._source_rank(), buf
        # xccl's handle answers under both names: source_rank() (its API) and _source_rank() (what torch calls).
        if work._source_rank() != work.source_rank():
            raise AssertionError(f"_source_rank() {work._source_rank()} != source_rank() {work.source_rank()}")
        return work.source_rank(), buf
    return None, buf


def _ring(p2p: type, isend: Any, irecv: Any, group: Any) -> Any:
    rank, n = _me()
    send = _data(rank, 5, F32)
    got = torch.zeros(5, dtype=F32)
    ops = [p2p(isend, send, (rank + 1) % n, group), p2p(irecv, got, (rank - 1) % n, group)]
    return ops, got


def _batch(impl: str, ops: list[Any]) -> list[Any]:
    return dist.batch_isend_irecv(ops) if impl == "torch" else xccl.batch_isend_irecv(ops)


def case_batch_ring(impl: str) -> Any:
    """A ring of xccl.P2POp(xccl.isend/irecv) against torch's dist.P2POp(dist.isend/irecv) on the vendor group."""
    if impl == "torch":
        ops, got = _ring(dist.P2POp, dist.isend, dist.irecv, _raw())
    else:
        ops, got = _ring(xccl.P2POp, xccl.isend, xccl.irecv, None)
    works = _batch(impl, ops)
    for w in works:
        w.wait()
    return len(works), got


def case_batch_ring_torch_ops(impl: str) -> Any:
    """torch's own dist.P2POp(dist.isend/irecv) list, handed to xccl.batch_isend_irecv unchanged."""
    ops, got = _ring(dist.P2POp, dist.isend, dist.irecv, _raw() if impl == "torch" else None)
    works = _batch(impl, ops)
    for w in works:
        w.wait()
    return len(works), got


def _coalesced_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    rank, _ = _me()
    return [_data(rank, 3, dtype), _data(rank, (2, 2), dtype, salt=7)]


def _all_reduce_coalesced(dtype: torch.dtype) -> Callable[[str], Any]:
    def case(impl: str) -> Any:
        ts = _coalesced_inputs(dtype)
        if impl == "torch":
            ret = dist.all_reduce_coalesced(ts, group=_raw())
        else:
            ret = xccl.all_reduce_coalesced(ts)
        return ret, ts

    return case


def case_all_gather_coalesced(impl: str) -> Any:
    _, n = _me()
    ins = _coalesced_inputs(F32)
    outs = [[torch.zeros_like(t) for t in ins] for _ in range(n)]
    if impl == "torch":
        ret = dist.all_gather_coalesced(outs, ins, group=_raw())
    else:
        ret = xccl.all_gather_coalesced(outs, ins)
    return ret, outs


def case_barrier_timeout(impl: str) -> Any:
    """torch.distributed.barrier's full signature, timeout included, every rank arriving in time."""
    import datetime

    limit = datetime.timedelta(seconds=30)
    if impl == "torch":
        return dist.barrier(group=_raw(), timeout=limit)
    return xccl.barrier(device_ids=None, timeout=limit)


VS_TORCH: dict[str, Callable[[str], Any]] = {
    "all_reduce-complex64-sum": _all_reduce(C64, SUM),
    "all_reduce-complex128-sum": _all_reduce(C128, SUM),
    "all_reduce-complex64-avg": _all_reduce(C64, AVG),
    "all_reduce-complex128-avg": _all_reduce(C128, AVG),
    "all_reduce-complex64-max": _all_reduce(C64, MAX),
    "all_gather-complex64": case_all_gather,
    "broadcast-complex128": case_broadcast,
    "scatter-complex64": case_scatter,
    "gather-complex64": case_gather,
    "all_to_all_single-complex64": case_all_to_all_single,
    "all_to_all_single-splits-complex128": case_all_to_all_single_splits,
    "recv-any-source": case_recv_any_source,
    "irecv-any-source": case_irecv_any_source,
    "batch_isend_irecv-ring": case_batch_ring,
    "batch_isend_irecv-ring-torch-p2pops": case_batch_ring_torch_ops,
    "all_reduce_coalesced-float32": _all_reduce_coalesced(F32),
    "all_reduce_coalesced-complex64": _all_reduce_coalesced(C64),
    "all_gather_coalesced-float32": case_all_gather_coalesced,
    "barrier-timeout": case_barrier_timeout,
}


def body_vs_torch(name: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    case = VS_TORCH[name]
    _raw()  # created outside the attempts: a rank whose attempt fails must not leave its peers in new_group
    torch_out = _attempt(lambda: case("torch"))
    dist.barrier(group=_raw())
    xccl_out = _attempt(lambda: case("xccl"))
    dist.barrier(group=_raw())
    return torch_out, xccl_out


# --------------------------------------------------------------- the c10d path vs the eager path, on the world


def c10d_all_reduce(impl: str) -> Any:
    rank, _ = _me()
    t = _data(rank, (3, 2), F32)
    return (dist.all_reduce if impl == "c10d" else xccl.all_reduce)(t), t


def c10d_reduce_scatter_tensor(impl: str) -> Any:
    rank, n = _me()
    inp = _data(rank, (2 * n, 3), F32)
    out = torch.zeros(2, 3, dtype=F32)
    return (dist.reduce_scatter_tensor if impl == "c10d" else xccl.reduce_scatter_tensor)(out, inp), out


def c10d_all_gather_into_tensor(impl: str) -> Any:
    rank, n = _me()
    inp = _data(rank, (2, 3), F32)
    out = torch.zeros(2 * n, 3, dtype=F32)
    return (dist.all_gather_into_tensor if impl == "c10d" else xccl.all_gather_into_tensor)(out, inp), out


def c10d_all_to_all_single_splits(impl: str) -> Any:
    rank, n = _me()
    isz = [1 + rank + j for j in range(n)]
    osz = [1 + i + rank for i in range(n)]
    inp = _data(rank, (sum(isz), 2), F32)
    out = torch.zeros(sum(osz), 2, dtype=F32)
    return (dist.all_to_all_single if impl == "c10d" else xccl.all_to_all_single)(out, inp, osz, isz), out


def c10d_broadcast(impl: str) -> Any:
    rank, _ = _me()
    t = _data(rank, 4, F32)
    return (dist.broadcast if impl == "c10d" else xccl.broadcast)(t, src=1), t


def c10d_recv_any_source(impl: str) -> Any:
    rank, _ = _me()
    send, recv = (dist.send, dist.recv) if impl == "c10d" else (xccl.send, xccl.recv)
    buf = torch.zeros(3, dtype=F32)
    if rank == 1:
        return send(_data(1, 3, F32), dst=0, tag=9), buf
    if rank == 0:
        return recv(buf, tag=9), buf
    return None, buf


VS_EAGER: dict[str, Callable[[str], Any]] = {
    "all_reduce": c10d_all_reduce,
    "reduce_scatter_tensor": c10d_reduce_scatter_tensor,
    "all_gather_into_tensor": c10d_all_gather_into_tensor,
    "all_to_all_single-splits": c10d_all_to_all_single_splits,
    "broadcast": c10d_broadcast,
    "recv-any-source": c10d_recv_any_source,
}


def body_vs_eager(name: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    if not isinstance(dist.group.WORLD, xccl.XcclProcessGroup):
        raise AssertionError(f"the world is {dist.group.WORLD!r}, not xccl's process group")
    case = VS_EAGER[name]
    c10d_out = _attempt(lambda: case("c10d"))
    dist.barrier()
    xccl_out = _attempt(lambda: case("xccl"))
    dist.barrier()
    return c10d_out, xccl_out


# ------------------------------------------------------------- simulated Sophgo: xccl against a local reference


def body_sophgo() -> dict[str, bool]:
    """Complex all_reduce, recv from any source (host gloo), a batch_isend_irecv ring and all_reduce_coalesced
    through xccl on simulated SCCL; each checked against what this rank computes alone."""
    rank, n = _me()
    checked: dict[str, bool] = {}

    def same(what: str, got: Any, want: Any) -> None:
        if not _same(got, want):
            raise AssertionError(f"{what}: got {got!r}, want {want!r}")
        checked[what] = True

    t = _data(rank, (2, 3), C64)
    xccl.all_reduce(t)
    same("all_reduce complex64 sum", t, sum(_data(r, (2, 3), C64) for r in range(n)))

    buf = torch.zeros(3, dtype=C64)
    if rank == 1:
        xccl.send(_data(1, 3, C64), dst=0, tag=5)
    elif rank == 0:
        src = xccl.recv(buf, tag=5)
        same("recv without src: sender", src, 1)
        same("recv without src: data", buf, _data(1, 3, C64))
    dist.barrier()

    ops, got = _ring(xccl.P2POp, xccl.isend, xccl.irecv, None)
    for w in xccl.batch_isend_irecv(ops):
        w.wait()
    same("batch_isend_irecv ring", got, _data((rank - 1) % n, 5, F32))

    ts = _coalesced_inputs(F32)
    xccl.all_reduce_coalesced(ts)
    want = [sum(_data(r, 3, F32) for r in range(n)), sum(_data(r, (2, 2), F32, salt=7) for r in range(n))]
    same("all_reduce_coalesced", ts, want)
    return checked


# ---------------------------------------------------------------------------------------------------------------
# Comparison (in the parent and on the ranks)
# ---------------------------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Identical values: tensors of the same dtype, shape and bits; containers element by element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _assert_same_behaviour(outs: list[tuple[Any, ...]], what: str, names: tuple[str, str]) -> None:
    for rank, (ref, got) in enumerate(outs):
        where = f"{what}, rank {rank}: {names[0]} -> {ref!r}; {names[1]} -> {got!r}"
        if ref[0] == "raised":
            assert got[0] == "raised", f"{names[0]} raises, {names[1]} does not: {where}"
            assert any(f in ref[1] for f in FAMILY), f"{names[0]} raised outside {FAMILY}: {where}"
            assert any(f in got[1] for f in FAMILY), f"{names[1]} raised outside {FAMILY}: {where}"
        else:
            assert got[0] == "ok", f"{names[1]} raises where {names[0]} does not: {where}"
            assert _same(ref[1], got[1]), f"different results: {where}"


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VS_TORCH)
def test_xccl_call_behaves_as_torch_on_the_vendor_group(rank_pools: Any, name: str) -> None:
    outs = rank_pools.get(2, fallback="emulate").run_ok(body_vs_torch, name, timeout=TIMEOUT)
    _assert_same_behaviour(outs, name, ("torch.distributed on the vendor group", "xccl"))
    if name.endswith("-max"):
        # torch refuses MAX on complex (ValueError); xccl refuses it before communicating, typed.
        for rank, (_, got) in enumerate(outs):
            assert got[0] == "raised" and "UnsupportedCollective" in got[1], f"rank {rank}: {got!r}"
    else:
        assert all(ref[0] == "ok" for ref, _ in outs), f"torch itself refused {name}: {outs!r}"
    if "any-source" in name:
        ret = outs[0][0][1][0]  # rank 0's torch value: the sender's rank
        assert ret == 1, ret
        assert outs[0][1][1][0] == 1, outs[0][1]
    if name.startswith("batch_isend_irecv"):
        assert all(ref[1][0] == 2 for ref, _ in outs), outs  # one handle per operation, as torch returns


@pytest.mark.parametrize("plugin", ["cpu", "sophgo"])
@pytest.mark.parametrize("name", list(VS_EAGER))
def test_torch_distributed_on_the_world_matches_xccl(rank_pools: Any, name: str, plugin: str) -> None:
    env = SOPHGO if plugin == "sophgo" else {}
    outs = rank_pools.get(2, env=env, fallback="emulate").run_ok(body_vs_eager, name, timeout=TIMEOUT)
    assert all(ref[0] == "ok" for ref, _ in outs), f"the c10d path failed: {outs!r}"
    _assert_same_behaviour(outs, name, ("torch.distributed on xccl's world", "xccl"))
    if name == "recv-any-source":
        assert outs[0][0][1][0] == 1 and outs[0][1][1][0] == 1, outs


def body_late_barrier() -> tuple[str, float, list[float]]:
    """Rank 0 waits in a barrier with a 1 s timeout while rank 1 arrives 3 s late; then an all_reduce."""
    import datetime
    import time

    rank, _ = _me()
    start = time.monotonic()
    outcome = "no error"
    if rank == 0:
        try:
            xccl.barrier(timeout=datetime.timedelta(seconds=1))
        except xccl.CollectiveTimeout:
            outcome = "CollectiveTimeout"
        except Exception as exc:  # reported to the parent
            outcome = f"{type(exc).__name__}: {exc}"
    else:
        time.sleep(3.0)
        xccl.barrier()
    waited = time.monotonic() - start
    t = torch.full((2,), float(rank + 1))
    xccl.all_reduce(t)  # the late rank's arrival completed rank 0's barrier: the group is in step again
    return outcome, waited, t.tolist()


def test_barrier_timeout_bounds_the_wait_and_the_group_survives(rank_pools: Any) -> None:
    outs = rank_pools.get(2, fallback="emulate").run_ok(body_late_barrier, timeout=TIMEOUT)
    outcome, waited, _ = outs[0]
    assert outcome == "CollectiveTimeout", outs
    assert 0.9 <= waited < 2.5, f"rank 0 waited {waited:.2f} s on a 1 s barrier timeout"
    assert all(o[2] == [3.0, 3.0] for o in outs), outs


def test_sophgo_simulation_runs_the_dropin_calls(rank_pools: Any) -> None:
    outs = rank_pools.get(2, env=SOPHGO, fallback="emulate").run_ok(body_sophgo, timeout=TIMEOUT)
    assert "recv without src: sender" in outs[0], outs
    assert all(len(o) >= 3 and all(o.values()) for o in outs), outs
