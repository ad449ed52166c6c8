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

import re
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
#: ``xccl.InvalidArgument`` a ValueError, ``xccl.InvalidArgumentType`` a TypeError too).
FAMILY = ("ValueError", "RuntimeError", "TypeError")

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


def _attempt(fn: Callable[[], Any], strict: bool = False) -> tuple[Any, ...]:
    """``("ok", value)``, or ``("raised", class names most derived first, message)``.

    ``strict``: torch's deprecation warnings are errors (xccl's side: neither xccl's old names nor its own calls
    into torch may warn).
    """
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates some of these entry points (all_reduce_coalesced, all_gather_into_tensor, ...)
            warnings.simplefilter("error" if strict else "ignore", FutureWarning)
            warnings.simplefilter("error" if strict else "ignore", DeprecationWarning)
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


def case_all_gather_single(impl: str) -> Any:
    rank, n = _me()
    out = torch.zeros(2 * n, 3, dtype=F32)
    inp = _data(rank, (2, 3), F32)
    if impl == "torch":
        return dist.all_gather_single(out, inp, group=_raw()), out
    return xccl.all_gather_single(out, inp), out


def case_reduce_scatter_single(impl: str) -> Any:
    rank, n = _me()
    out = torch.zeros(2, 3, dtype=C64)
    inp = _data(rank, (2 * n, 3), C64)
    if impl == "torch":
        return dist.reduce_scatter_single(out, inp, group=_raw()), out
    return xccl.reduce_scatter_single(out, inp), out


def case_old_names(impl: str) -> Any:
    """all_gather_into_tensor and reduce_scatter_tensor: torch 2.13 warns (ignored on its side here), xccl must not."""
    rank, n = _me()
    gathered, reduced = torch.zeros(n * 4, dtype=F32), torch.zeros(4, dtype=F32)
    inp = _data(rank, 4, F32)
    if impl == "torch":
        dist.all_gather_into_tensor(gathered, inp, group=_raw())
        dist.reduce_scatter_tensor(reduced, _data(rank, 4 * n, F32), group=_raw())
    else:
        xccl.all_gather_into_tensor(gathered, inp)
        xccl.reduce_scatter_tensor(reduced, _data(rank, 4 * n, F32))
    return gathered, reduced


def case_monitored_barrier(impl: str) -> Any:
    """Every rank arrives: None, as torch's."""
    import datetime

    limit = datetime.timedelta(seconds=30)
    if impl == "torch":
        return dist.monitored_barrier(group=_raw(), timeout=limit, wait_all_ranks=True)
    return xccl.monitored_barrier(timeout=limit, wait_all_ranks=True)


# Calls torch.distributed refuses itself before communicating (torch 2.13's distributed_c10d.py), made so that
# every rank refuses: xccl must raise the same builtin (TypeError or ValueError), its message containing torch's.


def _refusal(torch_call: Callable[[], Any], xccl_call: Callable[[], Any]) -> Callable[[str], Any]:
    return lambda impl: torch_call() if impl == "torch" else xccl_call()


def _both(fn: Callable[[Any, dict[str, Any]], Any]) -> Callable[[str], Any]:
    """A refusal made the same way through both: ``fn(module, group kwargs)``."""
    return lambda impl: fn(dist, {"group": _raw()}) if impl == "torch" else fn(xccl, {})


