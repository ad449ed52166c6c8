"""The portable pipelined versions of the fused ops: chunked matmuls overlapped with asynchronous collectives.

Chunk ``i``'s collective is issued asynchronously as a part of the fused call (planned as any call, so emulated
collectives work too) and runs while chunk ``i + 1`` is multiplied. The chunk count and bounds depend only on shapes
(``_cost``), so every rank issues the same collectives; a chunk's result is read only after its ``wait()`` and no
buffer of a pending collective is written, so the result is right whether or not the backend overlaps
(docs/fused.md, "Why the overlap is safe").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._dispatch import block as part
from ..collectives._state import GroupState
from ..ops import _specs as S
from ..plugin._capabilities import Collective, reduce_op_of
from ._cost import bounds, choose_chunks

__all__ = ["all_gather_mm", "mm_all_reduce", "mm_reduce_scatter"]

C = Collective
_SUM: Final = dist.ReduceOp.SUM


def _wait_all(works: Sequence[Any]) -> None:
    for w in works:
        if w is not None:
            w.wait()


def _pick(op: Collective, st: GroupState, chunks: int, dtype: torch.dtype, rows: int, k: int, n: int) -> int:
    if chunks:
        return min(chunks, max(1, rows))
    return choose_chunks(op, st.device_type, dtype, rows, k, n, st.size)


def mm_reduce_scatter(
    st: GroupState, group: Any, a: torch.Tensor, b: torch.Tensor, reduce_op: str, bias: torch.Tensor | None,
    chunks: int,
) -> torch.Tensor:
    w, (m, k), n = st.size, a.shape, b.shape[1]
    block = m // w
    out = a.new_empty((block, n))
    c = _pick(C.MM_REDUCE_SCATTER, st, chunks, a.dtype, block, k, n)
    op = reduce_op_of(reduce_op)
    if c == 1:
        y = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        part(st, S.REDUCE_SCATTER_TENSOR, (out, y, op))
        return out
    # Chunk j holds rows [lo, hi) of every destination rank's block, so its reduce-scatter lands in rows [lo, hi)
    # of this rank's output: contiguous, written in place, no copy at the end. One matmul per destination block
    # reads a's rows where they are (gathering them first would copy a).
    works, keep = [], []
    for lo, hi in bounds(block, c):
        s = hi - lo
        y = a.new_empty((w * s, n))
        for r in range(w):
            rows = a[r * block + lo : r * block + hi]
            if bias is None:
                torch.mm(rows, b, out=y[r * s : (r + 1) * s])
            else:
                torch.addmm(bias, rows, b, out=y[r * s : (r + 1) * s])
        works.append(part(st, S.REDUCE_SCATTER_TENSOR, (out[lo:hi], y, op), True))
        keep.append(y)  # alive until its collective completed
    _wait_all(works)
    return out


def all_gather_mm(
    st: GroupState, group: Any, a: torch.Tensor, b: torch.Tensor, gather_output: bool, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    w, (m, k), n = st.size, a.shape, b.shape[1]
    a = a.contiguous()
    c = _pick(C.ALL_GATHER_MM, st, chunks, a.dtype, m, k, n)
    gathered = a.new_empty((w * m, k))
    if c == 1:
        part(st, S.ALL_GATHER_INTO_TENSOR, (gathered, a))
        return torch.mm(gathered, b), gathered if gather_output else a.new_empty(0)
    out = a.new_empty((w * m, n))
    spans = bounds(m, c)
    # Chunk j gathers rows [lo, hi) of every rank straight into their final places (the list form takes one
    # contiguous block per source rank: no staging buffer, no copy). Every gather is issued at once; the matmuls
    # consume them in order, so chunk j's matmul overlaps the gathers of chunks j+1...
    works = [part(st, S.ALL_GATHER, ([gathered[r * m + lo : r * m + hi] for r in range(w)], a[lo:hi]), True)
             for lo, hi in spans]
    for (lo, hi), work in zip(spans, works, strict=True):
        if work is not None:
            work.wait()
        for r in range(w):
            torch.mm(gathered[r * m + lo : r * m + hi], b, out=out[r * m + lo : r * m + hi])
    return out, gathered if gather_output else a.new_empty(0)


def mm_all_reduce(
    st: GroupState, group: Any, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    k, n = b.shape
    flat = a.reshape(-1, k)
    rows = flat.shape[0]
    out = a.new_empty((rows, n))
    c = _pick(C.MM_ALL_REDUCE, st, chunks, a.dtype, rows, k, n)
    works = []
    for lo, hi in bounds(rows, c):
        if bias is None:
            torch.mm(flat[lo:hi], b, out=out[lo:hi])
        else:
            torch.addmm(bias, flat[lo:hi], b, out=out[lo:hi])
        works.append(part(st, S.ALL_REDUCE, (out[lo:hi], _SUM), c > 1))
    _wait_all(works)
    return out.view(*a.shape[:-1], n)
