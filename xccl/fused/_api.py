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

    Collective.MM_REDUCE_SCATTER: kernel(ctx, a, b, reduce_op, bias) -> Tensor          # (m/W, n)
    Collective.ALL_GATHER_MM:     kernel(ctx, a, b, gather_output) -> (Tensor, Tensor)  # (m·W, n), (m·W, k)
    Collective.MM_ALL_REDUCE:     kernel(ctx, a, b, bias) -> Tensor                     # a.shape[:-1] + (n,)

* ``ctx`` is the group's :class:`~xccl.plugin.KernelContext` (``ctx.group`` the ProcessGroup, ``ctx.size``,
  ``ctx.rank``); ``xccl.comm_name(ctx.group)`` gives the communicator name (HCCL's ``hcom``).
* ``a``, ``b``, ``bias`` are validated: tensors on the runtime's device type, one floating dtype, ``b`` 2-D
  (k, n), ``a`` 2-D (3-D allowed for ``MM_ALL_REDUCE``), ``bias`` ``None`` or 1-D of ``n`` elements. They may be
  non-contiguous: the backward passes ``b`` as a transposed view (``b.t()``); call ``.contiguous()`` if the
  vendor op needs it. ``reduce_op`` is a lower-case name
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

from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._groups import state_of
from ..errors import InvalidArgument
from ..plugin._capabilities import reduce_op_name
from . import _autograd  # noqa: F401 - registers the ops' gradients
from ._ops import ConstraintFallbackWarning
from ._validate import (
    DIFFERENTIABLE_OPS,
    check_all_gather_mm,
    check_chunks,
    check_mm_all_reduce,
    check_mm_reduce_scatter,
)

__all__ = ["ConstraintFallbackWarning", "all_gather_mm", "mm_all_reduce", "mm_reduce_scatter"]

_X: Final[Any] = torch.ops.xccl


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
    n_chunks = check_chunks("mm_reduce_scatter", chunks)
    if _compiling():
        size = _pg(group).size()
        return _X.mm_reduce_scatter(  # type: ignore[no-any-return]
            a, b, _group_name(group), size, reduce_op_name(reduce_op), bias, n_chunks
        )
    st = state_of(group)
    name = check_mm_reduce_scatter(a, b, st.size, reduce_op, bias, st.device_type)
    if name not in DIFFERENTIABLE_OPS and torch.is_grad_enabled() and (
        a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
    ):
        raise InvalidArgument(
            "mm_reduce_scatter", f"reduce_op={name!r} has no gradient, but an input requires grad; use 'sum' or "
            "'avg', or call it under torch.no_grad()"
        )
    return _X.mm_reduce_scatter(a, b, st.name, st.size, name, bias, n_chunks)  # type: ignore[no-any-return]


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
    n_chunks = check_chunks("all_gather_mm", chunks)
    if _compiling():
        size = _pg(group).size()
        out, g = _X.all_gather_mm(a, b, _group_name(group), size, gather_output or b.requires_grad, n_chunks)
        return out, g if gather_output else a.new_empty(0)
    st = state_of(group)
    check_all_gather_mm(a, b, st.size, gather_output, st.device_type)
    # b's gradient needs the gathered input: gather it even when the caller does not want it back.
    keep = gather_output or (torch.is_grad_enabled() and b.requires_grad)
    out, g = _X.all_gather_mm(a, b, st.name, st.size, keep, n_chunks)
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
    n_chunks = check_chunks("mm_all_reduce", chunks)
    if _compiling():
        size = _pg(group).size()
        return _X.mm_all_reduce(a, b, _group_name(group), size, bias, n_chunks)  # type: ignore[no-any-return]
    st = state_of(group)
    check_mm_all_reduce(a, b, st.size, bias, st.device_type)
    return _X.mm_all_reduce(a, b, st.name, st.size, bias, n_chunks)  # type: ignore[no-any-return]

