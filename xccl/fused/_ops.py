"""The fused ops as graph ops (``torch.ops.xccl.mm_reduce_scatter`` & co.), and how each call picks its kernel.

One op per fused collective, functional (new tensors out), taking the group by name so that a compiled graph can
hold it; ``group_size`` is passed explicitly (as in ``_c10d_functional``) so shapes are known without the group.
``chunks`` is 0 for "choose from the shape". The public functions call these ops in eager mode too, so autograd
has one formula for both (``_autograd``).

Each op's implementation is a call like any other (:func:`_run`; how the kernel is chosen: docs/fused.md, "How a
call runs"): one flight recorder entry under the fused op's name, whose parts are the portable version's collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._dispatch import block, dispatch
from ..collectives._groups import state_of
from ..errors import ConstraintFallbackWarning
from ..ops import _specs as S
from . import _portable
from ._validate import check_all_gather_mm, check_mm_all_reduce, check_mm_reduce_scatter

__all__ = ["ConstraintFallbackWarning"]

_SUM: Final = dist.ReduceOp.SUM


def _run(group_name: str, spec: S.Spec, kargs: tuple[Any, ...], portable: Callable[..., Any]) -> Any:
    """Run fused op ``spec`` on the group called ``group_name`` as any call runs: planned once per call shape by the
    group (its native kernel where the plan has one and it takes the call, else ``portable``, the portable version),
    then through the group's hooks, so the recorder, the detector and typed faults see it as one call."""
    group = _resolve_group(group_name)
    st = state_of(group)
    dtype = kargs[0].dtype
    key = (spec.key, dtype, None)
    kernel = st.plans.get(key)
    if kernel is None:
        def portable_kernel(*args: Any) -> Any:
            return portable(st, group, *args[:-1])  # without async_op

        kernel = st.plans[key] = st.kernel_for(spec.key, dtype, None, block, lambda: portable_kernel)
    return st.issue(spec, kargs, kernel, False)  # planned here: the group's hooks, then the kernel


def _resolve_group(group_name: str) -> Any:
    c10d: Any = dist.distributed_c10d
    return c10d._resolve_process_group(group_name)


@torch.library.custom_op("xccl::mm_reduce_scatter", mutates_args=())
def _op_mm_reduce_scatter(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, reduce_op: str = "sum",
    bias: torch.Tensor | None = None, chunks: int = 0,
) -> torch.Tensor:
    return _run(group_name, S.MM_REDUCE_SCATTER, (a, b, reduce_op, bias, chunks),  # type: ignore[no-any-return]
                _portable.mm_reduce_scatter)


@_op_mm_reduce_scatter.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, reduce_op: str = "sum",
    bias: torch.Tensor | None = None, chunks: int = 0,
) -> torch.Tensor:
    check_mm_reduce_scatter(a, b, group_size, reduce_op, bias)
    return a.new_empty((a.shape[0] // group_size, b.shape[1]))


@torch.library.custom_op("xccl::all_gather_mm", mutates_args=())
def _op_all_gather_mm(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, gather_output: bool = True, chunks: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    out, gathered = _run(group_name, S.ALL_GATHER_MM, (a, b, gather_output, chunks), _portable.all_gather_mm)
    return out, gathered if gather_output else a.new_empty(0)


@_op_all_gather_mm.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, gather_output: bool = True, chunks: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    check_all_gather_mm(a, b, group_size, gather_output)
    rows = a.shape[0] * group_size
    gathered = a.new_empty((rows, a.shape[1])) if gather_output else a.new_empty(0)
    return a.new_empty((rows, b.shape[1])), gathered


@torch.library.custom_op("xccl::mm_all_reduce", mutates_args=())
def _op_mm_all_reduce(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, bias: torch.Tensor | None = None,
    chunks: int = 0,
) -> torch.Tensor:
    return _run(group_name, S.MM_ALL_REDUCE, (a, b, bias, chunks), _portable.mm_all_reduce)  # type: ignore[no-any-return]


@_op_mm_all_reduce.register_fake
def _(
    a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int, bias: torch.Tensor | None = None,
    chunks: int = 0,
) -> torch.Tensor:
    check_mm_all_reduce(a, b, group_size, bias)
    return a.new_empty((*a.shape[:-1], b.shape[1]))


# Plain collectives for the backward formulas, dispatched through xccl (so an emulated reduce-scatter, as on SCCL,
# works) yet traceable into a compiled backward graph.
@torch.library.custom_op("xccl::_fused_all_gather", mutates_args=())
def _op_all_gather(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    out = x.new_empty((group_size * x.shape[0], *x.shape[1:]))
    dispatch(S.ALL_GATHER_INTO_TENSOR, _resolve_group(group_name), False, out, x.contiguous())
    return out


@_op_all_gather.register_fake
def _(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] * group_size, *x.shape[1:]))


@torch.library.custom_op("xccl::_fused_reduce_scatter", mutates_args=())
def _op_reduce_scatter(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // group_size, *x.shape[1:]))
    dispatch(S.REDUCE_SCATTER_TENSOR, _resolve_group(group_name), False, out, x.contiguous(), _SUM)
    return out


@_op_reduce_scatter.register_fake
def _(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))
