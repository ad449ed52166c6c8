"""The conformance suite's cases: one call of every collective per call shape, its inputs and its reference.

A :class:`Case` is a function of its input tensors that allocates its outputs, calls one xccl op and returns them:
eager mode calls it, graph mode compiles the very same function (:mod:`._bodies`). Its reference is computed on CPU
from the deterministic inputs of every rank (:mod:`._reference`).
"""

from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, final

import torch

import xccl
from xccl.plugin._capabilities import Collective

from ._claims import FUSED
from ._reference import PREMUL, make, reduce_ref

__all__ = ["BUILDERS", "SYNC_ONLY", "Case", "build", "reduce_op"]

C = Collective
#: Ops without an ``async_op`` argument.
SYNC_ONLY: Final = FUSED | {C.MONITORED_BARRIER}


@final
@dataclass(frozen=True)
class Case:
    """One call of one op: the function, its inputs on the rank's device, and the CPU reference."""

    op: Collective
    #: ``"float32 sum"``, ``"int64"``, ... (``async`` appended for async calls).
    label: str
    inputs: tuple[torch.Tensor, ...]
    #: Takes ``inputs``, calls the op, returns its outputs.
    fn: Callable[..., tuple[torch.Tensor, ...]]
    #: Reference per output; None where this rank has no output to check (a non-root of reduce/gather).
    want: tuple[torch.Tensor | None, ...] = field(default=())