_NOT_A_TENSOR = [1.0, 2.0]
REFUSALS: dict[str, Callable[[str], Any]] = {
    "refuse-all_reduce-not-a-tensor": _both(lambda m, g: m.all_reduce(_NOT_A_TENSOR, **g)),
    "refuse-all_reduce-complex-max": _both(lambda m, g: m.all_reduce(_data(0, 2, C64), op=MAX, **g)),
    "refuse-all_gather-list-not-a-list": _both(lambda m, g: m.all_gather(torch.zeros(2), torch.zeros(2), **g)),
    "refuse-all_gather-mixed-dtypes": _both(lambda m, g: m.all_gather(
        [torch.zeros(2) for _ in range(_me()[1])], torch.zeros(2, dtype=torch.int64), **g)),
    "refuse-all_gather_single-not-a-tensor": _both(lambda m, g: m.all_gather_single(torch.zeros(2), 3, **g)),
    "refuse-reduce_scatter_single-not-a-tensor": _both(lambda m, g: m.reduce_scatter_single(None, torch.zeros(2), **g)),
    "refuse-broadcast-src-and-group-src": _both(lambda m, g: m.broadcast(torch.zeros(2), src=0, group_src=0, **g)),
    "refuse-broadcast-src-not-a-member": _both(lambda m, g: m.broadcast(torch.zeros(2), src=_me()[1] + 3, **g)),
    "refuse-gather-no-list-on-dst": _both(lambda m, g: m.gather(torch.zeros(2), None, dst=_me()[0], **g)),
    "refuse-gather-list-on-non-dst": _both(lambda m, g: m.gather(
        torch.zeros(2), [torch.zeros(2) for _ in range(_me()[1])], dst=(_me()[0] + 1) % _me()[1], **g)),
    "refuse-scatter-list-on-non-src": _both(lambda m, g: m.scatter(
        torch.zeros(2), [torch.zeros(2) for _ in range(_me()[1])], src=(_me()[0] + 1) % _me()[1], **g)),
    "refuse-send-to-self": _both(lambda m, g: m.send(torch.zeros(2), dst=_me()[0], **g)),
    "refuse-p2pop-not-isend": _refusal(lambda: dist.P2POp(dist.all_reduce, torch.zeros(2), 0, _raw()),
                                       lambda: xccl.P2POp(dist.all_reduce, torch.zeros(2), 0)),
    "refuse-p2pop-not-a-tensor": _refusal(lambda: dist.P2POp(dist.isend, [1.0], 0, _raw()),
                                          lambda: xccl.P2POp(xccl.isend, [1.0], 0)),  # type: ignore[arg-type]
    "refuse-batch-not-p2pops": _both(lambda m, g: m.batch_isend_irecv([1, 2])),
    "refuse-monitored_barrier-timeout-type": _both(lambda m, g: m.monitored_barrier(timeout="soon", **g)),
}


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
    "all_gather_single": case_all_gather_single,
    "reduce_scatter_single-complex64": case_reduce_scatter_single,
    "old-names-without-warning": case_old_names,
    "monitored_barrier": case_monitored_barrier,
    **REFUSALS,
}


