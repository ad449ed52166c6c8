"""Fused matmul + collective ops: ``mm_reduce_scatter``, ``all_gather_mm``, ``mm_all_reduce``.

Semantics are torch_npu's MC2 ops (``npu_mm_reduce_scatter_base``, ``npu_all_gather_base_mm``,
``npu_mm_all_reduce_base``; ``vendor-api/MANIFEST.md`` A4), for a group of ``W`` ranks:

* ``mm_reduce_scatter(a, b)``: ``reduce_scatter(a @ b + bias)`` along dim 0. ``a`` is (m, k), ``b`` (k, n), the
  result (m / W, n): rank ``r`` gets rows ``[r·m/W, (r+1)·m/W)`` of the reduced product.
* ``all_gather_mm(a, b)``: ``g = all_gather(a)`` along dim 0; returns ``(g @ b, g)``, (m·W, n) and (m·W, k), the
  second empty when ``gather_output=False``.
* ``mm_all_reduce(a, b)``: ``all_reduce(a @ b + bias)``; ``a`` is (m, k) or (b, s, k), the result ``a``'s shape
  with ``n`` last. As in torch_npu, ``bias`` is added on every rank *before* the reduction.

Dispatch, decided before any rank communicates
----------------------------------------------
1. Local validation (shapes, dtypes, divisibility, options): :class:`~xccl.InvalidArgument`, raised the same way on
   every rank since it depends only on what every rank passes alike.
2. The group's capability-table entry: unsupported raises :class:`~xccl.UnsupportedCollective`.
3. The plugin's native kernel, when ``Runtime.kernels()`` has one for the op (Ascend's MC2 ops). If the kernel
   raises :class:`~xccl.ConstraintViolation`, the group's fallback policy decides: ``"error"`` re-raises it,
   ``"warn"`` warns (:class:`ConstraintFallbackWarning`, naming the constraint, once per op and constraint) and
   runs the portable version, ``"emulate"`` runs the portable version silently.
4. Otherwise the portable pipelined version (the table's ``via="pipelined"``), subject to the fallback policy for
   emulated ops like every other collective (``"error"`` refuses, ``"warn"`` warns once).

Native kernel contract (for plugin authors)
-------------------------------------------
A plugin provides a fused kernel through ``Runtime.kernels()`` under the op's :class:`~xccl.Collective`::

    Collective.MM_REDUCE_SCATTER: kernel(ctx, a, b, group, reduce_op, bias) -> Tensor          # (m/W, n)
    Collective.ALL_GATHER_MM:     kernel(ctx, a, b, group, gather_output) -> (Tensor, Tensor)  # (m·W, n), (m·W, k)
    Collective.MM_ALL_REDUCE:     kernel(ctx, a, b, group, bias) -> Tensor                     # a.shape[:-1] + (n,)

* ``ctx`` is the group's ``xccl.runtime._init.GroupContext`` (``ctx.group`` the ProcessGroup, ``ctx.size``, ``ctx.rank``);
  ``xccl.comm_name(group)`` gives the communicator name (HCCL's ``hcom``).
* ``a``, ``b``, ``bias`` are validated: tensors on the runtime's device type, one floating dtype, ``b`` 2-D
  (k, n), ``a`` 2-D (3-D allowed for ``MM_ALL_REDUCE``), ``bias`` ``None`` or 1-D of ``n`` elements. They may be
  non-contiguous: the backward passes ``b`` as a transposed view (``b.t()``); call ``.contiguous()`` if the
  vendor op needs it. ``group`` is the ProcessGroup (never ``None``). ``reduce_op`` is a lower-case name
  (``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"product"``); ``gather_output`` a bool. For ``MM_REDUCE_SCATTER``
  ``m`` is already known to divide by ``W``.
* It returns new tensors (never an input or a view of one), with ``a``'s dtype and device. With
  ``gather_output=False`` the second result may be any tensor (xccl returns an empty one to the caller).
* It checks every documented constraint *first* and raises ``xccl.ConstraintViolation(op, backend, constraint,
  detail)`` before any communication. The check may read only what every rank sees alike (shapes, dtypes,
  world size, options), so that all ranks refuse together and fall back together; ``constraint`` is a short name
  (e.g. ``"k in [256, 65535)"``), shown in the fallback warning.
* Optionally it carries the same check as an attribute, ``kernel.check(a, b, world_size, **options)`` (options:
  ``reduce_op``, ``bias``, ``gather_output``, as the kernel takes them), raising ``ConstraintViolation``. It must
  read only shapes, dtypes and devices, because the graph pass (``xccl.fused._pass``) calls it with meta tensors
  to leave a compiled graph unchanged where the kernel cannot take the shape.
* xccl calls it with autograd off and supplies the gradient formula itself (below); the backward of one fused op
  calls the others' kernels (``ALL_GATHER_MM`` in ``mm_reduce_scatter``'s backward, ``MM_REDUCE_SCATTER`` in
  ``all_gather_mm``'s).
* Stream order is the kernel's business, as for any torch op: inputs are ready on the current stream when it is
  called, and outputs must be ready on the current stream when their consumers run (docs/fused.md).

The portable pipelined version
------------------------------
The matmul is split into ``c`` row chunks; chunk ``i``'s collective is issued asynchronously (``async_op=True``
through xccl's own public collectives: ``reduce_scatter_tensor``, ``all_gather`` (list form, into the final
places), ``all_reduce``; so emulated collectives work too) and runs while chunk ``i + 1`` is multiplied. Every rank issues the same collectives in the same order, since ``c`` and the chunk bounds depend only
on shapes and options. ``c`` comes from a cost model (:func:`choose_chunks`: matmul flops against bytes moved,
per device type, :class:`Tuning`); ``c == 1`` is the plain sequence, chosen where the predicted gain is too small
to pay for smaller matmuls and more collective calls. ``chunks=`` overrides it.

Where it overlaps: on CUDA/NCCL (and HCCL) a collective runs on the process group's communication stream, which
first waits on an event recorded on the compute stream (so it reads the finished chunk), and ``work.wait()`` makes
the compute stream wait for the collective's end event (so later readers see the result); the allocator is told
that the communication stream uses the buffers (``recordStream``). On gloo, ``async_op=True`` hands the work to
gloo's own threads, so the next chunk's matmul runs on the caller's thread meanwhile. On backends whose "async"
work has already completed when it is returned (Sophgo SCCL, and xccl's emulations), the same code runs the
chunks one after another: correct, just not overlapped. The version is correct under all three because it only
reads a chunk's result after that chunk's ``wait()``, and never writes a buffer a pending collective still uses.

Autograd
--------
Gradients are those of the unfused ops, with the tensor-parallel reading of each collective:

* ``mm_reduce_scatter``: the output is sharded, each rank's loss term is its own, so the adjoint of the
  reduce-scatter (sum) is an all-gather: ``G = all_gather(grad)``, ``grad_a = G @ bᵀ`` (itself an
  ``all_gather_mm``), ``grad_b = aᵀ @ G``, ``grad_bias = G.sum(0)``. ``avg`` divides by ``W``; ``max``/``min``/
  ``product`` have no gradient here (refused when a gradient is required).
* ``all_gather_mm``: the adjoint of the all-gather is a reduce-scatter (sum): ``grad_a = reduce_scatter(grad_out
  @ bᵀ + grad_gathered)`` (an ``mm_reduce_scatter`` when the gathered output has no gradient), ``grad_b = gᵀ @
  grad_out``.
* ``mm_all_reduce``: the output is *replicated*; under tensor parallelism every rank evaluates the same loss on the
  same value, so the model's gradient is that of the single-device product ``y = Σ_r a_r @ b_r``:
  ``grad_a_r = grad @ b_rᵀ`` with ``grad`` already identical everywhere. The all-reduce's adjoint is therefore the
  identity (Megatron-LM's "g" operator), not another all-reduce: ``torch.distributed._functional_collectives.
  all_reduce`` differentiates ``Σ_r loss_r`` instead and returns ``W`` times this when the per-rank losses are
  equal copies.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..plugin._capabilities import Collective, Level, reduce_op_name
from ..errors import ConstraintViolation, InvalidArgument, UnsupportedCollective
from ..runtime._init import GroupContext, context

__all__ = [
    "ConstraintFallbackWarning",
    "Tuning",
    "all_gather_mm",
    "choose_chunks",
    "mm_all_reduce",
    "mm_reduce_scatter",
    "set_tuning",
    "tuning",
]

LOG = logging.getLogger("xccl")
C = Collective

_FLOAT_DTYPES: Final = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_REDUCE_OPS: Final = ("sum", "avg", "max", "min", "product")
_DIFFERENTIABLE_OPS: Final = ("sum", "avg")


def _emulation_warning() -> type[UserWarning]:
    from ..collectives._dispatch import EmulationWarning

    return EmulationWarning


class ConstraintFallbackWarning(UserWarning):
    """A native fused kernel refused the call (a documented constraint failed); the portable version ran instead.

    Issued under ``fallback="warn"``, once per op, backend and constraint.
    """


# ------------------------------------------------------------------------------------------------ cost model


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


def _comm_time(t: Tuning, op: Collective, payload: int, world_size: int) -> float:
    share = (world_size - 1) / world_size
    if op is C.MM_REDUCE_SCATTER:
        return payload * share / t.bw_reduce_scatter
    if op is C.ALL_GATHER_MM:
        return payload * share / t.bw_all_gather
    return payload * 2 * share / t.bw_all_reduce


def choose_chunks(
    op: Collective, device_type: str, dtype: torch.dtype, rows: int, k: int, n: int, world_size: int
) -> int:
    """The chunk count for the portable pipelined version of ``op`` (1: the plain sequence).

    Model: with matmul time ``M``, collective time ``K`` and ``c`` chunks, the pipeline takes
    ``M + K - overlap·min(M, K)·(1 - 1/c) + (c - 1)·per_chunk``; pick the best ``c``, and 1 unless it beats the
    sequence by ``min_gain``. Depends only on shapes, so every rank picks the same ``c``.

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
    comm = _comm_time(t, op, payload, world_size)
    seq = mm + comm
    overlap = {C.MM_REDUCE_SCATTER: t.overlap_reduce_scatter, C.ALL_GATHER_MM: t.overlap_all_gather}.get(
        op, t.overlap_all_reduce
    )
    hideable = overlap * min(mm, comm)
    limit = max(1, min(t.max_chunks, rows // max(1, t.min_rows)))
    costs = {c: seq - hideable * (1.0 - 1.0 / c) + (c - 1) * t.per_chunk for c in range(2, limit + 1)}
    paying = {c: cost for c, cost in costs.items() if cost <= (1.0 - t.min_gain) * seq}
    if not paying:
        return 1
    # The curve is flat near its minimum: take the fewest chunks within 1% of it (less exposed to the model's
    # error on per-chunk costs).
    best = min(paying.values())
    return min(c for c, cost in paying.items() if cost <= best + 0.01 * seq)


def _bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` contiguous row ranges covering ``[0, rows)``, the first ``rows % chunks`` one row longer."""
    chunks = max(1, min(chunks, rows)) if rows else 1
    base, extra = divmod(rows, chunks)
    out, lo = [], 0
    for i in range(chunks):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


# ------------------------------------------------------------------------------------------------ validation


def _check_tensor(op: str, what: str, t: Any, device_type: str | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(op, f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if device_type is not None and t.device.type not in (device_type, "meta"):
        raise InvalidArgument(
            op, f"{what} is on {t.device}, but this group's backend takes {device_type} tensors; move it with .to()"
        )
    if t.dtype not in _FLOAT_DTYPES:
        raise InvalidArgument(op, f"{what} has dtype {t.dtype}; fused ops take float32, float64, float16, bfloat16")
    return t


def _check_common(
    op: str, a: Any, b: Any, bias: Any, device_type: str | None, a_dims: Sequence[int] = (2,)
) -> None:
    _check_tensor(op, "a", a, device_type)
    _check_tensor(op, "b", b, device_type)
    if a.dim() not in a_dims:
        want = " or ".join(f"{d}-D" for d in a_dims)
        raise InvalidArgument(op, f"a must be {want}, got shape {tuple(a.shape)}")
    if b.dim() != 2:
        raise InvalidArgument(op, f"b must be 2-D (k, n), got shape {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise InvalidArgument(
            op, f"a's last dimension ({a.shape[-1]}) must equal b's first (k={b.shape[0]}): a {tuple(a.shape)}, "
            f"b {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise InvalidArgument(op, f"a and b dtypes differ ({a.dtype} vs {b.dtype}); cast one of them")
    if a.device != b.device:
        raise InvalidArgument(op, f"a is on {a.device}, b on {b.device}; put both on the same device")
    if bias is not None:
        _check_tensor(op, "bias", bias, device_type)
        if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise InvalidArgument(op, f"bias must be 1-D with n={b.shape[1]} elements, got shape {tuple(bias.shape)}")
        if bias.dtype != a.dtype:
            raise InvalidArgument(op, f"bias dtype {bias.dtype} differs from a's {a.dtype}")


def _check_chunks(op: str, chunks: Any) -> int:
    """Normalise ``chunks``: ``None`` -> 0 (choose from the shape), else a positive int."""
    if chunks is None:
        return 0
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise InvalidArgument(op, f"chunks={chunks!r} must be a positive integer, or None to choose from the shape")
    return chunks


def _check_reduce_op(op: str, reduce_op: Any) -> str:
    try:
        name = reduce_op_name(reduce_op)
    except Exception:  # any unreadable value is the caller's error
        name = repr(reduce_op)
    if name not in _REDUCE_OPS:
        raise InvalidArgument(op, f"reduce_op={reduce_op!r} is not supported; use one of {', '.join(_REDUCE_OPS)}")
    return name


def check_mm_reduce_scatter(
    a: Any, b: Any, world_size: int, reduce_op: Any, bias: Any, device_type: str | None = None
) -> str:
    """Validate ``mm_reduce_scatter``'s arguments; returns the reduce op's name. Works on meta/fake tensors."""
    op = "mm_reduce_scatter"
    _check_common(op, a, b, bias, device_type)
    name = _check_reduce_op(op, reduce_op)
    if a.shape[0] % world_size:
        raise InvalidArgument(
            op, f"a has {a.shape[0]} rows, not divisible by the group's {world_size} ranks; pad m to a multiple "
            f"of {world_size}"
        )
    return name


def check_all_gather_mm(a: Any, b: Any, world_size: int, gather_output: Any, device_type: str | None = None) -> None:
    """Validate ``all_gather_mm``'s arguments. Works on meta/fake tensors."""
    op = "all_gather_mm"
    _check_common(op, a, b, None, device_type)
    if not isinstance(gather_output, bool):
        raise InvalidArgument(op, f"gather_output must be a bool, got {type(gather_output).__name__}")


def check_mm_all_reduce(a: Any, b: Any, world_size: int, bias: Any, device_type: str | None = None) -> None:
    """Validate ``mm_all_reduce``'s arguments. Works on meta/fake tensors."""
    _check_common("mm_all_reduce", a, b, bias, device_type, a_dims=(2, 3))


# -------------------------------------------------------------------------------------------------- dispatch

_WARNED: Final[set[tuple[str, str, str]]] = set()


def _native_or_none(ctx: GroupContext, op: Collective, dtype: torch.dtype) -> Callable[..., Any] | None:
    """The native kernel to try, or None for the portable version; raises where the op cannot run at all."""
    level = ctx.table.entry(op).level
    if level is Level.UNSUPPORTED:
        raise UnsupportedCollective(op.value, ctx.table.backend, ctx.table.entry(op).note or "no such operation")
    kernel = ctx.runtime.kernels().get(op)
    if kernel is not None:
        return kernel
    _portable_allowed(ctx, op)
    return None


def _portable_allowed(ctx: GroupContext, op: Collective, why: str = "") -> None:
    """Apply the fallback policy to running the portable version (raise, warn once, or nothing)."""
    if ctx.fallback == "error":
        raise UnsupportedCollective(
            op.value, ctx.table.backend,
            f"only the portable pipelined version is available{why} and the fallback policy is 'error'; pass "
            "fallback='warn' or 'emulate' to xccl.init to allow it",
        )
    if ctx.fallback == "warn" and not why:
        key = (op.value, ctx.table.backend, "")
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"xccl: {op.value} is emulated on {ctx.table.backend}: via pipelined (chunked matmul overlapped "
                "with async collectives). Pass fallback='emulate' to xccl.init to silence this.",
                _emulation_warning(),
                stacklevel=5,
            )


def _run(
    ctx: GroupContext, op: Collective, dtype: torch.dtype, native_args: tuple[Any, ...], portable: Callable[[], Any]
) -> Any:
    kernel = _native_or_none(ctx, op, dtype)
    if kernel is not None:
        try:
            return kernel(ctx, *native_args)
        except ConstraintViolation as exc:
            if ctx.fallback == "error":
                raise
            if ctx.fallback == "warn":
                key = (op.value, ctx.table.backend, exc.constraint)
                if key not in _WARNED:
                    _WARNED.add(key)
                    warnings.warn(
                        f"xccl: the native {op.value} kernel of {ctx.table.backend} cannot take this call "
                        f"(constraint {exc.constraint!r}: {exc.detail}); running the portable pipelined version. "
                        "Pass fallback='emulate' to xccl.init to silence this, or 'error' to raise instead.",
                        ConstraintFallbackWarning,
                        stacklevel=5,
                    )
            LOG.debug("%s: native kernel refused (%s); portable version", op.value, exc.constraint)
    return portable()


def _api() -> Any:
    from ..collectives import _dispatch

    return _dispatch


# -------------------------------------------------------------------------------------- portable pipelines


def _wait_all(works: Sequence[Any]) -> None:
    for w in works:
        if w is not None:
            w.wait()


def _pick(op: Collective, ctx: GroupContext, chunks: int, dtype: torch.dtype, rows: int, k: int, n: int) -> int:
    if chunks:
        return min(chunks, max(1, rows))
    return choose_chunks(op, ctx.runtime.device_type, dtype, rows, k, n, ctx.size)


def _mm_reduce_scatter_portable(
    ctx: GroupContext, a: torch.Tensor, b: torch.Tensor, group: Any, reduce_op: str, bias: torch.Tensor | None,
    chunks: int,
) -> torch.Tensor:
    w, (m, k), n = ctx.size, a.shape, b.shape[1]
    block = m // w
    out = a.new_empty((block, n))
    c = _pick(C.MM_REDUCE_SCATTER, ctx, chunks, a.dtype, block, k, n)
    op = _redop(reduce_op)
    rs = _api().reduce_scatter_tensor
    if c == 1:
        y = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        rs(out, y, op, group)
        return out
    # Chunk j holds rows [lo, hi) of every destination rank's block, so its reduce-scatter lands in rows [lo, hi)
    # of this rank's output: contiguous, written in place, no copy at the end. One matmul per destination block
    # reads a's rows where they are (gathering them first would copy a).
    works, keep = [], []
    for lo, hi in _bounds(block, c):
        s = hi - lo
        y = a.new_empty((w * s, n))
        for r in range(w):
            rows = a[r * block + lo : r * block + hi]
            if bias is None:
                torch.mm(rows, b, out=y[r * s : (r + 1) * s])
            else:
                torch.addmm(bias, rows, b, out=y[r * s : (r + 1) * s])
        works.append(rs(out[lo:hi], y, op, group, async_op=True))
        keep.append(y)  # alive until its collective completed
    _wait_all(works)
    return out


def _all_gather_mm_portable(
    ctx: GroupContext, a: torch.Tensor, b: torch.Tensor, group: Any, gather_output: bool, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    w, (m, k), n = ctx.size, a.shape, b.shape[1]
    a = a.contiguous()
    c = _pick(C.ALL_GATHER_MM, ctx, chunks, a.dtype, m, k, n)
    gathered = a.new_empty((w * m, k))
    if c == 1:
        _api().all_gather_into_tensor(gathered, a, group)
        return torch.mm(gathered, b), gathered if gather_output else a.new_empty(0)
    out = a.new_empty((w * m, n))
    bounds = _bounds(m, c)
    # Chunk j gathers rows [lo, hi) of every rank straight into their final places (the list form takes one
    # contiguous block per source rank: no staging buffer, no copy). Every gather is issued at once; the matmuls
    # consume them in order, so chunk j's matmul overlaps the gathers of chunks j+1...
    ag = _api().all_gather
    works = [
        ag([gathered[r * m + lo : r * m + hi] for r in range(w)], a[lo:hi], group, async_op=True) for lo, hi in bounds
    ]
    for (lo, hi), work in zip(bounds, works, strict=True):
        if work is not None:
            work.wait()
        for r in range(w):
            torch.mm(gathered[r * m + lo : r * m + hi], b, out=out[r * m + lo : r * m + hi])
    return out, gathered if gather_output else a.new_empty(0)


def _mm_all_reduce_portable(
    ctx: GroupContext, a: torch.Tensor, b: torch.Tensor, group: Any, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    k, n = b.shape
    flat = a.reshape(-1, k)
    rows = flat.shape[0]
    out = a.new_empty((rows, n))
    c = _pick(C.MM_ALL_REDUCE, ctx, chunks, a.dtype, rows, k, n)
    ar = _api().all_reduce
    works = []
    for lo, hi in _bounds(rows, c):
        if bias is None:
            torch.mm(flat[lo:hi], b, out=out[lo:hi])
        else:
            torch.addmm(bias, flat[lo:hi], b, out=out[lo:hi])
        works.append(ar(out[lo:hi], dist.ReduceOp.SUM, group, async_op=c > 1))
    _wait_all(works)
    return out.view(*a.shape[:-1], n)


_REDOPS: Final = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


def _redop(name: str) -> Any:
    return _REDOPS[name]


# ------------------------------------------------------------------------------------ forward implementations
# Autograd off; called by the custom ops below (eager and compiled) and by the backward formulas.


def _resolve_group(group_name: str) -> Any:
    c10d: Any = dist.distributed_c10d
    return c10d._resolve_process_group(group_name)


def _mm_reduce_scatter_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, reduce_op: str, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    group = _resolve_group(group_name)
    ctx = context(group)
    return _run(  # type: ignore[no-any-return]
        ctx, C.MM_REDUCE_SCATTER, a.dtype, (a, b, group, reduce_op, bias),
        lambda: _mm_reduce_scatter_portable(ctx, a, b, group, reduce_op, bias, chunks),
    )


def _all_gather_mm_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, gather_output: bool, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    group = _resolve_group(group_name)
    ctx = context(group)
    out, gathered = _run(
        ctx, C.ALL_GATHER_MM, a.dtype, (a, b, group, gather_output),
        lambda: _all_gather_mm_portable(ctx, a, b, group, gather_output, chunks),
    )
    return out, gathered if gather_output else a.new_empty(0)


def _mm_all_reduce_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    group = _resolve_group(group_name)
    ctx = context(group)
    return _run(  # type: ignore[no-any-return]
        ctx, C.MM_ALL_REDUCE, a.dtype, (a, b, group, bias),
        lambda: _mm_all_reduce_portable(ctx, a, b, group, bias, chunks),
    )


def _all_gather_impl(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _resolve_group(group_name)
    ctx = context(group)
    out = x.new_empty((ctx.size * x.shape[0], *x.shape[1:]))
    _api().all_gather_into_tensor(out, x.contiguous(), group)
    return out


def _reduce_scatter_impl(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _resolve_group(group_name)
    ctx = context(group)
    out = x.new_empty((x.shape[0] // ctx.size, *x.shape[1:]))
    _api().reduce_scatter_tensor(out, x.contiguous(), dist.ReduceOp.SUM, group)
    return out


# ------------------------------------------------------------------------------- graph form: torch.library ops
# One op per fused collective, functional (new tensors out), taking the group by name so that a compiled graph can
# hold it; ``group_size`` is passed explicitly (as in ``_c10d_functional``) so shapes are known without the group.
# ``chunks`` is 0 for "choose from the shape". The public functions call these ops in eager mode too, so autograd
# has one formula for both.

_LIB = "xccl"


@torch.library.custom_op(f"{_LIB}::mm_reduce_scatter", mutates_args=())
def _op_mm_reduce_scatter(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, reduce_op: str = "sum",
    bias: torch.Tensor | None = None, chunks: int = 0,
) -> torch.Tensor:
    return _mm_reduce_scatter_impl(a, b, group_name, reduce_op, bias, chunks)


@_op_mm_reduce_scatter.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, reduce_op: str = "sum",
    bias: torch.Tensor | None = None, chunks: int = 0,
) -> torch.Tensor:
    check_mm_reduce_scatter(a, b, group_size, reduce_op, bias)
    return a.new_empty((a.shape[0] // group_size, b.shape[1]))


@torch.library.custom_op(f"{_LIB}::all_gather_mm", mutates_args=())
def _op_all_gather_mm(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, gather_output: bool = True, chunks: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    return _all_gather_mm_impl(a, b, group_name, gather_output, chunks)


@_op_all_gather_mm.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, gather_output: bool = True, chunks: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    check_all_gather_mm(a, b, group_size, gather_output)
    rows = a.shape[0] * group_size
    gathered = a.new_empty((rows, a.shape[1])) if gather_output else a.new_empty(0)
    return a.new_empty((rows, b.shape[1])), gathered


@torch.library.custom_op(f"{_LIB}::mm_all_reduce", mutates_args=())
def _op_mm_all_reduce(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, bias: torch.Tensor | None = None,
    chunks: int = 0,
) -> torch.Tensor:
    return _mm_all_reduce_impl(a, b, group_name, bias, chunks)


@_op_mm_all_reduce.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, bias: torch.Tensor | None = None,
    chunks: int = 0,
) -> torch.Tensor:
    check_mm_all_reduce(a, b, group_size, bias)
    return a.new_empty((*a.shape[:-1], b.shape[1]))


# Plain collectives for the backward formulas, dispatched through xccl (so an emulated reduce-scatter, as on SCCL,
# works) yet traceable into a compiled backward graph.
@torch.library.custom_op(f"{_LIB}::_fused_all_gather", mutates_args=())
def _op_all_gather(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return _all_gather_impl(x, group_name)


@_op_all_gather.register_fake
def _(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] * group_size, *x.shape[1:]))


@torch.library.custom_op(f"{_LIB}::_fused_reduce_scatter", mutates_args=())
def _op_reduce_scatter(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return _reduce_scatter_impl(x, group_name)


@_op_reduce_scatter.register_fake
def _(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))


# --------------------------------------------------------------------------------------------------- autograd

_ops: Any = torch.ops.xccl


def _needs(ctx: Any, n: int) -> tuple[bool, ...]:
    """``ctx.needs_input_grad`` padded to ``n``: the dispatcher drops trailing arguments left at their defaults,
    and the gradients returned for them are simply ignored."""
    got = tuple(ctx.needs_input_grad)
    return got + (False,) * (n - len(got))


def _setup_mm_reduce_scatter(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b, group_name, group_size, reduce_op, bias, _chunks = inputs
    ctx.save_for_backward(a, b)
    ctx.group = (group_name, group_size)
    ctx.reduce_op = reduce_op
    ctx.has_bias = bias is not None


def _backward_mm_reduce_scatter(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    name, size = ctx.group
    if ctx.reduce_op not in _DIFFERENTIABLE_OPS:
        raise InvalidArgument(
            "mm_reduce_scatter", f"reduce_op={ctx.reduce_op!r} has no gradient; use 'sum' or 'avg', or call it under "
            "torch.no_grad()"
        )
    grad = grad.contiguous()
    if ctx.reduce_op == "avg":
        grad = grad / size
    need_a, need_b, _, _, _, need_bias, _ = _needs(ctx, 7)
    grad_a = grad_b = grad_bias = None
    if need_a:
        # grad_a = all_gather(grad) @ bᵀ: itself a fused all_gather_mm, which also hands back the gathered grad.
        grad_a, full = _ops.all_gather_mm(grad, b.t(), name, size, need_b or need_bias, 0)
    elif need_b or need_bias:
        full = _ops._fused_all_gather(grad, name, size)
    if need_b:
        grad_b = a.t() @ full
    if need_bias:
        grad_bias = full.sum(0)
    return grad_a, grad_b, None, None, None, grad_bias, None


def _setup_all_gather_mm(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _a, b, group_name, group_size, gather_output, _chunks = inputs
    # The gathered input is needed for grad_b; the public function asks for it whenever b requires grad.
    ctx.save_for_backward(b, output[1] if gather_output else None)
    ctx.group = (group_name, group_size)


def _backward_all_gather_mm(ctx: Any, grad_out: torch.Tensor, grad_gathered: torch.Tensor | None) -> tuple[Any, ...]:
    b, gathered = ctx.saved_tensors
    name, size = ctx.group
    need_a, need_b = _needs(ctx, 2)[:2]
    grad_a = grad_b = None
    if grad_out is None:
        grad_out = torch.zeros((gathered.shape[0], b.shape[1]), dtype=b.dtype, device=b.device)
    grad_out = grad_out.contiguous()
    if need_a:
        if grad_gathered is None or grad_gathered.numel() == 0:
            grad_a = _ops.mm_reduce_scatter(grad_out, b.t(), name, size, "sum", None, 0)
        else:
            grad_a = _ops._fused_reduce_scatter(torch.addmm(grad_gathered, grad_out, b.t()), name, size)
    if need_b:
        grad_b = gathered.t() @ grad_out
    return grad_a, grad_b, None, None, None, None


def _setup_mm_all_reduce(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b, _name, _size, bias, _chunks = inputs
    ctx.save_for_backward(a, b)
    ctx.has_bias = bias is not None


def _backward_mm_all_reduce(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    # Identity adjoint for the all-reduce (see the module docstring): no communication in the backward.
    a, b = ctx.saved_tensors
    k, n = b.shape
    g = grad.reshape(-1, n)
    need_a, need_b, _, _, need_bias, _ = _needs(ctx, 6)
    grad_a = (g @ b.t()).view(a.shape) if need_a else None
    grad_b = a.reshape(-1, k).t() @ g if need_b else None
    grad_bias = g.sum(0) if need_bias else None
    return grad_a, grad_b, None, None, grad_bias, None


torch.library.register_autograd(
    f"{_LIB}::mm_reduce_scatter", _backward_mm_reduce_scatter, setup_context=_setup_mm_reduce_scatter
)
torch.library.register_autograd(f"{_LIB}::all_gather_mm", _backward_all_gather_mm, setup_context=_setup_all_gather_mm)
torch.library.register_autograd(f"{_LIB}::mm_all_reduce", _backward_mm_all_reduce, setup_context=_setup_mm_all_reduce)


# ------------------------------------------------------------------------------------------------ public ops


def _pg(group: Any) -> Any:
    return dist.group.WORLD if group is None else group


def _group_name(group: Any) -> str:
    return str(_pg(group).group_name)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def mm_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    group: Any = None,
    *,
    reduce_op: Any = "sum",
    bias: torch.Tensor | None = None,
    chunks: int | None = None,
) -> torch.Tensor:
    """``reduce_scatter(a @ b + bias)`` along dim 0, with the matmul and the collective overlapped.

    Args:
        a: (m, k), this rank's operand; m must divide by the group size.
        b: (k, n).
        group: the process group (``None``: the world).
        reduce_op: ``"sum"`` (default), ``"avg"``, ``"max"``, ``"min"``, ``"product"`` or a ``ReduceOp``;
            gradients exist for sum and avg.
        bias: optional (n,), added on every rank before the reduction (torch_npu's semantics).
        chunks: pipeline depth of the portable version; ``None`` chooses from the shape, 1 is the plain sequence.

    Returns:
        (m / W, n): this rank's rows of the reduced product.

    Raises:
        InvalidArgument: bad shapes, dtypes, options (on every rank alike, before communicating).
        UnsupportedCollective: the backend cannot run it under the fallback policy.
        ConstraintViolation: the native kernel refused and the fallback policy is ``"error"``.

    Example::

        out = xccl.mm_reduce_scatter(h, w_row_shard)    # row-parallel linear with sequence-parallel output
    """
    n_chunks = _check_chunks("mm_reduce_scatter", chunks)
    if _compiling():
        size = _pg(group).size()
        return _ops.mm_reduce_scatter(  # type: ignore[no-any-return]
            a, b, _group_name(group), size, reduce_op_name(reduce_op), bias, n_chunks
        )
    ctx = context(group)
    name = check_mm_reduce_scatter(a, b, ctx.size, reduce_op, bias, ctx.runtime.device_type)
    if name not in _DIFFERENTIABLE_OPS and torch.is_grad_enabled() and (
        a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
    ):
        raise InvalidArgument(
            "mm_reduce_scatter", f"reduce_op={name!r} has no gradient, but an input requires grad; use 'sum' or "
            "'avg', or call it under torch.no_grad()"
        )
    return _ops.mm_reduce_scatter(a, b, ctx.name, ctx.size, name, bias, n_chunks)  # type: ignore[no-any-return]


def all_gather_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    group: Any = None,
    *,
    gather_output: bool = True,
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = all_gather(a)`` along dim 0, then ``g @ b``, with the gathers and the matmuls overlapped.

    Args:
        a: (m, k), this rank's rows.
        b: (k, n).
        group: the process group (``None``: the world).
        gather_output: also return ``g``; when False the second result is an empty tensor.
        chunks: pipeline depth of the portable version; ``None`` chooses from the shape, 1 is the plain sequence.

    Returns:
        ``(g @ b, g)``: (m·W, n) and (m·W, k) (or empty), rows in rank order.

    Raises:
        InvalidArgument, UnsupportedCollective, ConstraintViolation: as :func:`mm_reduce_scatter`.

    Example::

        y, _ = xccl.all_gather_mm(x_seq_shard, w_col_shard, gather_output=False)   # column-parallel linear
    """
    n_chunks = _check_chunks("all_gather_mm", chunks)
    if _compiling():
        size = _pg(group).size()
        out, g = _ops.all_gather_mm(a, b, _group_name(group), size, gather_output or b.requires_grad, n_chunks)
        return out, g if gather_output else a.new_empty(0)
    ctx = context(group)
    check_all_gather_mm(a, b, ctx.size, gather_output, ctx.runtime.device_type)
    # b's gradient needs the gathered input: gather it even when the caller does not want it back.
    keep = gather_output or (torch.is_grad_enabled() and b.requires_grad)
    out, g = _ops.all_gather_mm(a, b, ctx.name, ctx.size, keep, n_chunks)
    return out, g if gather_output else a.new_empty(0)


def mm_all_reduce(
    a: torch.Tensor,
    b: torch.Tensor,
    group: Any = None,
    *,
    bias: torch.Tensor | None = None,
    chunks: int | None = None,
) -> torch.Tensor:
    """``all_reduce(a @ b + bias)`` (sum), with the matmul and the collective overlapped.

    Args:
        a: (m, k) or (b, s, k).
        b: (k, n).
        group: the process group (``None``: the world).
        bias: optional (n,), added on every rank before the reduction (torch_npu's semantics).
        chunks: pipeline depth of the portable version; ``None`` chooses from the shape, 1 is the plain sequence.

    Returns:
        ``a``'s shape with the last dimension ``n``; the same on every rank.

    Raises:
        InvalidArgument, UnsupportedCollective, ConstraintViolation: as :func:`mm_reduce_scatter`.

    Example::

        y = xccl.mm_all_reduce(h, w_row_shard)        # row-parallel linear; backward is local (identity adjoint)
    """
    n_chunks = _check_chunks("mm_all_reduce", chunks)
    if _compiling():
        size = _pg(group).size()
        return _ops.mm_all_reduce(a, b, _group_name(group), size, bias, n_chunks)  # type: ignore[no-any-return]
    ctx = context(group)
    check_mm_all_reduce(a, b, ctx.size, bias, ctx.runtime.device_type)
    return _ops.mm_all_reduce(a, b, ctx.name, ctx.size, bias, n_chunks)  # type: ignore[no-any-return]