@final
@dataclass(frozen=True)
class _Env:
    n: int
    r: int
    device: torch.device
    async_op: bool

    def dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def done(self, work: Any, *outs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``outs``, once ``work`` (what an op returned) is done."""
        if self.async_op and work is not None:
            work.wait()
        return outs


def reduce_op(name: str) -> Any:
    """The ``ReduceOp`` for a lower-case name (premul_sum scales by :data:`PREMUL`)."""
    import torch.distributed as dist

    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL)
    return getattr(dist.ReduceOp, name.upper())


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)


# One builder per op: (env, dtype, reduce op name) -> Case. Roots are the last rank, so that "root" and "rank 0"
# differ and a kernel that confuses global and group ranks shows.


def _all_reduce(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 1) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        return e.done(xccl.all_reduce(t, rop, async_op=e.async_op), t)

    return Case(C.ALL_REDUCE, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op),))


def _reduce(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 2) for i in range(e.n)]
    rop, root = reduce_op(op), e.n - 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        return e.done(xccl.reduce(t, dst=root, op=rop, async_op=e.async_op), t)

    return Case(C.REDUCE, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op) if e.r == root else None,))


def _reduce_scatter(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 3), dt, 3) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((2, 3))
        return e.done(xccl.reduce_scatter(out, list(x.chunk(e.n)), rop, async_op=e.async_op), out)

    return Case(C.REDUCE_SCATTER, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op)[2 * e.r : 2 * e.r + 2],))


def _reduce_scatter_tensor(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 3), dt, 4) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((2, 3))
        return e.done(xccl.reduce_scatter_tensor(out, x, rop, async_op=e.async_op), out)

    return Case(C.REDUCE_SCATTER_TENSOR, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op)[2 * e.r : 2 * e.r + 2],))


def _all_gather(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 5) for i in range(e.n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [torch.empty_like(x) for _ in range(e.n)]
        return e.done(xccl.all_gather(outs, x, async_op=e.async_op), *outs)

    return Case(C.ALL_GATHER, "", (e.dev(xs[e.r]),), fn, tuple(xs))


def _all_gather_into_tensor(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 6) for i in range(e.n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((3 * e.n, 2))
        return e.done(xccl.all_gather_into_tensor(out, x, async_op=e.async_op), out)

    return Case(C.ALL_GATHER_INTO_TENSOR, "", (e.dev(xs[e.r]),), fn, (torch.cat(xs),))


def _all_to_all(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 2), dt, 7) for i in range(e.n)]
    n, r = e.n, e.r

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [x.new_empty((2, 2)) for _ in range(n)]
        return e.done(xccl.all_to_all(outs, list(x.chunk(n)), async_op=e.async_op), *outs)

    return Case(C.ALL_TO_ALL, "", (e.dev(xs[r]),), fn, tuple(x[2 * r : 2 * r + 2] for x in xs))


def _all_to_all_single(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 2), dt, 8) for i in range(e.n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = torch.empty_like(x)
        return e.done(xccl.all_to_all_single(out, x, async_op=e.async_op), out)

    return Case(C.ALL_TO_ALL_SINGLE, "", (e.dev(xs[e.r]),), fn, (torch.cat([x[2 * e.r : 2 * e.r + 2] for x in xs]),))


def _all_to_all_single_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    rows = [[i + j + 1 for j in range(n)] for i in range(n)]  # rank i sends rows[i][j] rows to rank j
    xs = [make(i, (sum(rows[i]), 2), dt, 9) for i in range(n)]
    out_rows, in_rows = [rows[i][r] for i in range(n)], rows[r]
    want = torch.cat([xs[i][sum(rows[i][:r]) : sum(rows[i][: r + 1])] for i in range(n)])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sum(out_rows), 2))
        return e.done(xccl.all_to_all_single(out, x, out_rows, in_rows, async_op=e.async_op), out)

    return Case(C.ALL_TO_ALL_SINGLE_UNEVEN, "", (e.dev(xs[r]),), fn, (want,))


def _broadcast(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 10) for i in range(e.n)]
    root = e.n - 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        return e.done(xccl.broadcast(t, src=root, async_op=e.async_op), t)

    return Case(C.BROADCAST, "", (e.dev(xs[e.r]),), fn, (xs[root],))


def _gather(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 11) for i in range(e.n)]
    n, root, is_root = e.n, e.n - 1, e.r == e.n - 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lst = [torch.empty_like(x) for _ in range(n)] if is_root else None
        e.done(xccl.gather(x, lst, dst=root, async_op=e.async_op))
        return tuple(lst) if lst is not None else ()

    return Case(C.GATHER, "", (e.dev(xs[e.r]),), fn, tuple(xs) if is_root else ())


def _scatter(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, root, is_root = e.n, e.n - 1, e.r == e.n - 1
    chunks = [make(root, (3, 2), dt, 12 + i) for i in range(n)]

    def fn(*src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = torch.empty((3, 2), dtype=dt, device=e.device)
        return e.done(xccl.scatter(out, list(src) if is_root else None, src=root, async_op=e.async_op), out)

    return Case(C.SCATTER, "", tuple(e.dev(c) for c in chunks) if is_root else (), fn, (chunks[e.r],))


def _barrier(e: _Env, dt: torch.dtype, op: str, monitored: bool = False) -> Case:
    x = make(e.r, (2,), dt, 15 if monitored else 13)

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if monitored:  # every rank arrives
            xccl.monitored_barrier(timeout=_dt.timedelta(seconds=60), wait_all_ranks=True)
        else:
            e.done(xccl.barrier(async_op=e.async_op))
        return (t + 1,)

    return Case(C.MONITORED_BARRIER if monitored else C.BARRIER, "", (e.dev(x),), fn, (x + 1,))


def _ring(op: Collective) -> Callable[[_Env, torch.dtype, str], Case]:
    """send/recv around a ring: each rank sends to the right and receives from the left (blocking calls ordered
    even-first so the ring cannot deadlock; async calls post both, then wait)."""

    def build(e: _Env, dt: torch.dtype, _op: str) -> Case:
        n, r = e.n, e.r
        right, left = (r + 1) % n, (r - 1) % n
        xs = [make(i, (3, 2), dt, 14) for i in range(n)]

        def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            got = torch.empty_like(x)
            if e.async_op:
                works = [xccl.isend(x, right), xccl.irecv(got, left)]
                for w in works:
                    w.wait()
            elif r % 2 == 0:
                xccl.send(x, right)
                xccl.recv(got, left)
            else:
                xccl.recv(got, left)
                xccl.send(x, right)
            return (got,)

        return Case(op, "", (e.dev(xs[r]),), fn, (xs[left],))

    return build


def _recv_any_source(e: _Env, dt: torch.dtype, _op: str) -> Case:
    """Every rank but the last sends to the last, which receives from any source, sorts by sender, and barriers
    so that the next case's messages cannot be taken for this one's."""
    n, r, last = e.n, e.r, e.n - 1
    xs = [make(i, (3, 2), dt, 18) for i in range(n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if r != last:
            xccl.send(x, last)
            xccl.barrier()
            return ()
        got: dict[int, torch.Tensor] = {}
        for _ in range(n - 1):
            buf = torch.empty_like(x)
            if e.async_op:
                work = xccl.irecv(buf)
                work.wait()
                got[work.source_rank()] = buf
            else:
                got[xccl.recv(buf)] = buf
        xccl.barrier()
        return tuple(got[s] for s in sorted(got))

    return Case(C.RECV_ANY_SOURCE, "", (e.dev(xs[r]),), fn, tuple(xs[:last]) if r == last else ())


def _all_reduce_coalesced(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 19) for i in range(e.n)]
    ys = [make(i, (5,), dt, 20) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ts = [x.clone(), y.clone()]
        return e.done(xccl.all_reduce_coalesced(ts, rop, async_op=e.async_op), *ts)

    return Case(C.ALL_REDUCE_COALESCED, "", (e.dev(xs[e.r]), e.dev(ys[e.r])), fn,
                (reduce_ref(xs, op), reduce_ref(ys, op)))


def _all_gather_coalesced(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 21) for i in range(e.n)]
    ys = [make(i, (5,), dt, 22) for i in range(e.n)]

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [[torch.empty_like(x), torch.empty_like(y)] for _ in range(e.n)]
        e.done(xccl.all_gather_coalesced(outs, [x, y], async_op=e.async_op))
        return tuple(t for row in outs for t in row)

    return Case(C.ALL_GATHER_COALESCED, "", (e.dev(xs[e.r]), e.dev(ys[e.r])), fn,
                tuple(t for pair in zip(xs, ys, strict=True) for t in pair))


def _all_gather_into_tensor_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    sizes = [i + 1 for i in range(n)]  # rank i contributes i + 1 rows
    xs = [make(i, (sizes[i], 2), dt, 15) for i in range(n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sum(sizes), 2))
        return e.done(xccl.all_gather_into_tensor_uneven(out, x, sizes, async_op=e.async_op), out)

    return Case(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "", (e.dev(xs[r]),), fn, (torch.cat(xs),))


def _reduce_scatter_tensor_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    sizes = [i + 1 for i in range(n)]  # rank i receives i + 1 rows
    xs = [make(i, (sum(sizes), 2), dt, 16) for i in range(n)]
    rop, off = reduce_op(op), sum(sizes[:r])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sizes[r], 2))
        return e.done(xccl.reduce_scatter_tensor_uneven(out, x, sizes, rop, async_op=e.async_op), out)

    return Case(C.REDUCE_SCATTER_TENSOR_UNEVEN, "", (e.dev(xs[r]),), fn, (reduce_ref(xs, op)[off : off + sizes[r]],))


def _all_to_all_v(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    matrix = [[i + 2 * j + 1 for j in range(n)] for i in range(n)]  # elements from rank i to rank j
    xs = [make(i, (sum(matrix[i]),), dt, 17) for i in range(n)]
    want = torch.cat([xs[i][sum(matrix[i][:r]) : sum(matrix[i][: r + 1])] for i in range(n)])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((int(want.numel()),))
        return e.done(xccl.all_to_all_v(out, x, matrix, async_op=e.async_op), out)

    return Case(C.ALL_TO_ALL_V, "", (e.dev(xs[r]),), fn, (want,))


def _mm_reduce_scatter(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    a = [make(i, (2 * n, 4), dt, 18) for i in range(n)]
    b = [make(i, (4, 3), dt, 19) for i in range(n)]
    full = reduce_ref([_mm(a[i], b[i]) for i in range(n)], op)

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (xccl.mm_reduce_scatter(x, w, reduce_op=op),)

    return Case(C.MM_REDUCE_SCATTER, "", (e.dev(a[r]), e.dev(b[r])), fn, (full[2 * r : 2 * r + 2],))


def _all_gather_mm(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    a = [make(i, (2, 4), dt, 20) for i in range(n)]
    b = make(r, (4, 3), dt, 21)
    gathered = torch.cat(a)

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(xccl.all_gather_mm(x, w))

    return Case(C.ALL_GATHER_MM, "", (e.dev(a[r]), e.dev(b)), fn, (_mm(gathered, b), gathered))


def _mm_all_reduce(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    a = [make(i, (2, 4), dt, 22) for i in range(n)]
    b = [make(i, (4, 3), dt, 23) for i in range(n)]

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (xccl.mm_all_reduce(x, w),)

    return Case(C.MM_ALL_REDUCE, "", (e.dev(a[r]), e.dev(b[r])), fn, (reduce_ref([_mm(a[i], b[i]) for i in range(n)], "sum"),))


BUILDERS: Final[dict[Collective, Callable[[_Env, torch.dtype, str], Case]]] = {
    C.ALL_REDUCE: _all_reduce,
    C.ALL_REDUCE_COALESCED: _all_reduce_coalesced,
    C.ALL_GATHER: _all_gather,
    C.ALL_GATHER_COALESCED: _all_gather_coalesced,
    C.ALL_GATHER_INTO_TENSOR: _all_gather_into_tensor,
    C.REDUCE_SCATTER: _reduce_scatter,
    C.REDUCE_SCATTER_TENSOR: _reduce_scatter_tensor,
    C.ALL_TO_ALL: _all_to_all,
    C.ALL_TO_ALL_SINGLE: _all_to_all_single,
    C.ALL_TO_ALL_SINGLE_UNEVEN: _all_to_all_single_uneven,
    C.BROADCAST: _broadcast,
    C.REDUCE: _reduce,
    C.GATHER: _gather,
    C.SCATTER: _scatter,
    C.BARRIER: _barrier,
    C.MONITORED_BARRIER: functools.partial(_barrier, monitored=True),
    C.SEND: _ring(C.SEND),
    C.RECV: _ring(C.RECV),
    C.RECV_ANY_SOURCE: _recv_any_source,
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: _all_gather_into_tensor_uneven,
    C.REDUCE_SCATTER_TENSOR_UNEVEN: _reduce_scatter_tensor_uneven,
    C.ALL_TO_ALL_V: _all_to_all_v,
    C.MM_REDUCE_SCATTER: _mm_reduce_scatter,
    C.ALL_GATHER_MM: _all_gather_mm,
    C.MM_ALL_REDUCE: _mm_all_reduce,
}


def build(op: Collective, dtype: torch.dtype, redop: str, *, n: int, r: int, device: torch.device,
          async_op: bool = False) -> Case:
    """The case for ``op`` with this dtype and reduce op, labelled."""
    case = BUILDERS[op](_Env(n, r, device, async_op), dtype, redop)
    label = " ".join(p for p in (str(dtype).removeprefix("torch."), redop, "async" if async_op else "") if p)
    return Case(case.op, label, case.inputs, case.fn, case.want)
