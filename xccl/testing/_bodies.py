"""What the conformance suite runs on each rank: one call of every collective per call shape, and its reference.

The suite (:mod:`xccl.testing.conformance`) sends these module-level functions to a :class:`RankPool`, so they
must import without pytest. Each rank builds the same list of :class:`Case` objects from the plugin's own
capability table (the call order must be identical on every rank), runs them, and compares every output with a
reference it computes on CPU from the deterministic inputs of *every* rank: small integers, so that sums,
products and averages are exact in every dtype tested, and the reference is what gloo computes.

A case is a function of its input tensors that allocates its outputs, calls one xccl op and returns the outputs.
Eager mode calls it; graph mode compiles the very same function with ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

import torch

import xccl
from xccl.plugin._capabilities import ALL_REDUCE_OPS, CapabilityTable, Collective, Level, Mode

__all__ = [
    "Case",
    "comm_names",
    "eager_batch",
    "graph_batch",
    "refusal_batch",
    "shapes",
]

C = Collective
#: Dtypes every op is tried with (plus the first one a table lists, when it lists none of these).
DTYPES: Final = (torch.float32, torch.bfloat16, torch.int64)
_FLOATS: Final = (torch.float32, torch.bfloat16)
_FUSED: Final = frozenset({C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE})
#: Ops without an ``async_op`` argument.
_SYNC_ONLY: Final = _FUSED
#: The scale of the premul_sum cases.
PREMUL: Final = 2.0


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

    def done(self, work: Any) -> None:
        if self.async_op and work is not None:
            work.wait()


# -------------------------------------------------------------------------------------------------- inputs


def make(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s deterministic input: small integers in [-4, 4] (exact in every float dtype tested)."""
    gen = torch.Generator().manual_seed(7919 * rank + 104729 * salt + 1)
    return torch.randint(-4, 5, shape, generator=gen).to(dtype)


def reduce_ref(ts: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """What gloo computes for ``op`` over ``ts`` (in rank order, in the tensors' dtype).

    Where ``op`` is undefined for the dtype (bitwise ops on floats) there is no reference: the result is an
    empty tensor, which no output matches. Such shapes are only ever tried as refusals.
    """
    acc = ts[0].clone()
    try:
        for t in ts[1:]:
            acc = _combine(acc, t, op)
    except (NotImplementedError, RuntimeError, TypeError):
        return ts[0].new_empty((0,))
    if op == "avg":
        n = len(ts)
        acc = acc / n if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
    if op == "premul_sum":
        acc = acc * PREMUL
    return acc.to(ts[0].dtype)


def _combine(acc: torch.Tensor, t: torch.Tensor, op: str) -> torch.Tensor:
    if op in ("sum", "avg", "premul_sum"):
        return acc + t
    fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "product": torch.mul,
        "min": torch.minimum,
        "max": torch.maximum,
        "band": torch.bitwise_and,
        "bor": torch.bitwise_or,
        "bxor": torch.bitwise_xor,
    }
    return fns[op](acc, t)


def reduce_op(name: str) -> Any:
    """The ``ReduceOp`` for a lower-case name (premul_sum scales by :data:`PREMUL`)."""
    import torch.distributed as dist

    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL)  # type: ignore[attr-defined]
    return getattr(dist.ReduceOp, name.upper())


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)


# ---------------------------------------------------------------------------------------------------- cases
# One builder per op: (env, dtype, reduce op name) -> Case. Roots are the last rank, so that "root" and "rank 0"
# differ and a kernel that confuses global and group ranks shows.


def _all_reduce(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 1) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        e.done(xccl.all_reduce(t, rop, async_op=e.async_op))
        return (t,)

    return Case(C.ALL_REDUCE, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op),))


def _reduce(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 2) for i in range(e.n)]
    rop, root = reduce_op(op), e.n - 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        e.done(xccl.reduce(t, dst=root, op=rop, async_op=e.async_op))
        return (t,)

    return Case(C.REDUCE, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op) if e.r == root else None,))


def _reduce_scatter(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 3), dt, 3) for i in range(e.n)]
    rop, n = reduce_op(op), e.n

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((2, 3))
        e.done(xccl.reduce_scatter(out, list(x.chunk(n)), rop, async_op=e.async_op))
        return (out,)

    return Case(C.REDUCE_SCATTER, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op)[2 * e.r : 2 * e.r + 2],))


