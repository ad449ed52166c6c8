"""Differentiable functional collectives: new tensors out, inputs untouched, gradients through the adjoint.

=========================  ================================  ================================
function                   forward                           backward (of the output grad)
=========================  ================================  ================================
``all_reduce``             all_reduce (sum or avg)           all_reduce (same op)
``all_gather_into_tensor`` all_gather along dim 0            reduce_scatter (sum) along dim 0
``reduce_scatter_tensor``  reduce_scatter (sum) along dim 0  all_gather along dim 0
=========================  ================================  ================================

Eager calls go through xccl's dispatch (the plugin's kernels and emulations) inside an
``torch.autograd.Function``; compiled calls become ``torch.ops._c10d_functional`` ops, whose autograd formulas
torch registers with the same adjoints (from torch 2.11; on an older torch xccl registers torch 2.11's formulas for
the ops its graph forms emit, ``_forms._register_adjoints``), so eager and compiled training steps compute the same
gradients.

The adjoint of a sum all_reduce is a sum all_reduce (``torch.distributed.nn.functional``'s convention): divide a
loss replicated on every rank by the group size to train as one device would (docs/graph.md, Autograd).
"""

from __future__ import annotations

from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._dispatch import dispatch
from ..errors import InvalidArgument
from ..ops import _specs as S
from ..plugin._capabilities import Collective
from ._forms import _collective
from ._group import GroupInfo, fail, group_info, redop, resolve

__all__ = ["all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor"]

C = Collective
SUM: Final = dist.ReduceOp.SUM
_compiling: Final = torch.compiler.is_compiling


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
        ctx.op, ctx.group = op, group
        out = x.contiguous().clone()
        dispatch(S.ALL_REDUCE, group, False, out, op)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        g = grad.contiguous().clone()
        dispatch(S.ALL_REDUCE, ctx.group, False, g, ctx.op)
        return g, None, None


def _gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
    dispatch(S.ALL_GATHER_INTO_TENSOR, group, False, out, x.contiguous())
    return out


def _scatter(x: torch.Tensor, group: Any) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
    dispatch(S.REDUCE_SCATTER_TENSOR, group, False, out, x.contiguous(), SUM)
    return out


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _scatter(grad, ctx.group), None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _scatter(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather(grad, ctx.group), None


def _plan(g: GroupInfo, op: Collective, dtype: torch.dtype, red: str | None) -> tuple[bool, torch.dtype | None]:
    """Whether the standard (differentiable) form carries the call, and the dtype to carry it as (None: its own).

    A dtype the graph column casts travels as a converting ``.to()``, which autograd goes through. Where the cast
    is a bit-for-bit view of a float as an integer (no gradient), it travels as float32 instead: exact for the
    narrower floats, and the backward's collectives then run in float32 too.
    """
    plan = resolve(g.name, op, dtype, red)
    cast = plan.cast
    if cast is not None and dtype.is_floating_point and not cast.is_floating_point:
        plan, cast = resolve(g.name, op, torch.float32, red), torch.float32
        if plan.cast is not None:
            fail(f"functional.{op.value}", f"{dtype} travels as {plan.cast} in graph mode, which has no gradient")
    # Only the standard forms carry torch's autograd formulas; xccl's own ops (the emulated form) do not.
    if not plan.standard:
        fail(f"functional.{op.value}", "this plugin only emulates it in graph mode, where it is not differentiable")
    return plan.standard, cast


def _as(x: torch.Tensor, cast: torch.dtype | None) -> torch.Tensor:
    return x if cast is None else x.to(cast)


def all_reduce(tensor: torch.Tensor, op: Any = SUM, group: Any = None) -> torch.Tensor:
    """The all-reduced ``tensor`` as a new tensor; differentiable for ``sum`` and ``avg``.

    Raises:
        InvalidArgument: a reduce op other than sum or avg (their adjoint is not a collective).
    """
    if _compiling():
        return _all_reduce_graph(tensor, op, group)
    name = redop(op)
    if name not in ("sum", "avg"):
        raise InvalidArgument("functional.all_reduce", f"reduce op {name!r} is not differentiable; use sum or avg")
    return _AllReduce.apply(tensor, op, group)  # type: ignore[no-any-return,no-untyped-call]


def _all_reduce_graph(tensor: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
    g = group_info(group)
    name = redop(op)
    if name not in ("sum", "avg"):
        fail("functional.all_reduce", "only sum and avg are differentiable")
    native, cast = _plan(g, C.ALL_REDUCE, tensor.dtype, "sum")
    # avg as sum then a divide: torch registers backward formulas for sum only, and both are linear. A bool sum
    # is a logical or, run as max on the cast dtype (as the graph layers do).
    red = "max" if tensor.dtype == torch.bool and cast is not None else "sum"
    out = _collective(g, native, "all_reduce", _as(tensor, cast), red).to(tensor.dtype)
    return out / g.size if name == "avg" else out


def all_gather_into_tensor(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0 (group-rank order); backward reduce-scatters."""
    if _compiling():
        g = group_info(group)
        native, cast = _plan(g, C.ALL_GATHER_INTO_TENSOR, tensor.dtype, None)
        return _collective(g, native, "all_gather_into_tensor", _as(tensor, cast)).to(tensor.dtype)
    return _AllGather.apply(tensor, group)  # type: ignore[no-any-return,no-untyped-call]


def reduce_scatter_tensor(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The sum over ranks of ``tensor``, this rank's dim-0 chunk; backward all-gathers."""
    if _compiling():
        g = group_info(group)
        native, cast = _plan(g, C.REDUCE_SCATTER_TENSOR, tensor.dtype, "sum")
        red = "max" if tensor.dtype == torch.bool and cast is not None else "sum"
        return _collective(g, native, "reduce_scatter_tensor", _as(tensor, cast), red).to(tensor.dtype)
    return _ReduceScatter.apply(tensor, group)  # type: ignore[no-any-return,no-untyped-call]

