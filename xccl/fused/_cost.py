"""The chunk-count cost model of the portable pipelined fused ops.

With matmul time ``M``, collective time ``K`` and ``c`` chunks, the pipeline takes
``M + K - overlap·min(M, K)·(1 - 1/c) + (c - 1)·per_chunk``: :func:`choose_chunks` picks the best ``c`` from the
shapes alone (so every rank picks the same), and 1 (the plain sequence) unless pipelining beats it by
``min_gain``. The constants per device type are :class:`Tuning`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, Final, final

import torch

from ..plugin._capabilities import Collective

__all__ = ["Tuning", "bounds", "choose_chunks", "set_tuning", "tuning"]

C = Collective
#: Per fused op: its collective's bytes factor (nccl-tests' bus bandwidth) and the :class:`Tuning` fields it reads.
_COLLECTIVE: Final = {C.MM_REDUCE_SCATTER: (1, "reduce_scatter"), C.ALL_GATHER_MM: (1, "all_gather"),
                      C.MM_ALL_REDUCE: (2, "all_reduce")}


@final
@dataclass(frozen=True, slots=True)
class Tuning:
    """Constants of the chunk-count cost model for one device type (see :func:`choose_chunks`).

    Rough by design: the model only has to tell "pipelining pays" from "it does not", and how many chunks.
    """

    #: Sustained fp32 matmul rate of one rank, flop/s (on CPU: per compute thread).
    flops: float
    #: Matmul rate of 16-bit floats relative to fp32 (CPUs without bf16 instructions are much slower).
    half_speed: float
    #: Bus bandwidth per collective, bytes/s, as nccl-tests define it: a collective over W ranks whose full matrix
    #: (the one reduced, or gathered) has S bytes takes ``S·f/bw`` with ``f = 2(W-1)/W`` for all-reduce and
    #: ``(W-1)/W`` for reduce-scatter and all-gather.
    bw_all_reduce: float
    bw_reduce_scatter: float
    bw_all_gather: float
    #: Fixed cost of issuing one more collective and one more, smaller matmul (seconds).
    per_chunk: float
    #: Per collective, the fraction of the shorter phase that overlap can hide: near 1 where the collective runs
    #: on its own engine (a communication stream), lower where it competes for the same cores (gloo's threads
    #: doing the reduction and the loopback copies beside the matmul on CPU).
    overlap_all_reduce: float
    overlap_reduce_scatter: float
    overlap_all_gather: float
    #: Predicted relative gain below which the plain sequence runs.
    min_gain: float = 0.05
    #: Most chunks ever used.
    max_chunks: int = 8
    #: Fewest rows in a chunk (smaller matmuls lose efficiency).
    min_rows: int = 64


# CPU numbers measured on gloo over loopback, 2 ranks with one thread each (benchmarks/fused.py,
# docs/performance.md). gloo's all-reduce and reduce-scatter are CPU-bound there (their CPU time is 85-100%
# of their wall time: reductions and loopback copies), so they barely overlap a matmul and the model keeps the
# plain sequence; gather chunks issued together finish in about half the time of one big gather, which the
# all-gather's "overlap" stands for. Accelerator numbers are order-of-magnitude defaults (NVLink / HCCS class
# links), to be calibrated per machine.
_TUNING: dict[str, Tuning] = {
    "cpu": Tuning(
        flops=1.5e11, half_speed=0.2, bw_all_reduce=1.5e9, bw_reduce_scatter=0.55e9, bw_all_gather=0.5e9,
        per_chunk=1.0e-3, overlap_all_reduce=0.1, overlap_reduce_scatter=0.1, overlap_all_gather=0.8,
    ),
    "cuda": Tuning(
        flops=2.0e14, half_speed=2.0, bw_all_reduce=1.0e11, bw_reduce_scatter=1.0e11, bw_all_gather=1.0e11,
        per_chunk=3.0e-5, overlap_all_reduce=0.9, overlap_reduce_scatter=0.9, overlap_all_gather=0.9,
    ),
}
_DEFAULT_ACCELERATOR: Final = _TUNING["cuda"]


def tuning(device_type: str) -> Tuning:
    """The cost-model constants used for ``device_type`` (``"cpu"``, ``"cuda"``, ``"npu"``, ...)."""
    return _TUNING.get(device_type, _DEFAULT_ACCELERATOR)


def set_tuning(device_type: str, value: Tuning | None = None, **changes: Any) -> Tuning:
    """Replace (``value``) or adjust (``**changes``, e.g. ``per_chunk=1e-4``) the constants for ``device_type``.

    Every rank must make the same change: the chunk count decides which collectives are issued.
    """
    new = replace(value or tuning(device_type), **changes)
    _TUNING[device_type] = new
    return new


def choose_chunks(
    op: Collective, device_type: str, dtype: torch.dtype, rows: int, k: int, n: int, world_size: int
) -> int:
    """The chunk count for the portable pipelined version of ``op`` (1: the plain sequence), by the model of the
    module docstring; it depends only on shapes, so every rank picks the same.

    Args:
        op: which fused op.
        device_type: the tensors' device type.
        dtype: their dtype.
        rows: rows of the local matmul that are split (mm_reduce_scatter: m / W per destination block;
            all_gather_mm: m, the local rows; mm_all_reduce: all rows).
        k: inner dimension.
        n: output columns.
        world_size: ranks in the group.
    """
    if world_size == 1 or rows < 2:
        return 1
    t = tuning(device_type)
    speed = t.flops * (t.half_speed if dtype.itemsize == 2 else 1.0)
    if device_type == "cpu":
        speed *= max(1, torch.get_num_threads())
    full_rows = rows * world_size if op is not C.MM_ALL_REDUCE else rows
    mm = 2.0 * full_rows * k * n / speed
    payload = full_rows * (k if op is C.ALL_GATHER_MM else n) * dtype.itemsize
    factor, collective = _COLLECTIVE[op]
    comm = payload * factor * ((world_size - 1) / world_size) / getattr(t, f"bw_{collective}")
    seq = mm + comm
    hideable = getattr(t, f"overlap_{collective}") * min(mm, comm)
    limit = max(1, min(t.max_chunks, rows // max(1, t.min_rows)))
    costs = {c: seq - hideable * (1.0 - 1.0 / c) + (c - 1) * t.per_chunk for c in range(2, limit + 1)}
    paying = {c: cost for c, cost in costs.items() if cost <= (1.0 - t.min_gain) * seq}
    if not paying:
        return 1
    # The curve is flat near its minimum: take the fewest chunks within 1% of it (less exposed to the model's
    # error on per-chunk costs).
    best = min(paying.values())
    return min(c for c, cost in paying.items() if cost <= best + 0.01 * seq)


def bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` contiguous row ranges covering ``[0, rows)``, the first ``rows % chunks`` one row longer."""
    chunks = max(1, min(chunks, rows)) if rows else 1
    base, extra = divmod(rows, chunks)
    starts = [i * base + min(i, extra) for i in range(chunks + 1)]
    return list(pairwise(starts))