def _reduce_scatter_tensor(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 3), dt, 4) for i in range(e.n)]
    rop = reduce_op(op)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((2, 3))
        e.done(xccl.reduce_scatter_tensor(out, x, rop, async_op=e.async_op))
        return (out,)

    return Case(C.REDUCE_SCATTER_TENSOR, "", (e.dev(xs[e.r]),), fn, (reduce_ref(xs, op)[2 * e.r : 2 * e.r + 2],))


def _all_gather(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 5) for i in range(e.n)]
    n = e.n

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [torch.empty_like(x) for _ in range(n)]
        e.done(xccl.all_gather(outs, x, async_op=e.async_op))
        return tuple(outs)

    return Case(C.ALL_GATHER, "", (e.dev(xs[e.r]),), fn, tuple(xs))


def _all_gather_into_tensor(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 6) for i in range(e.n)]
    n = e.n

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((3 * n, 2))
        e.done(xccl.all_gather_into_tensor(out, x, async_op=e.async_op))
        return (out,)

    return Case(C.ALL_GATHER_INTO_TENSOR, "", (e.dev(xs[e.r]),), fn, (torch.cat(xs),))


def _all_to_all(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 2), dt, 7) for i in range(e.n)]
    n, r = e.n, e.r

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [x.new_empty((2, 2)) for _ in range(n)]
        e.done(xccl.all_to_all(outs, list(x.chunk(n)), async_op=e.async_op))
        return tuple(outs)

    return Case(C.ALL_TO_ALL, "", (e.dev(xs[r]),), fn, tuple(x[2 * r : 2 * r + 2] for x in xs))


def _all_to_all_single(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (2 * e.n, 2), dt, 8) for i in range(e.n)]
    r = e.r

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = torch.empty_like(x)
        e.done(xccl.all_to_all_single(out, x, async_op=e.async_op))
        return (out,)

    return Case(C.ALL_TO_ALL_SINGLE, "", (e.dev(xs[r]),), fn, (torch.cat([x[2 * r : 2 * r + 2] for x in xs]),))


def _all_to_all_single_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    rows = [[i + j + 1 for j in range(n)] for i in range(n)]  # rank i sends rows[i][j] rows to rank j
    xs = [make(i, (sum(rows[i]), 2), dt, 9) for i in range(n)]
    out_rows, in_rows = [rows[i][r] for i in range(n)], rows[r]
    want = torch.cat([xs[i][sum(rows[i][:r]) : sum(rows[i][: r + 1])] for i in range(n)])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sum(out_rows), 2))
        e.done(xccl.all_to_all_single(out, x, out_rows, in_rows, async_op=e.async_op))
        return (out,)

    return Case(C.ALL_TO_ALL_SINGLE_UNEVEN, "", (e.dev(xs[r]),), fn, (want,))


def _broadcast(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 10) for i in range(e.n)]
    root = e.n - 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.clone()
        e.done(xccl.broadcast(t, src=root, async_op=e.async_op))
        return (t,)

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
        e.done(xccl.scatter(out, list(src) if is_root else None, src=root, async_op=e.async_op))
        return (out,)

    return Case(C.SCATTER, "", tuple(e.dev(c) for c in chunks) if is_root else (), fn, (chunks[e.r],))


def _barrier(e: _Env, dt: torch.dtype, op: str) -> Case:
    x = make(e.r, (2,), dt, 13)

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        e.done(xccl.barrier(async_op=e.async_op))
        return (t + 1,)

    return Case(C.BARRIER, "", (e.dev(x),), fn, (x + 1,))


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
        e.done(xccl.all_reduce_coalesced(ts, rop, async_op=e.async_op))
        return tuple(ts)

    return Case(C.ALL_REDUCE_COALESCED, "", (e.dev(xs[e.r]), e.dev(ys[e.r])), fn,
                (reduce_ref(xs, op), reduce_ref(ys, op)))


