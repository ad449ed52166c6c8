"""Fused matmul + collective ops: ``mm_reduce_scatter``, ``all_gather_mm``, ``mm_all_reduce``.

Semantics are torch_npu's MC2 ops (``npu_mm_reduce_scatter_base``, ``npu_all_gather_base_mm``,
``npu_mm_all_reduce_base``; ``vendor-api/MANIFEST.md`` A4); as in torch_npu, ``bias`` is added on every rank
*before* the reduction. Every check that can fail is made before any rank communicates: local validation
(:class:`~xccl.InvalidArgument`), then the group's capability table (:class:`~xccl.UnsupportedCollective`), then
the plugin's native kernel or the portable pipelined version under the fallback policy. The shapes, the native
kernel contract (for plugin authors), how the portable version overlaps, and the gradients: docs/fused.md.
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


_compiling: Final = torch.compiler.is_compiling
_RED_OP_TYPE: Final = dist.ReduceOp.RedOpType


def _traced(group: Any) -> tuple[str, int]:
    """The group's name and size, as the graph ops take them (while torch.compile traces)."""
    pg: Any = dist.group.WORLD if group is None else group
    return str(pg.group_name), pg.size()


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
        # A ReduceOp member enters as its name: Dynamo folds the member itself only from torch 2.13.
        name = reduce_op_name(reduce_op.name if isinstance(reduce_op, _RED_OP_TYPE) else reduce_op)
        return _X.mm_reduce_scatter(a, b, *_traced(group), name, bias, n_chunks)  # type: ignore[no-any-return]
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
        out, g = _X.all_gather_mm(a, b, *_traced(group), gather_output or b.requires_grad, n_chunks)
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
        return _X.mm_all_reduce(a, b, *_traced(group), bias, n_chunks)  # type: ignore[no-any-return]
    st = state_of(group)
    check_mm_all_reduce(a, b, st.size, bias, st.device_type)
    return _X.mm_all_reduce(a, b, st.name, st.size, bias, n_chunks)  # type: ignore[no-any-return]