def body_vs_torch(name: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    case = VS_TORCH[name]
    _raw()  # created outside the attempts: a rank whose attempt fails must not leave its peers in new_group
    torch_out = _attempt(lambda: case("torch"))
    dist.barrier(group=_raw())
    xccl_out = _attempt(lambda: case("xccl"), strict=True)
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


def c10d_all_gather_single(impl: str) -> Any:
    rank, n = _me()
    inp = _data(rank, (2, 3), F32)
    out = torch.zeros(2 * n, 3, dtype=F32)
    return (dist.all_gather_single if impl == "c10d" else xccl.all_gather_single)(out, inp), out


def c10d_reduce_scatter_single(impl: str) -> Any:
    rank, n = _me()
    inp = _data(rank, (2 * n, 3), F32)
    out = torch.zeros(2, 3, dtype=F32)
    return (dist.reduce_scatter_single if impl == "c10d" else xccl.reduce_scatter_single)(out, inp), out


VS_EAGER: dict[str, Callable[[str], Any]] = {
    "all_reduce": c10d_all_reduce,
    "all_gather_single": c10d_all_gather_single,
    "reduce_scatter_single": c10d_reduce_scatter_single,
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


BUILTINS = ("TypeError", "ValueError", "RuntimeError")


def _text(message: str) -> str:
    """A message without object reprs (``<... at 0x...>``, ``<class 'list'>``) and with its whitespace normalised."""
    return re.sub(r"\s+", " ", re.sub(r"<[^<>]*>", "", message)).strip()


def _assert_same_refusal(ref: tuple[Any, ...], got: tuple[Any, ...], where: str) -> None:
    """xccl's error is torch's builtin (the first of TypeError, ValueError, RuntimeError in torch's class's MRO),
    typed, and its message contains torch's."""
    builtin = next(b for b in ref[1] if b in BUILTINS)
    assert builtin in got[1], f"torch raised {builtin}, xccl's error is not one: {where}"
    assert "XcclError" in got[1], f"xccl's error is not typed: {where}"
    assert _text(ref[2]) in _text(got[2]), f"xccl's message lacks torch's: {where}"


def _assert_same_behaviour(outs: list[tuple[Any, ...]], what: str, names: tuple[str, str]) -> None:
    for rank, (ref, got) in enumerate(outs):
        where = f"{what}, rank {rank}: {names[0]} -> {ref!r}; {names[1]} -> {got!r}"
        if ref[0] == "raised":
            assert got[0] == "raised", f"{names[0]} raises, {names[1]} does not: {where}"
            assert any(f in ref[1] for f in FAMILY), f"{names[0]} raised outside {FAMILY}: {where}"
            assert any(f in got[1] for f in FAMILY), f"{names[1]} raised outside {FAMILY}: {where}"
            if what in REFUSALS or what.endswith("-max"):
                _assert_same_refusal(ref, got, where)
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
    if name.endswith("-max") or name in REFUSALS:
        # torch refuses these before communicating (a ValueError or TypeError); xccl too, typed and the same builtin.
        for rank, (ref, got) in enumerate(outs):
            assert ref[0] == "raised", f"rank {rank}: torch did not refuse {name}: {ref!r}"
            assert got[0] == "raised" and "InvalidArgument" in got[1], f"rank {rank}: {got!r}"
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


# ------------------------------------------------------------------------------------------- monitored_barrier


def body_monitored_barrier_late(wait_all_ranks: bool) -> dict[str, Any]:
    """Odd ranks arrive 2.5 s late at a monitored barrier whose timeout is 1 s; then every rank all_reduces."""
    import datetime
    import time

    rank, _ = _me()
    start = time.monotonic()
    if rank % 2:
        time.sleep(2.5)
    out: dict[str, Any] = {"raised": "", "message": "", "ranks": (), "waited": 0.0}
    arrived = time.monotonic()
    try:
        xccl.monitored_barrier(timeout=datetime.timedelta(seconds=1) if rank % 2 == 0 else None,
                               wait_all_ranks=wait_all_ranks)
    except xccl.CollectiveTimeout as exc:
        out.update(raised=type(exc).__name__, message=str(exc), ranks=exc.ranks)
    out["waited"] = time.monotonic() - arrived
    out["total"] = time.monotonic() - start
    t = torch.ones(2)
    xccl.all_reduce(t)  # the group is still usable
    out["after"] = t.tolist()
    return out


@pytest.mark.parametrize(("world_size", "wait_all_ranks"), [(2, False), (4, True), (4, False)],
                         ids=["2ranks", "4ranks-wait-all", "4ranks-fail-fast"])
def test_monitored_barrier_names_the_late_ranks_on_every_rank(rank_pools: Any, world_size: int,
                                                               wait_all_ranks: bool) -> None:
    outs = rank_pools.get(world_size, fallback="emulate").run_ok(body_monitored_barrier_late, wait_all_ranks,
                                                                 timeout=TIMEOUT)
    late = tuple(r for r in range(world_size) if r % 2)
    named = late if wait_all_ranks else late[:1]
    root = outs[0]
    assert root["raised"] == "CollectiveTimeout" and root["ranks"] == named, root
    torch_text = f"Rank{'s' if len(named) > 1 else ''} {', '.join(map(str, named))} failed to pass monitoredBarrier in 1000 ms"
    assert "[Rank 0]: " + torch_text in root["message"], root
    # A second per late rank with wait_all_ranks (each gets the whole timeout, as torch's), else one; the slack is
    # for a loaded machine.
    assert 0.9 <= root["waited"] < (1.0 * len(late) if wait_all_ranks else 1.0) + 5.0, root
    for rank, out in enumerate(outs[1:], start=1):
        # Every other rank raises at once (no wait for the group's timeout), naming the late ranks.
        assert out["raised"] == "CollectiveTimeout" and set(out["ranks"]) >= set(named), (rank, out)
        assert out["waited"] < 2.0 * len(late) + 5.0, (rank, out)  # not the collective timeout (300 s)
    assert all(o["after"] == [float(world_size)] * 2 for o in outs), outs


# ---------------------------------------------------------------------------- dispatcher-level tools: CommDebugMode

_GLOO: dict[int, Any] = {}


def _gloo() -> Any:
    """A plain gloo group over every rank (made once per world; every rank calls this in the same body)."""
    key = id(dist.group.WORLD)
    if key not in _GLOO:
        _GLOO[key] = dist.new_group(backend="gloo")
    return _GLOO[key]


def _comm_calls() -> dict[str, Callable[[Any], Any]]:
    """One call per collective, made through ``torch.distributed`` on the group given (``None``: xccl's world)."""
    rank, n = _me()
    t = lambda: _data(rank, 4, F32)  # noqa: E731 - a fresh tensor per call
    peer = rank ^ 1

    def p2p(g: Any) -> None:
        for step in ("send", "recv") if rank % 2 == 0 else ("recv", "send"):
            if step == "send":
                dist.send(t(), dst=peer, group=g)
            else:
                dist.recv(torch.empty(4), src=peer, group=g)

    return {
        "all_reduce": lambda g: dist.all_reduce(t(), group=g),
        "all_reduce async": lambda g: dist.all_reduce(t(), group=g, async_op=True).wait(),
        "all_reduce avg": lambda g: dist.all_reduce(t(), op=AVG, group=g),
        "all_reduce_coalesced": lambda g: dist.all_reduce_coalesced([t(), t()], group=g),
        "all_gather": lambda g: dist.all_gather([torch.empty(4) for _ in range(n)], t(), group=g),
        "all_gather_single": lambda g: dist.all_gather_single(torch.empty(4 * n), t(), group=g),
        "reduce_scatter": lambda g: dist.reduce_scatter(torch.empty(4), [t() for _ in range(n)], group=g),
        "reduce_scatter_single": lambda g: dist.reduce_scatter_single(torch.empty(4), _data(rank, 4 * n, F32), group=g),
        "all_to_all": lambda g: dist.all_to_all([torch.empty(4) for _ in range(n)], [t() for _ in range(n)], group=g),
        "all_to_all_single": lambda g: dist.all_to_all_single(torch.empty(4 * n), _data(rank, 4 * n, F32), group=g),
        "broadcast": lambda g: dist.broadcast(t(), src=0, group=g),
        "reduce": lambda g: dist.reduce(t(), dst=n - 1, group=g),
        "gather": lambda g: dist.gather(t(), [torch.empty(4) for _ in range(n)] if rank == 0 else None, dst=0, group=g),
        "scatter": lambda g: dist.scatter(torch.empty(4), [t() for _ in range(n)] if rank == 0 else None, src=0,
                                          group=g),
        "barrier": lambda g: dist.barrier(group=g),
        "send/recv": p2p,
    }


def body_comm_debug_mode() -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """CommDebugMode's counts for each collective on a plain gloo group and on xccl's world (through
    torch.distributed, and xccl's own all_reduce / reduce_scatter_single)."""
    from torch.distributed.tensor.debug import CommDebugMode

    gloo = _gloo()
    _, n = _me()

    def counts(fn: Callable[[], Any]) -> dict[str, int]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's deprecated all_reduce_coalesced
            with CommDebugMode() as mode:
                fn()
        dist.barrier(group=gloo)
        return {str(k): v for k, v in mode.get_comm_counts().items()}

    out = {name: (counts(lambda c=call: c(gloo)), counts(lambda c=call: c(None)))  # type: ignore[misc]
           for name, call in _comm_calls().items()}
    out["xccl.all_reduce"] = (counts(lambda: dist.all_reduce(torch.ones(4), group=gloo)),
                              counts(lambda: xccl.all_reduce(torch.ones(4))))
    out["xccl.reduce_scatter_single"] = (
        counts(lambda: dist.reduce_scatter_single(torch.empty(4), torch.ones(4 * n), group=gloo)),
        counts(lambda: xccl.reduce_scatter_single(torch.empty(4), torch.ones(4 * n))))
    return out


def body_profiler_names() -> list[str]:
    """The c10d op names torch.profiler records for dist.all_reduce / reduce_scatter_single on xccl's world."""
    from torch.profiler import profile

    _, n = _me()
    with profile() as prof:
        dist.all_reduce(torch.ones(4))
        dist.reduce_scatter_single(torch.empty(4), torch.ones(4 * n))
    return sorted({e.name for e in prof.events() if e.name.startswith("c10d::")})


@pytest.mark.parametrize("plugin", ["cpu", "sophgo", "ascend"])
def test_comm_debug_mode_counts_xccl_collectives_as_gloo_s(rank_pools: Any, plugin: str) -> None:
    env = {"cpu": {}, "sophgo": SOPHGO, "ascend": {"XCCL_SIMULATE": "ascend"}}[plugin]
    pool = rank_pools.get(2, env=env, fallback="emulate")
    for rank, out in enumerate(pool.run_ok(body_comm_debug_mode, timeout=TIMEOUT)):
        if plugin == "ascend":
            # torch_npu's dist.gather (simulated: the SDK's patch) gathers on an NPU group with an all_gather of
            # the group's HCCL backend, which CommDebugMode sees too; the gloo group takes torch's gather.
            assert out.pop("gather")[1].get("c10d.allgather_") == 1, f"rank {rank}: torch_npu's gather: {out}"
        differ = {name: pair for name, pair in out.items() if pair[0] != pair[1]}
        assert not differ, f"rank {rank}: counts (gloo, xccl) differ: {differ}"
        assert out["all_reduce"][1] == {"c10d.allreduce_": 1}, out["all_reduce"]
    for rank, names in enumerate(pool.run_ok(body_profiler_names, timeout=TIMEOUT)):
        assert {"c10d::allreduce_", "c10d::_reduce_scatter_base_"} <= set(names), f"rank {rank}: {names}"


def test_both_process_groups_answer_every_name_of_every_c10d_method() -> None:
    """xccl's process group and the simulated vendor group implement each c10d method under every name torch and
    the trampoline call it by (one list: ``C10D_METHODS``); an alias reaches the method it names."""
    from xccl.collectives._process_group import XcclProcessGroup
    from xccl.plugin._c10d import C10D_METHODS
    from xccl.plugin._sim import SimulatedProcessGroup

    for group in (XcclProcessGroup, SimulatedProcessGroup):
        for method, aliases in C10D_METHODS.items():
            names = {method, *aliases}
            assert names <= set(vars(group)), f"{group.__name__} lacks {sorted(names - set(vars(group)))}"
    for method, aliases in C10D_METHODS.items():
        assert all(vars(XcclProcessGroup)[a] is vars(XcclProcessGroup)[method] for a in aliases), method
