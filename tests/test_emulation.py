"""The emulation layer against gloo's native collectives and against a reference every rank computes locally.

One body, :func:`body_matrix`, runs every public collective x dtype x reduce op x ``async_op`` on the pool it is
sent to and returns, per case, the result, the reference and whether the inputs stayed untouched. The same body
runs on three pools with the same inputs:

* ``cpu`` with ``fallback="emulate"``: gloo's native ops (the only emulations are the HCCL extras and integer avg);
* ``gloo-emulated``: every op that has an emulation is emulated (reduce_scatter_tensor via all_to_all, list
  all_to_all via all_to_all_single, uneven all_to_all_single via padding, send/recv via the host gloo group,
  avg via sum, bool via uint8, ...);
* ``gloo-emulated-ar``: reduce_scatter via all_reduce + slice (only the reduce-scatter family is run there; at
  4 ranks that composition's kernel is called directly on the gloo-emulated pool, sparing a third 4-rank pool).

Each case's inputs come from a generator seeded by (case, group rank), so every rank can build every rank's input
and compute the reference. The parent then checks, per pool, that results equal the reference and that a case was
refused (``UnsupportedCollective`` on every rank) exactly where the pool's capability table says so; then that the
emulated results equal the native ones; and that every emulation in ``xccl.ops._emulations.EMULATIONS`` was exercised.

Further bodies check that emulated async handles complete by polling ``is_completed()`` alone, and that what an
emulation cannot do is refused before anything is sent.
"""

from __future__ import annotations

import datetime
import functools
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl import Collective as C
from xccl import Level
from xccl.collectives._dispatch import block
from xccl.collectives._groups import state_of
from xccl.ops._emulations import BY_KEY, EMULATIONS

DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
REDUCE_OPS = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor")
_REDOP = {name: getattr(dist.ReduceOp, name.upper()) for name in REDUCE_OPS}
ROWS, COLS = 2, 3
#: Split sizes of the uneven all_gather / reduce_scatter, per group size (a zero among them at 4 ranks).
UNEVEN = {2: [1, 3], 4: [2, 0, 3, 1]}
#: Ops run on the gloo-emulated-ar pool, whose only difference is reduce_scatter via all_reduce + slice.
RS_FAMILY = ("reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_tensor_uneven")
BODY_TIMEOUT = 120.0
#: Cases the cpu pool skips. None now: gloo's list alltoall refuses tensors of different sizes per rank, but the cpu
#: table prefers the all_to_all_single composition for every list all_to_all, which takes them.
NATIVE_GAPS: tuple[str, ...] = ()
#: Cases a table's top-level entry allows but a building block of the emulation does not: on gloo-emulated-ar,
#: reduce_scatter runs through all_reduce, which has no bitwise ops there. Dispatch must refuse them up front.
BLOCK_REFUSALS = {
    "gloo-emulated-ar": {(name, d, op) for name in RS_FAMILY for d in ("torch.int64", "torch.bool")
                         for op in ("band", "bor", "bxor")},
}


def count(i: int, j: int) -> int:
    """Rows (elements, for all_to_all_v) group rank ``i`` sends to ``j`` in the uneven all-to-alls.

    Row 0 and column 0 are all ones, so rank 0's own splits are uniform while its peers' are not: a rank choosing
    the even kernel from its own sizes alone would run a different collective from its peers and hang.
    """
    return 1 + (i * j) % 3


def reduce_ops(dtype: torch.dtype) -> tuple[str, ...]:
    """The reduce ops meaningful for ``dtype``: bitwise ones only for integers and bool, avg not for bool."""
    if dtype.is_floating_point:
        return ("sum", "product", "min", "max", "avg")
    if dtype is torch.bool:
        return tuple(op for op in REDUCE_OPS if op != "avg")
    return REDUCE_OPS


