"""Gradients of the fused ops: those of the unfused ops, with the tensor-parallel reading of each collective.

The formulas: docs/fused.md, "Gradients". The backward of one fused op calls the others' graph ops
(``all_gather_mm`` in ``mm_reduce_scatter``'s backward, ``mm_reduce_scatter`` in ``all_gather_mm``'s), so a
native kernel serves both directions.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidArgument
from . import _ops as _registered  # noqa: F401 - defines torch.ops.xccl.mm_reduce_scatter & co.
from ._validate import DIFFERENTIABLE_OPS

__all__: list[str] = []

_X: Any = torch.ops.xccl


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
    if ctx.reduce_op not in DIFFERENTIABLE_OPS:
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
        grad_a, full = _X.all_gather_mm(grad, b.t(), name, size, need_b or need_bias, 0)
    elif need_b or need_bias:
        full = _X._fused_all_gather(grad, name, size)
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
            grad_a = _X.mm_reduce_scatter(grad_out, b.t(), name, size, "sum", None, 0)
        else:
            grad_a = _X._fused_reduce_scatter(torch.addmm(grad_gathered, grad_out, b.t()), name, size)
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
    "xccl::mm_reduce_scatter", _backward_mm_reduce_scatter, setup_context=_setup_mm_reduce_scatter
)
torch.library.register_autograd("xccl::all_gather_mm", _backward_all_gather_mm, setup_context=_setup_all_gather_mm)
torch.library.register_autograd("xccl::mm_all_reduce", _backward_mm_all_reduce, setup_context=_setup_mm_all_reduce)