def _all_gather_coalesced(e: _Env, dt: torch.dtype, op: str) -> Case:
    xs = [make(i, (3, 2), dt, 21) for i in range(e.n)]
    ys = [make(i, (5,), dt, 22) for i in range(e.n)]
    n = e.n

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [[torch.empty_like(x), torch.empty_like(y)] for _ in range(n)]
        e.done(xccl.all_gather_coalesced(outs, [x, y], async_op=e.async_op))
        return tuple(t for row in outs for t in row)

    return Case(C.ALL_GATHER_COALESCED, "", (e.dev(xs[e.r]), e.dev(ys[e.r])), fn,
                tuple(t for i in range(n) for t in (xs[i], ys[i])))


def _all_gather_into_tensor_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    sizes = [i + 1 for i in range(n)]  # rank i contributes i + 1 rows
    xs = [make(i, (sizes[i], 2), dt, 15) for i in range(n)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sum(sizes), 2))
        e.done(xccl.all_gather_into_tensor_uneven(out, x, sizes, async_op=e.async_op))
        return (out,)

    return Case(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "", (e.dev(xs[r]),), fn, (torch.cat(xs),))


def _reduce_scatter_tensor_uneven(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    sizes = [i + 1 for i in range(n)]  # rank i receives i + 1 rows
    xs = [make(i, (sum(sizes), 2), dt, 16) for i in range(n)]
    rop, off = reduce_op(op), sum(sizes[:r])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((sizes[r], 2))
        e.done(xccl.reduce_scatter_tensor_uneven(out, x, sizes, rop, async_op=e.async_op))
        return (out,)

    return Case(C.REDUCE_SCATTER_TENSOR_UNEVEN, "", (e.dev(xs[r]),), fn, (reduce_ref(xs, op)[off : off + sizes[r]],))


def _all_to_all_v(e: _Env, dt: torch.dtype, op: str) -> Case:
    n, r = e.n, e.r
    matrix = [[i + 2 * j + 1 for j in range(n)] for i in range(n)]  # elements from rank i to rank j
    xs = [make(i, (sum(matrix[i]),), dt, 17) for i in range(n)]
    want = torch.cat([xs[i][sum(matrix[i][:r]) : sum(matrix[i][: r + 1])] for i in range(n)])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = x.new_empty((int(want.numel()),))
        e.done(xccl.all_to_all_v(out, x, matrix, async_op=e.async_op))
        return (out,)

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
        out, g = xccl.all_gather_mm(x, w)
        return (out, g)

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


# ------------------------------------------------------------------------------------------ what to expect


def shapes(table: CapabilityTable, op: Collective, world_size: int, mode: Mode = Mode.EAGER
           ) -> list[tuple[torch.dtype, str, Level]]:
    """Every (dtype, reduce op) the suite tries for ``op``, with the level the table promises for it.

    Fused ops take a shape-independent decision (native kernel, else the portable version), so they are
    expected to run unless the entry itself is unsupported. send and recv are tested together (a ring), so each
    one's case runs only where both are supported.
    """
    entry = table.entry(op, mode)
    fused = op in _FUSED
    dtypes = list(_FLOATS if fused else DTYPES)
    if entry.dtypes is not None and not any(d in entry.dtypes for d in dtypes):
        extra = sorted(entry.dtypes, key=str)
        dtypes += [d for d in extra if d.is_floating_point or not fused][:1]
    if op is C.MM_REDUCE_SCATTER:
        redops = ["sum"]
    elif op.reduces and not fused:
        redops = list(ALL_REDUCE_OPS)
    else:
        redops = [""]
    return [(dt, ro, entry.level if fused else expected_level(table, op, mode, dt, ro, world_size))
            for dt in dtypes for ro in redops]


def expected_level(table: CapabilityTable, op: Collective, mode: Mode, dtype: torch.dtype, redop: str, n: int) -> Level:
    """The table's level for one call shape, as dispatch decides it (the table consults an emulation's building
    blocks: reduce_scatter via all_reduce, asked for a reduce op all_reduce lacks, is unsupported)."""
    return table.resolve(op, mode=mode, dtype=dtype, reduce_op=redop or None, world_size=n).level


def _ring_peer_ok(table: CapabilityTable, op: Collective, dt: torch.dtype, n: int, mode: Mode) -> bool:
    if op not in (C.SEND, C.RECV):
        return True
    peer = C.RECV if op is C.SEND else C.SEND
    return table.supports(peer, mode=mode, dtype=dt, world_size=n)


# ------------------------------------------------------------------------------------------------- helpers


def mismatch(got: Any, want: torch.Tensor) -> str | None:
    """Why ``got`` is not ``want`` (None when it is): dtype, shape, then values."""
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a tensor"
    got = got.detach().cpu()
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if want.is_floating_point():
        tol = 1e-2 if want.element_size() < 4 else 1e-5
        ok = torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if ok:
        return None
    return f"values {got.flatten()[:8].tolist()}..., expected {want.flatten()[:8].tolist()}..."


def _compare(outs: Any, want: tuple[torch.Tensor | None, ...]) -> str | None:
    outs = tuple(outs)
    if len(outs) != len(want):
        return f"{len(outs)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(outs, want, strict=True)):
        if w is None:
            continue
        why = mismatch(g, w)
        if why is not None:
            return f"output {i}: {why}"
    return None


def _error(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


@contextlib.contextmanager
def _progress(path: str | None, what: str) -> Iterator[None]:
    """Note what this rank is about to do, so a hang can be reported with the call that hung."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(what)
    yield


def _table() -> CapabilityTable:
    return xccl.capabilities(xccl.get_world().plugin)  # type: ignore[no-any-return]


def _report() -> dict[str, list[str]]:
    return {"ran": [], "refused": [], "skipped": [], "failures": []}


# ---------------------------------------------------------------------------------------------- the bodies


def kernel_signature_problems(progress: str | None = None) -> list[str]:
    """What is wrong with the signatures of the selected runtime's kernels (empty: each takes what xccl passes)."""
    from xccl.collectives._state import STATE
    from xccl.plugin import kernels_problems

    runtime = STATE.runtime
    return [] if runtime is None else kernels_problems(runtime.kernels())


def eager_batch(progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Run every supported (op, dtype, reduce op), sync and async, on every rank; report per op.

    Returns:
        ``{op: {"ran": labels, "skipped": reasons, "failures": messages, "refused": []}}``.
    """
    w = xccl.get_world()
    table = _table()
    path = f"{progress}.{w.rank}" if progress else None
    reports = {op.value: _report() for op in C}
    for op in C:
        rep = reports[op.value]
        for dt, ro, level in shapes(table, op, w.world_size):
            if level is Level.UNSUPPORTED:
                continue
            if not _ring_peer_ok(table, op, dt, w.world_size, Mode.EAGER):
                rep["skipped"].append(f"{dt} (needs {'recv' if op is C.SEND else 'send'} for the ring)")
                continue
            for async_op in (False, True) if op not in _SYNC_ONLY else (False,):
                case = build(op, dt, ro, n=w.world_size, r=w.rank, device=w.device, async_op=async_op)
                with _progress(path, f"{op.value} {case.label}"):
                    try:
                        why = _compare(case.fn(*case.inputs), case.want)
                    except Exception as exc:  # every failure is reported, with its op
                        why = _error(exc)
                if why is None:
                    rep["ran"].append(case.label)
                else:
                    rep["failures"].append(f"{op.value} {case.label} ({level.value}): {why}")
    return reports


def _alone(op: Collective, dt: torch.dtype, ro: str, n: int, device: torch.device) -> Callable[[], Any]:
    """One call of ``op`` that rank 0 makes while its peers call nothing."""
    if op is C.SEND:
        return lambda: xccl.send(make(0, (2,), dt).to(device), 1)
    if op is C.RECV:
        return lambda: xccl.recv(torch.empty(2, dtype=dt, device=device), 1)
    if op is C.RECV_ANY_SOURCE:
        return lambda: xccl.recv(torch.empty(2, dtype=dt, device=device))
    case = build(op, dt, ro, n=n, r=0, device=device)
    return lambda: case.fn(*case.inputs)


def refusal_batch(progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Rank 0 alone calls every call shape the table marks unsupported: each must raise UnsupportedCollective
    at once. Its peers call nothing, so an op that communicates before refusing blocks here and the suite
    reports the hang. Then every rank meets in one collective, to show the group is still usable."""
    w = xccl.get_world()
    table = _table()
    reports = {op.value: _report() for op in C}
    if w.rank == 0:
        path = f"{progress}.0" if progress else None
        for op in C:
            rep = reports[op.value]
            for dt, ro, level in shapes(table, op, w.world_size):
                if level is not Level.UNSUPPORTED:
                    continue
                label = " ".join(p for p in (str(dt).removeprefix("torch."), ro) if p)
                with _progress(path, f"{op.value} {label} (alone, expected to raise)"):
                    try:
                        _alone(op, dt, ro, w.world_size, w.device)()
                        rep["failures"].append(f"{op.value} {label}: the table says unsupported, but it ran")
                    except xccl.UnsupportedCollective:
                        rep["refused"].append(label)
                    except Exception as exc:  # the wrong error is a finding
                        rep["failures"].append(
                            f"{op.value} {label}: the table says unsupported; expected UnsupportedCollective, got "
                            f"{_error(exc)}"
                        )
    _meet(table, w.world_size)
    return reports


def _meet(table: CapabilityTable, n: int) -> None:
    if table.supports(C.ALL_REDUCE, dtype=torch.float32, reduce_op="sum", world_size=n):
        t = torch.ones(1, device=xccl.get_world().device)
        xccl.all_reduce(t)
        if t.item() != n:
            raise AssertionError(f"the group is damaged: all_reduce of ones gave {t.item()} on {n} ranks")
    elif table.supports(C.BARRIER, world_size=n):
        xccl.barrier()


def _graph_shape(table: CapabilityTable, op: Collective, n: int) -> tuple[torch.dtype, str] | None:
    for dt, ro, level in shapes(table, op, n, Mode.GRAPH):
        if level is not Level.UNSUPPORTED and ro in ("", "sum") and _ring_peer_ok(table, op, dt, n, Mode.GRAPH):
            return dt, ro
    return None


def graph_ops(table: CapabilityTable, world_size: int) -> list[Collective]:
    """Ops the table claims to run in graph mode (native or emulated) at ``world_size``."""
    return [op for op in C if _graph_shape(table, op, world_size) is not None]


def graph_batch(backend: str, progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Compile every graph-mode claim with ``torch.compile(fullgraph=True)``: the compiled function must not
    break the graph and must return what eager returns and what the reference says."""
    import torch._dynamo

    w = xccl.get_world()
    table = _table()
    path = f"{progress}.{w.rank}" if progress else None
    reports = {op.value: _report() for op in C}
    torch._dynamo.reset()
    for op in graph_ops(table, w.world_size):
        rep = reports[op.value]
        shape = _graph_shape(table, op, w.world_size)
        if shape is None:  # pragma: no cover - graph_ops filtered these
            continue
        case = build(op, shape[0], shape[1], n=w.world_size, r=w.rank, device=w.device)
        with _progress(path, f"{op.value} {case.label} (graph)"):
            try:
                eager = case.fn(*case.inputs)
                compiled = torch.compile(case.fn, fullgraph=True, backend=backend)(*case.inputs)
                why = _compare(compiled, case.want)
                if why is None:
                    why = _compare(compiled, tuple(t.detach().cpu() if t is not None else None for t in eager))
                    why = None if why is None else f"compiled differs from eager: {why}"
            except Exception as exc:  # a graph break or a compile error is a finding
                why = _error(exc)
        if why is None:
            rep["ran"].append(f"{case.label} graph")
        else:
            rep["failures"].append(f"{op.value} {case.label} (graph, {backend}): {why}")
    return reports


def comm_names(progress: str | None = None) -> dict[str, str]:
    """Communicator names of the world, of two groups over every rank, and of this rank's half of the world,
    each asked twice; every member asks (HCCL creates the communicator on the first request)."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    every_a = xccl.new_group(list(range(n)))
    every_b = xccl.new_group(list(range(n)))
    low = xccl.new_group(list(range(n // 2)))
    high = xccl.new_group(list(range(n // 2, n)))
    half = low if r < n // 2 else high
    return {
        "world": xccl.comm_name(),
        "world again": xccl.comm_name(None),
        "every rank, group a": xccl.comm_name(every_a),
        "every rank, group b": xccl.comm_name(every_b),
        "every rank, group a again": xccl.comm_name(every_a),
        f"half {'low' if r < n // 2 else 'high'}": xccl.comm_name(half),
    }