def data(tag: str, rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """The input of group rank ``rank`` for case ``tag``: the same on every rank that asks."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{tag}|{rank}".encode()))
    if dtype.is_floating_point:
        # Positive values in [0.5, 1.5): no cancellation, so a relative tolerance bounds the rounding (see tol()).
        return (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    # Small signed integers: products of four stay tiny, bitwise ops see negative numbers too.
    return torch.randint(-3, 4, tuple(shape), generator=gen, dtype=dtype)


def reduce_ref(xs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction of ``xs`` (float64 for float sums, products and averages; the dtype otherwise)."""
    dtype = xs[0].dtype
    stack = torch.stack(list(xs))
    if dtype.is_floating_point:
        s = stack.double()
        exact = {"sum": s.sum(0), "product": s.prod(0), "avg": s.mean(0)}
        return exact[op] if op in exact else (stack.amin(0) if op == "min" else stack.amax(0))
    if dtype is torch.bool:
        if op in ("sum", "max", "bor"):
            return stack.any(0)
        if op in ("product", "min", "band"):
            return stack.all(0)
        return functools.reduce(torch.logical_xor, list(xs))
    bitwise = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
    if op in bitwise:
        return functools.reduce(bitwise[op], list(xs))
    if op == "avg":
        return torch.div(stack.sum(0), len(xs), rounding_mode="trunc")
    return {"sum": stack.sum(0), "product": stack.prod(0), "min": stack.amin(0), "max": stack.amax(0)}[op]


def tol(dtype: torch.dtype, world_size: int) -> float:
    """Relative tolerance of a float sum, product or average over ``world_size`` ranks.

    Why: the backend reduces in an order of its choosing (ring, halving-doubling, rank order in the emulations),
    in ``dtype``. Each of the ``world_size - 1`` steps rounds by at most half an ulp of a partial result that, with
    positive inputs, is no larger than the final one, and the final rounding adds half an ulp: the error stays
    below ``world_size * eps`` relative. Emulated vs native: each is within that of the exact value, so twice it.
    """
    return world_size * torch.finfo(dtype).eps


# ------------------------------------------------------------------------------------------------- rank side


@dataclass(frozen=True)
class Env:
    """The group a body runs on, from this rank's point of view."""

    group: Any
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: This rank's rank within the group.
    r: int
    #: The reduce_scatter_tensor to call: the public one, or an emulation's kernel called directly.
    reduce_scatter_tensor: Callable[..., Any] = xccl.reduce_scatter_tensor

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def me(self) -> int:
        return self.ranks[self.r]


def _done(ret: Any, a: bool) -> None:
    """Wait for an async op's handle; a sync op returns None as torch.distributed's do."""
    if a:
        if ret is None or not hasattr(ret, "wait"):
            raise AssertionError(f"async_op=True returned {ret!r}, not a work handle")
        ret.wait()
    elif ret is not None:
        raise AssertionError(f"async_op=False returned {ret!r}, expected None")


# Each case function runs one call and returns (result, reference, inputs that must be unchanged, their copies).
Case = tuple[Any, Any, list[torch.Tensor], list[torch.Tensor]]


def _pristine(*ts: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return list(ts), [t.clone() for t in ts]


def c_all_reduce(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    t = xs[e.r].clone()
    _done(xccl.all_reduce(t, _REDOP[op], e.group, a), a)
    return t, reduce_ref(xs, op), [], []


def c_reduce(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    root = e.ranks[-1]
    t = xs[e.r].clone()
    _done(xccl.reduce(t, root, _REDOP[op], e.group, a), a)
    return (t, reduce_ref(xs, op), [], []) if e.me == root else (None, None, [], [])


def c_reduce_scatter_tensor(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    xs = [data(tag, j, (e.n * ROWS, COLS), dtype) for j in range(e.n)]
    out = torch.empty(ROWS, COLS, dtype=dtype)
    _done(e.reduce_scatter_tensor(out, xs[e.r], _REDOP[op], e.group, a), a)
    return out, reduce_ref([x.split(ROWS)[e.r] for x in xs], op), *_pristine(xs[e.r])


def c_reduce_scatter(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    xs = [data(tag, j, (e.n * ROWS, COLS), dtype) for j in range(e.n)]
    ins = [c.clone() for c in xs[e.r].split(ROWS)]
    out = torch.empty(ROWS, COLS, dtype=dtype)
    _done(xccl.reduce_scatter(out, ins, _REDOP[op], e.group, a), a)
    return out, reduce_ref([x.split(ROWS)[e.r] for x in xs], op), *_pristine(*ins)


def c_reduce_scatter_tensor_uneven(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    sizes = UNEVEN[e.n]
    xs = [data(tag, j, (sum(sizes), COLS), dtype) for j in range(e.n)]
    out = torch.empty(sizes[e.r], COLS, dtype=dtype)
    _done(xccl.reduce_scatter_tensor_uneven(out, xs[e.r], sizes, _REDOP[op], e.group, a), a)
    return out, reduce_ref([x.split(sizes)[e.r] for x in xs], op), *_pristine(xs[e.r])


def c_all_gather(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    outs = [torch.empty(ROWS, COLS, dtype=dtype) for _ in range(e.n)]
    _done(xccl.all_gather(outs, xs[e.r], e.group, a), a)
    return torch.cat(outs), torch.cat(xs), *_pristine(xs[e.r])


def c_all_gather_into_tensor(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    out = torch.empty(e.n * ROWS, COLS, dtype=dtype)
    _done(xccl.all_gather_into_tensor(out, xs[e.r], e.group, a), a)
    return out, torch.cat(xs), *_pristine(xs[e.r])


def c_all_gather_into_tensor_uneven(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    sizes = UNEVEN[e.n]
    xs = [data(tag, j, (sizes[j], COLS), dtype) for j in range(e.n)]
    out = torch.empty(sum(sizes), COLS, dtype=dtype)
    _done(xccl.all_gather_into_tensor_uneven(out, xs[e.r], sizes, e.group, a), a)
    return out, torch.cat(xs), *_pristine(xs[e.r])


def _rows(e: Env, uneven: bool) -> list[list[int]]:
    return [[count(i, j) if uneven else ROWS for j in range(e.n)] for i in range(e.n)]


def _a2a_ref(xs: Sequence[torch.Tensor], m: list[list[int]], r: int) -> torch.Tensor:
    return torch.cat([x.split(m[j])[r] for j, x in enumerate(xs)])


def _c_all_to_all(uneven: bool) -> Callable[..., Case]:
    def case(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
        m = _rows(e, uneven)
        xs = [data(tag, j, (sum(m[j]), COLS), dtype) for j in range(e.n)]
        ins = [c.clone() for c in xs[e.r].split(m[e.r])]
        outs = [torch.empty(m[j][e.r], COLS, dtype=dtype) for j in range(e.n)]
        _done(xccl.all_to_all(outs, ins, e.group, a), a)
        return torch.cat(outs), _a2a_ref(xs, m, e.r), *_pristine(*ins)

    return case


def _c_all_to_all_single(uneven: bool) -> Callable[..., Case]:
    def case(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
        m = _rows(e, uneven)
        xs = [data(tag, j, (sum(m[j]), COLS), dtype) for j in range(e.n)]
        col = [m[j][e.r] for j in range(e.n)]
        out = torch.empty(sum(col), COLS, dtype=dtype)
        splits = (col, m[e.r]) if uneven else (None, None)
        _done(xccl.all_to_all_single(out, xs[e.r], *splits, e.group, a), a)
        return out, _a2a_ref(xs, m, e.r), *_pristine(xs[e.r])

    return case


def _c_all_to_all_v(uniform: bool) -> Callable[..., Case]:
    def case(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
        m = [[3 if uniform else count(i, j) for j in range(e.n)] for i in range(e.n)]
        xs = [data(tag, j, (sum(m[j]),), dtype) for j in range(e.n)]
        out = torch.empty(sum(m[j][e.r] for j in range(e.n)), dtype=dtype)
        _done(xccl.all_to_all_v(out, xs[e.r], m, e.group, a), a)
        return out, _a2a_ref(xs, m, e.r), *_pristine(xs[e.r])

    return case


def c_broadcast(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    t = xs[e.r].clone()
    _done(xccl.broadcast(t, e.ranks[-1], e.group, a), a)
    return t, xs[-1], [], []


def c_gather(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    root = e.ranks[0]
    lst = [torch.empty(ROWS, COLS, dtype=dtype) for _ in range(e.n)] if e.me == root else None
    _done(xccl.gather(xs[e.r], lst, root, e.group, a), a)
    return (torch.cat(lst), torch.cat(xs), *_pristine(xs[e.r])) if lst is not None else (None, None, [], [])


def c_scatter(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    root = e.ranks[-1]
    full = data(tag, e.n - 1, (e.n * ROWS, COLS), dtype)
    lst = [c.clone() for c in full.split(ROWS)] if e.me == root else None
    out = torch.empty(ROWS, COLS, dtype=dtype)
    _done(xccl.scatter(out, lst, root, e.group, a), a)
    return out, full.split(ROWS)[e.r], *_pristine(*(lst or []))


def c_send_recv(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    """A ring: send to the next group rank, receive from the previous (even ranks send first when blocking)."""
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    nxt, prev = e.ranks[(e.r + 1) % e.n], e.ranks[(e.r - 1) % e.n]
    buf = torch.empty(ROWS, COLS, dtype=dtype)
    if a:
        works = [xccl.irecv(buf, prev, e.group), xccl.isend(xs[e.r], nxt, e.group)]
        for w in works:
            _done(w, True)
    else:
        for step in (("send", "recv") if e.r % 2 == 0 else ("recv", "send")):
            if step == "send":
                _done(xccl.send(xs[e.r], nxt, e.group), False)
            elif xccl.recv(buf, prev, e.group) != prev:
                raise AssertionError("recv did not return its source rank")
    return buf, xs[(e.r - 1) % e.n], *_pristine(xs[e.r])


def c_recv_any_source(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    """Every rank but the last sends to the last, which receives from any source and checks each sender."""
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    last = e.ranks[-1]
    if e.me != last:
        _done(xccl.send(xs[e.r], last, e.group), False)
        # A receive from any source takes the first message that arrives: keep the next case's out of this one.
        xccl.barrier(e.group)
        return None, None, *_pristine(xs[e.r])
    got = {}
    for _ in range(e.n - 1):
        buf = torch.empty(ROWS, COLS, dtype=dtype)
        if a:
            work = xccl.irecv(buf, None, e.group)
            work.wait()
            sender = e.ranks[work.source_rank()]
        else:
            sender = xccl.recv(buf, group=e.group)
        got[sender] = buf
    xccl.barrier(e.group)
    order = sorted(got)
    return torch.cat([got[s] for s in order]), torch.cat([xs[e.ranks.index(s)] for s in order]), [], []


def c_all_reduce_coalesced(e: Env, tag: str, dtype: torch.dtype, op: str, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    ys = [data(tag + "y", j, (COLS,), dtype) for j in range(e.n)]
    ts = [xs[e.r].clone(), ys[e.r].clone()]
    _done(xccl.all_reduce_coalesced(ts, _REDOP[op], e.group, a), a)
    return torch.cat([t.reshape(-1) for t in ts]), torch.cat([reduce_ref(xs, op).reshape(-1), reduce_ref(ys, op)]), [], []


def c_all_gather_coalesced(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xs = [data(tag, j, (ROWS, COLS), dtype) for j in range(e.n)]
    ys = [data(tag + "y", j, (COLS,), dtype) for j in range(e.n)]
    outs = [[torch.empty(ROWS, COLS, dtype=dtype), torch.empty(COLS, dtype=dtype)] for _ in range(e.n)]
    _done(xccl.all_gather_coalesced(outs, [xs[e.r], ys[e.r]], e.group, a), a)
    got = torch.cat([t.reshape(-1) for row in outs for t in row])
    want = torch.cat([t.reshape(-1) for j in range(e.n) for t in (xs[j], ys[j])])
    return got, want, *_pristine(xs[e.r], ys[e.r])


def c_barrier(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    _done(xccl.barrier(e.group, a), a)
    return torch.ones(1), torch.ones(1), [], []


def c_monitored_barrier(e: Env, tag: str, dtype: torch.dtype, a: bool) -> Case:
    xccl.monitored_barrier(e.group, datetime.timedelta(seconds=60), wait_all_ranks=True)  # blocking only, as torch's
    return torch.ones(1), torch.ones(1), [], []


#: Case name -> (the Collective dispatch resolves it as, the case function).
REDUCING: dict[str, tuple[C, Callable[..., Case]]] = {
    "all_reduce": (C.ALL_REDUCE, c_all_reduce),
    "reduce": (C.REDUCE, c_reduce),
    "reduce_scatter_tensor": (C.REDUCE_SCATTER_TENSOR, c_reduce_scatter_tensor),
    "reduce_scatter": (C.REDUCE_SCATTER, c_reduce_scatter),
    "reduce_scatter_tensor_uneven": (C.REDUCE_SCATTER_TENSOR_UNEVEN, c_reduce_scatter_tensor_uneven),
    "all_reduce_coalesced": (C.ALL_REDUCE_COALESCED, c_all_reduce_coalesced),
}
MOVING: dict[str, tuple[C, Callable[..., Case]]] = {
    "all_gather": (C.ALL_GATHER, c_all_gather),
    "all_gather_coalesced": (C.ALL_GATHER_COALESCED, c_all_gather_coalesced),
    "recv_any_source": (C.RECV_ANY_SOURCE, c_recv_any_source),
    "all_gather_into_tensor": (C.ALL_GATHER_INTO_TENSOR, c_all_gather_into_tensor),
    "all_gather_into_tensor_uneven": (C.ALL_GATHER_INTO_TENSOR_UNEVEN, c_all_gather_into_tensor_uneven),
    "all_to_all": (C.ALL_TO_ALL, _c_all_to_all(False)),
    "all_to_all_uneven": (C.ALL_TO_ALL, _c_all_to_all(True)),
    "all_to_all_single": (C.ALL_TO_ALL_SINGLE, _c_all_to_all_single(False)),
    "all_to_all_single_uneven": (C.ALL_TO_ALL_SINGLE_UNEVEN, _c_all_to_all_single(True)),
    "all_to_all_v": (C.ALL_TO_ALL_V, _c_all_to_all_v(False)),
    "all_to_all_v_uniform": (C.ALL_TO_ALL_V, _c_all_to_all_v(True)),
    "broadcast": (C.BROADCAST, c_broadcast),
    "gather": (C.GATHER, c_gather),
    "scatter": (C.SCATTER, c_scatter),
    "send_recv": (C.SEND, c_send_recv),
}


def cases(only: Sequence[str] | None, dtypes: Sequence[torch.dtype]) -> list[tuple[str, str, Any, str | None]]:
    """(case key, op name, dtype, reduce op) for every case to run; keys exclude async so sync/async share data."""
    out: list[tuple[str, str, Any, str | None]] = []
    for name in REDUCING:
        out += [(f"{name}|{d}|{op}", name, d, op) for d in dtypes for op in reduce_ops(d)]
    for name in MOVING:
        out += [(f"{name}|{d}|-", name, d, None) for d in dtypes]
    out.append(("barrier|-|-", "barrier", None, None))
    out.append(("monitored_barrier|-|-", "monitored_barrier", None, None))
    return [c for c in out if only is None or c[1] in only]


def body_matrix(
    group_ranks: list[int] | None,
    only: list[str] | None = None,
    dtypes: Sequence[torch.dtype] = DTYPES,
    skip: Sequence[str] = (),
    rs_via: str | None = None,
) -> dict[str, tuple[Any, ...]]:
    """Every case (``only`` those named, less ``skip``), sync then async, on the world or on a group over
    ``group_ranks``. With ``rs_via``, reduce_scatter_tensor calls that emulation's kernel directly.

    Returns ``{key|sync/async: ("ok", result, reference, inputs untouched) | ("unsupported", message)}``; ``{}``
    on ranks outside the group.
    """
    group = None if group_ranks is None else xccl.new_group(group_ranks)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return {}
    ranks = tuple(range(dist.get_world_size()) if group is None else dist.get_process_group_ranks(group))
    e = Env(group, ranks, ranks.index(dist.get_rank()))
    if rs_via is not None:
        kernel = BY_KEY[(C.REDUCE_SCATTER_TENSOR, rs_via)].fn

        def rs(out: torch.Tensor, inp: torch.Tensor, op: Any, g: Any, a: bool) -> Any:
            # An emulation kernel is bound to its group state and to the runner of its building blocks.
            st = state_of(g)
            return kernel(st, partial(block, st), out, inp, op, a)

        e = Env(group, ranks, e.r, rs)
    results: dict[str, tuple[Any, ...]] = {}
    for key, name, dtype, op in cases(only, dtypes):
        if name in skip:
            continue
        fn = (REDUCING[name][1] if name in REDUCING else MOVING[name][1] if name in MOVING
              else c_monitored_barrier if name == "monitored_barrier" else c_barrier)
        for a in (False, True):
            args = (e, key, dtype, op, a) if op is not None else (e, key, dtype, a)
            try:
                res, ref, ins, copies = fn(*args)
            except xccl.UnsupportedCollective as exc:
                results[f"{key}|{'async' if a else 'sync'}"] = ("unsupported", str(exc))
                continue
            untouched = all(torch.equal(t, c) for t, c in zip(ins, copies, strict=True))
            results[f"{key}|{'async' if a else 'sync'}"] = ("ok", res, ref, untouched)
    return results


# ------------------------------------------------------------------------------------------------ parent side


def _collective(name: str) -> C:
    if name in ("barrier", "monitored_barrier"):
        return C(name)
    return (REDUCING.get(name) or MOVING[name])[0]


def _dtype(text: str) -> torch.dtype | None:
    return None if text == "-" else getattr(torch, text.removeprefix("torch."))


def check_pool(plugin: str, per_rank: list[dict[str, tuple[Any, ...]]], n: int) -> set[tuple[str, str, str]]:
    """Assert each rank's results against its reference and the table's verdict; the emulations exercised.

    Returns ``{(collective, via, extra)}`` for every case the table resolved as emulated and that passed.
    """
    table = xccl.capabilities(plugin)
    keys = set(per_rank[0])
    assert all(set(r) == keys for r in per_rank if r), "ranks ran different cases"
    exercised: set[tuple[str, str, str]] = set()
    for key in sorted(keys):
        name, dtype_s, op_s, _ = key.split("|")
        dtype, op = _dtype(dtype_s), None if op_s == "-" else op_s
        coll = _collective(name)
        res = table.resolve(coll, dtype=dtype, reduce_op=op, world_size=n)
        kinds = {r[key][0] for r in per_rank if r}
        if (name, dtype_s, op_s) in BLOCK_REFUSALS.get(plugin, ()):
            msgs = {r[key][1] for r in per_rank if r}
            assert kinds == {"unsupported"} and all("all_reduce" in m for m in msgs), f"{plugin} {key}: {msgs}"
            continue
        if res.level is Level.UNSUPPORTED:
            assert kinds == {"unsupported"}, f"{plugin} {key}: the table refuses it ({res.reason}), ranks: {kinds}"
            continue
        assert kinds == {"ok"}, f"{plugin} {key}: the table allows it, but: {[r[key] for r in per_rank if r]}"
        for rank, rec in enumerate(per_rank):
            if not rec:
                continue
            _, got, ref, untouched = rec[key]
            assert untouched, f"{plugin} {key} rank {rank}: an input tensor was modified"
            if ref is not None:
                assert_agrees(got, ref, dtype, n, f"{plugin} {key} rank {rank} vs reference")
        for c in (C.SEND, C.RECV) if coll is C.SEND else (coll,):
            res = table.resolve(c, dtype=dtype, reduce_op=op, world_size=n)
            if res.level is Level.EMULATED:
                extra = "avg_via_sum" if res.avg_via_sum else f"cast:{res.cast}" if res.cast is not None else ""
                exercised.add((c.value, res.via, extra))
    return exercised


def assert_agrees(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype | None, n: int, what: str) -> None:
    """Bitwise equal, except float sums/products/averages, which agree to :func:`tol` (summation order)."""
    assert got is not None, f"{what}: no result"
    if want.dtype == torch.float64 and got.dtype != torch.float64:
        assert dtype is not None
        rtol = tol(dtype, n)
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=0.0, msg=lambda m: f"{what}: {m}")
    else:
        assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
        assert torch.equal(got, want), f"{what}: got\n{got}\nwant\n{want}"


def compare(a: list[dict[str, tuple[Any, ...]]], b: list[dict[str, tuple[Any, ...]]], n: int, what: str) -> int:
    """Assert that two pools' results agree case by case (both ran it); returns how many were compared."""
    compared = 0
    for rank, (ra, rb) in enumerate(zip(a, b, strict=True)):
        for key in sorted(set(ra) & set(rb)):
            if ra[key][0] != "ok" or rb[key][0] != "ok" or ra[key][1] is None:
                continue
            got, want = ra[key][1], rb[key][1]
            dtype = _dtype(key.split("|")[1])
            if got.dtype.is_floating_point and key.split("|")[2] in ("sum", "product", "avg"):
                assert dtype is not None
                rtol = 2 * tol(dtype, n)  # each within tol() of the exact value
                torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=0.0,
                                           msg=lambda m, k=key, r=rank: f"{what} {k} rank {r}: {m}")
            else:
                assert torch.equal(got, want), f"{what} {key} rank {rank}: emulated\n{got}\nnative\n{want}"
            compared += 1
    return compared


#: Compositions no test plugin's table names: they run where a plugin's native kernel refuses a call
#: (ConstraintViolation, under fallback "warn" or "emulate"), exercised on SCCL's list all_gather of unequal
#: sizes by plugins/sophgo/tests/test_sophgo_sim.py (test_unequal_all_gather_*).
CONSTRAINT_FALLBACKS = {("all_gather", "all_gather_into_tensor_uneven")}


def emulation_names() -> set[tuple[str, str]]:
    """Every (collective, via) that xccl can emulate, less those only a refusing kernel falls back to."""
    return {(e.op.value, e.via) for e in EMULATIONS} - CONSTRAINT_FALLBACKS


# --------------------------------------------------------------------------------------------------- the tests
# Pool starts dominate the run time (seconds per rank), so the 4-rank subgroup test comes first and reuses the
# 4-rank pools of the matrix test, and each pool runs one body for everything.


def test_subgroup_emulated_agrees_with_native_and_reference(rank_pools: Any) -> None:
    """On a new group over global ranks 1 and 3: roots and peers are global ranks, data is per group rank."""
    dtypes = (torch.float32, torch.int64, torch.bool)
    native = rank_pools.get(4, vendor="cpu", fallback="emulate").run_ok(body_matrix, [1, 3], None, dtypes, NATIVE_GAPS)
    emulated = rank_pools.get(4, vendor="gloo-emulated", fallback="emulate").run_ok(body_matrix, [1, 3], None, dtypes)
    assert [bool(r) for r in native] == [bool(r) for r in emulated] == [False, True, False, True]
    members = [native[1], native[3]]
    check_pool("cpu", members, 2)
    exercised = check_pool("gloo-emulated", [emulated[1], emulated[3]], 2)
    assert {"reduce_scatter_tensor", "all_to_all", "all_to_all_single_uneven", "send"} <= {op for op, _, _ in exercised}
    assert compare([emulated[1], emulated[3]], members, 2, "subgroup gloo-emulated vs cpu") > 0


@pytest.mark.parametrize("world_size", [4, 2])
def test_every_collective_emulated_agrees_with_native_and_reference(rank_pools: Any, world_size: int) -> None:
    if world_size == 2:
        # reduce_scatter via all_reduce + slice, chosen by the gloo-emulated-ar table.
        via_ar = rank_pools.get(2, vendor="gloo-emulated-ar", fallback="emulate").run_ok(
            body_matrix, None, list(RS_FAMILY), timeout=BODY_TIMEOUT
        )
    native = rank_pools.get(world_size, vendor="cpu", fallback="emulate").run_ok(
        body_matrix, None, None, DTYPES, NATIVE_GAPS, timeout=BODY_TIMEOUT
    )
    emulated_pool = rank_pools.get(world_size, vendor="gloo-emulated", fallback="emulate")
    emulated = emulated_pool.run_ok(body_matrix, None, timeout=BODY_TIMEOUT)
    if world_size == 4:
        # The same composition at 4 ranks without starting a third 4-rank pool: its kernel called directly (its
        # selection by the table is covered at 2 ranks); the all_reduce inside dispatches as usual.
        via_ar = emulated_pool.run_ok(body_matrix, None, ["reduce_scatter_tensor"], DTYPES, (), "all_reduce")
    # float64, which gloo-emulated moves but does not reduce natively (as SCCL and HCCL): gathered, reduced locally.
    f64 = emulated_pool.run_ok(body_matrix, None, ["all_reduce", "reduce"], (torch.float64,), timeout=BODY_TIMEOUT)
    # The cpu table's own emulations count too (the uneven ops over all_to_all_single with split sizes).
    exercised = check_pool("cpu", native, world_size) | check_pool("gloo-emulated", emulated, world_size)
    exercised |= check_pool("gloo-emulated-ar", via_ar, world_size)
    exercised |= check_pool("gloo-emulated", f64, world_size)
    assert compare(emulated, native, world_size, "gloo-emulated vs cpu") > 0
    assert compare(via_ar, native, world_size, "gloo-emulated-ar vs cpu") > 0
    missing = emulation_names() - {(op, via) for op, via, _ in exercised}
    assert not missing, f"emulations never exercised: {sorted(missing)}"
    extras = {extra.split(":")[0] for _, _, extra in exercised}
    assert {"avg_via_sum", "cast"} <= extras, f"avg-via-sum or the dtype cast never exercised: {extras}"


def _poll(work: Any, what: str) -> None:
    """Complete ``work`` by polling ``is_completed()`` only, as overlap code does, with a deadline."""
    deadline = time.monotonic() + 20.0
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: is_completed() never became true without wait()")
        time.sleep(0.001)


def body_polled_handles() -> list[str]:
    """Every emulated collective with ``async_op=True``, completed by polling alone; returns the failures."""
    n, r = dist.get_world_size(), dist.get_rank()
    c = [[count(i, j) for j in range(n)] for i in range(n)]
    col = [c[j][r] for j in range(n)]
    sizes = UNEVEN[n]
    failures: list[str] = []
    checks: list[tuple[str, Callable[[], Any], Callable[[], torch.Tensor], torch.Tensor]] = []

    avg = torch.full((3,), float(r + 1))
    checks.append(("all_reduce avg", lambda: xccl.all_reduce(avg, dist.ReduceOp.AVG, async_op=True), lambda: avg,
                   torch.full((3,), (n + 1) / 2)))
    flags = torch.tensor([r == 0, False, True])
    checks.append(("all_reduce bool", lambda: xccl.all_reduce(flags, async_op=True), lambda: flags,
                   torch.tensor([True, False, True])))
    rs_out = torch.empty(2)
    checks.append(("reduce_scatter_tensor",
                   lambda: xccl.reduce_scatter_tensor(rs_out, torch.arange(2.0 * n) + 10 * r, async_op=True),
                   lambda: rs_out, n * torch.arange(2.0 * n)[2 * r: 2 * r + 2] + 10 * sum(range(n))))
    a2a_out = torch.empty(sum(col))
    checks.append(("all_to_all_single uneven",
                   lambda: xccl.all_to_all_single(a2a_out, torch.full((sum(c[r]),), float(r)), col, c[r],
                                                  async_op=True),
                   lambda: a2a_out, torch.cat([torch.full((col[j],), float(j)) for j in range(n)])))
    a2av_out = torch.empty(sum(col))
    checks.append(("all_to_all_v", lambda: xccl.all_to_all_v(a2av_out, torch.full((sum(c[r]),), float(r)), c,
                                                              async_op=True),
                   lambda: a2av_out, torch.cat([torch.full((col[j],), float(j)) for j in range(n)])))
    lists = [torch.empty(col[j]) for j in range(n)]
    checks.append(("all_to_all uneven",
                   lambda: xccl.all_to_all(lists, [torch.full((c[r][j],), float(r)) for j in range(n)],
                                           async_op=True),
                   lambda: torch.cat(lists), torch.cat([torch.full((col[j],), float(j)) for j in range(n)])))
    ag_out = torch.empty(sum(sizes))
    checks.append(("all_gather_into_tensor_uneven",
                   lambda: xccl.all_gather_into_tensor_uneven(ag_out, torch.full((sizes[r],), float(r)), sizes,
                                                              async_op=True),
                   lambda: ag_out, torch.cat([torch.full((s,), float(j)) for j, s in enumerate(sizes)])))
    rsu_out = torch.empty(sizes[r])
    checks.append(("reduce_scatter_tensor_uneven",
                   lambda: xccl.reduce_scatter_tensor_uneven(rsu_out, torch.arange(float(sum(sizes))) + r, sizes,
                                                             async_op=True),
                   lambda: rsu_out, n * torch.arange(float(sum(sizes))).split(sizes)[r] + sum(range(n))))
    bools = [torch.empty(2, dtype=torch.bool) for _ in range(n)]
    checks.append(("all_gather bool", lambda: xccl.all_gather(bools, torch.tensor([True, r % 2 == 0]), async_op=True),
                   lambda: torch.stack(bools), torch.tensor([[True, j % 2 == 0] for j in range(n)])))
    # Not isend/irecv: gloo's own point-to-point handles report completion only once wait() was called (seen
    # on torch 2.13, natively as well), so polling them never ends there.

    for what, start, result, want in checks:
        work = start()
        _poll(work, what)
        if not (work.is_success() and work.exception() is None and work.wait() is True):
            failures.append(f"{what}: is_success/exception/wait disagree after completion")
        work.synchronize()  # part of the Work interface; must not raise once complete
        if not torch.equal(result(), want):
            failures.append(f"{what}: got {result()}, want {want}")
    return failures


def test_async_emulations_complete_by_polling_is_completed(rank_pools: Any) -> None:
    """``while not work.is_completed()`` must terminate with the right result, without ever calling ``wait()``."""
    for rank, failures in enumerate(rank_pools.get(2, vendor="gloo-emulated", fallback="emulate").run_ok(
        body_polled_handles
    )):
        assert failures == [], f"rank {rank}: {failures}"


def body_lone_refusals() -> dict[str, str]:
    """Calls the emulation must refuse up front, made by rank 0 alone, then an all_reduce on every rank.

    Had rank 0 sent anything before refusing, it would wait for a peer that is already in the all_reduce.
    """
    n, r = dist.get_world_size(), dist.get_rank()
    refused: dict[str, str] = {}
    if r == 0:
        calls = {
            # The all_to_all exchange would run first and the local reduction refuse after it (no bitwise ops
            # over floats).
            "band_float": lambda: xccl.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n), dist.ReduceOp.BAND),
            # gloo-emulated's all_reduce has no bitwise ops, and no emulation of them.
            "band": lambda: xccl.all_reduce(torch.ones(2, dtype=torch.int64), dist.ReduceOp.BAND),
        }
        for name, call in calls.items():
            try:
                call()
                refused[name] = "not refused"
            except xccl.UnsupportedCollective as exc:
                refused[name] = str(exc)
    t = torch.ones(2)
    xccl.all_reduce(t)
    refused["after"] = str(t.tolist())
    return refused


def test_emulations_refuse_what_they_cannot_do_before_communicating(rank_pools: Any) -> None:
    outs = rank_pools.get(2, vendor="gloo-emulated", fallback="emulate").run_ok(body_lone_refusals)
    assert all(out["after"] == "[2.0, 2.0]" for out in outs)
    assert "local reduction has no 'band' over float32" in outs[0]["band_float"]
    assert "reduce op 'band' is not supported" in outs[0]["band"]
