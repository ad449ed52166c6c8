"""The fused ops as graph ops (``torch.ops.xccl.mm_reduce_scatter`` & co.), and how each call picks its kernel.

One op per fused collective, functional (new tensors out), taking the group by name so that a compiled graph can
hold it; ``group_size`` is passed explicitly (as in ``_c10d_functional``) so shapes are known without the group.
``chunks`` is 0 for "choose from the shape". The public functions call these ops in eager mode too, so autograd
has one formula for both (``_autograd``).

Each op's implementation plans the call as every collective does (``xccl.collectives._plan``): the plugin's
native kernel where the plan says native, and when that kernel refuses the call (a documented constraint failed,
:class:`~xccl.ConstraintViolation`) the fallback policy decides between raising and the portable version, as for
collectives (``_plan.guarded``); where the table says emulated, the portable version (``_portable``) under the
fallback policy for emulations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._dispatch import dispatch, native_kernel
from ..collectives._plan import guarded, plan_call, warn_once
from ..collectives._state import GroupState, state_of
from ..errors import ConstraintFallbackWarning, EmulationWarning, UnsupportedCollective
from ..ops import _specs as S
from ..plugin._capabilities import Collective
from . import _portable
from ._validate import check_all_gather_mm, check_mm_all_reduce, check_mm_reduce_scatter

__all__ = ["ConstraintFallbackWarning"]

LOG = logging.getLogger("xccl")
C = Collective
_SUM: Final = dist.ReduceOp.SUM


def _run(st: GroupState, op: Collective, dtype: torch.dtype, native_args: tuple[Any, ...],
         portable: Callable[[], Any]) -> Any:
    """The native kernel of ``op`` when the plan has one and it takes the call, else the portable version."""
    if getattr(st.group, "mixed", None) is not None:
        # A group spanning vendors' islands: one island's fused kernel cannot reach the others' ranks, and every
        # rank must take the same path; the portable version's collectives are composed across the islands.
        return portable()
    p = plan_call(st.table, op, st.fallback, dtype=dtype, world_size=st.size, sdk_versions=st.runtime.sdk_versions())
    if p.native:
        kernel = native_kernel(st, op)
        if kernel is None:
            raise UnsupportedCollective(op.value, st.backend, "marked native but the plugin has no kernel")
        # A refusal (ConstraintViolation) takes the fallback policy, in the one place collectives take it too.
        return guarded(st, op, kernel, lambda: lambda *_: portable(), "the portable pipelined version")(*native_args)
    if st.fallback == "warn":
        warn_once(
            (op.value, st.backend),
            f"xccl: {op.value} is emulated on {st.backend}: via pipelined (chunked matmul overlapped with async "
            "collectives). Pass fallback='emulate' to xccl.init to silence this.",
            EmulationWarning,
        )
    return portable()


def _resolve_group(group_name: str) -> Any:
    c10d: Any = dist.distributed_c10d
    return c10d._resolve_process_group(group_name)


def _mm_reduce_scatter_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, reduce_op: str, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    group = _resolve_group(group_name)
    st = state_of(group)
    return _run(  # type: ignore[no-any-return]
        st, C.MM_REDUCE_SCATTER, a.dtype, (a, b, reduce_op, bias),
        lambda: _portable.mm_reduce_scatter(st, a, b, group, reduce_op, bias, chunks),
    )


def _all_gather_mm_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, gather_output: bool, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    group = _resolve_group(group_name)
    st = state_of(group)
    out, gathered = _run(
        st, C.ALL_GATHER_MM, a.dtype, (a, b, gather_output),
        lambda: _portable.all_gather_mm(st, a, b, group, gather_output, chunks),
    )
    return out, gathered if gather_output else a.new_empty(0)


def _mm_all_reduce_impl(
    a: torch.Tensor, b: torch.Tensor, group_name: str, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    group = _resolve_group(group_name)
    st = state_of(group)
    return _run(  # type: ignore[no-any-return]
        st, C.MM_ALL_REDUCE, a.dtype, (a, b, bias),
        lambda: _portable.mm_all_reduce(st, a, b, group, bias, chunks),
    )


def _all_gather_impl(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _resolve_group(group_name)
    out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
    dispatch(S.ALL_GATHER_INTO_TENSOR, group, False, out, x.contiguous())
    return out


def _reduce_scatter_impl(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _resolve_group(group_name)
    out = x.new_empty((x.shape[0] // group.size(), *x.shape[1:]))
    dispatch(S.REDUCE_SCATTER_TENSOR, group, False, out, x.contiguous(), _SUM)
    return out


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


