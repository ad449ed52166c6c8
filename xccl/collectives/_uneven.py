"""Compositions of the uneven collectives: without padding over all_to_all_single with split sizes, or padded.

The uneven all-gather and reduce-scatter (torch_npu's ``*_v`` collectives) take one split size per rank, the same list on every rank.

* **via all_to_all_single** (backends whose all_to_all_single honours split sizes: gloo, NCCL): every rank sends
  exactly its rows; no byte is padding. all_gather sends this rank's rows to every peer (the input repeated once per
  peer in a scratch buffer), reduce_scatter sends chunk ``j`` of the input to rank ``j`` and reduces what it receives
  locally. Traffic: the sum of the splits, where padding moves world size x the largest.
* **padding** (backends with even collectives only: SCCL ignores split sizes): every chunk padded to the largest
  split, the even collective, the padding dropped. Also uneven all_to_all_single itself on such backends.

Each runs its last building block with the caller's ``async_op`` and gives its scratch back when that completes
(``_compose``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ..ops import _specs as S
from ..ops._emulations import implements
from ..ops._vocab import Collective as C
from ._compose import Call, last, local_reduce, nothing, take

__all__ = ["ag_via_all_to_all", "ag_via_padding", "a2a_via_padding", "rs_via_all_to_all", "rs_via_padding"]

R = dist.ReduceOp


def _row(t: torch.Tensor) -> int:
    """Elements per dim-0 row (1 for a 1-D tensor)."""
    return math.prod(t.shape[1:])


def _pad(padded: torch.Tensor, inp: torch.Tensor, sizes: list[int], m: int) -> None:
    """Chunk ``j`` of ``inp`` (``sizes[j]`` rows) into rows ``j*m ...`` of ``padded``, the rest zero."""
    padded.zero_()
    for j, chunk in enumerate(torch.split(inp, sizes)):
        padded[j * m : j * m + sizes[j]].copy_(chunk)


def _unpad(out: torch.Tensor, rows: torch.Tensor, sizes: list[int], m: int) -> None:
    """The inverse of :func:`_pad`: the first ``sizes[j]`` of each ``m`` rows of ``rows``, in order, into ``out``."""
    offset = 0
    for j, size in enumerate(sizes):
        out[offset : offset + size].copy_(rows[j * m : j * m + size])
        offset += size


@implements(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "all_to_all_single")
def ag_via_all_to_all(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], a: bool) -> Any:
    """Rank r's rows to every peer: send splits ``[sizes[r]] * n``, receive splits ``sizes``, straight into
    ``out``."""
    n, row, mine = st.size, _row(out), sizes[st.rank]
    send = take(st, n * mine * row, inp)
    send.tensor.view(n, mine * row).copy_(inp.reshape(1, mine * row).expand(n, mine * row))
    kargs = (out.view(-1), send.tensor, [s * row for s in sizes], [mine * row] * n)
    return last(call, S.ALL_TO_ALL_SINGLE, kargs, a, nothing, send)


@implements(C.REDUCE_SCATTER_TENSOR_UNEVEN, "all_to_all_single")
def rs_via_all_to_all(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], op: Any, a: bool
) -> Any:
    """Chunk j of the input to rank j (send splits ``sizes``), ``[sizes[r]] * n`` received, reduced locally."""
    n, row, mine = st.size, _row(inp), sizes[st.rank]
    got = take(st, n * mine * row, inp)
    kargs = (got.tensor, inp.view(-1), [mine * row] * n, [s * row for s in sizes])
    return last(call, S.ALL_TO_ALL_SINGLE, kargs, a, lambda: local_reduce(got.tensor.view(n, mine * row), op, out), got)


@implements(C.ALL_GATHER_INTO_TENSOR_UNEVEN, "padding")
def ag_via_padding(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], a: bool) -> Any:
    """Rows padded to the largest split, an even all_gather_into_tensor, the padding dropped."""
    n, m, trail, mine = st.size, max(sizes), inp.shape[1:], sizes[st.rank]
    pad_in, pad_out = take(st, m * _row(out), inp), take(st, n * m * _row(out), inp)
    padded = pad_in.tensor.view(m, *trail)
    padded[:mine].copy_(inp)
    padded[mine:].zero_()  # never read back; zeros keep the wire contents deterministic

    return last(call, S.ALL_GATHER_INTO_TENSOR, (pad_out.tensor, pad_in.tensor), a,
                lambda: _unpad(out, pad_out.tensor.view(n * m, *trail), sizes, m), pad_in, pad_out)


@implements(C.REDUCE_SCATTER_TENSOR_UNEVEN, "padding")
def rs_via_padding(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], op: Any, a: bool) -> Any:
    """Chunks padded to the largest split, an even reduce-scatter, the padding dropped."""
    # Padding rows are reduced too, then dropped: their value never matters, whatever the reduce op.
    n, m, trail, mine = st.size, max(sizes), inp.shape[1:], sizes[st.rank]
    pad_in, pad_out = take(st, n * m * _row(inp), inp), take(st, m * _row(inp), inp)
    _pad(pad_in.tensor.view(n * m, *trail), inp, sizes, m)
    kargs = (pad_out.tensor, pad_in.tensor, op)
    return last(call, S.REDUCE_SCATTER_TENSOR, kargs, a,
                lambda: out.copy_(pad_out.tensor.view(m, *trail)[:mine]), pad_in, pad_out)


@implements(C.ALL_TO_ALL_SINGLE_UNEVEN, "padding")
def a2a_via_padding(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, osz: list[int] | None, isz: list[int] | None, a: bool
) -> Any:
    """Uneven all_to_all_single on a backend that only does even splits: agree on the largest chunk (one small
    all_reduce), pad every chunk to it, exchange evenly, unpad."""
    n, trail = st.size, inp.shape[1:]
    isz = isz or [inp.shape[0] // n] * n
    osz = osz or [out.shape[0] // n] * n
    biggest = torch.tensor([max(isz + osz)], dtype=torch.int64, device=inp.device)
    call(S.ALL_REDUCE, (biggest, R.MAX))
    m = int(biggest.item())
    row = _row(inp)
    pad_in, pad_out = take(st, n * m * row, inp), take(st, n * m * row, inp)
    _pad(pad_in.tensor.view(n * m, *trail), inp, isz, m)
    return last(call, S.ALL_TO_ALL_SINGLE, (pad_out.tensor, pad_in.tensor, None, None), a,
                lambda: _unpad(out, pad_out.tensor.view(n * m, *trail), osz, m), pad_in, pad_out)
