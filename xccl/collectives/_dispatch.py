"""Dispatch: every call's one pipeline, from the public arguments to the kernel.

Every collective, from every entry point (``xccl.<op>``, ``torch.distributed.<op>`` on xccl's process group, the
graph ops at run time, the parts of a mixed group's compositions), goes through :func:`dispatch`, and every call
that runs a kernel through :func:`run`:

1. find the group's :class:`~xccl.collectives._state.GroupState` (its kind is its type: one vendor's group, or a
   mixed group spanning islands);
2. validate the public arguments with the op's :class:`~xccl.ops._specs.Spec` (what every rank can check alone),
   which also turns them into the kernel arguments;
3. **plan**: find the kernel for this call shape (op, dtype, reduce op) in the group's plan cache; the first call
   of a shape asks the group (``GroupState.kernel_for``: the capability table and the fallback policy, or a mixed
   group's composition), so that an unsupported call is refused before any rank communicates, on every rank alike;
4. **hooks**: the group's pipeline (``st.issue``, built by ``_hooks`` from its observers: the view dispatcher-level
   tools get, the flight recorder, typed faults, the mismatch detector), ending in the kernel.

The building blocks of an emulation run through :func:`block`: planned like any call, through the group's inner
chain (``st.issue_inner``): the emulated call was observed as a whole.

``all_reduce`` validates inline what a plain call needs (a contiguous plain tensor on the group's device, a plain
reduce op) and otherwise takes the same path: it is the op DDP's reducer and most training loops call most, and
its per-call cost is benchmarked (``benchmarks/overhead.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ..errors import EmulationWarning, InvalidArgument, InvalidArgumentType
from ..ops import _specs as S
from ..ops._c10d import PLAIN_OP_KEY
from ..ops._validate import BARE_PREMUL, complex_refusal
from ..ops._vocab import premul_factor
from ..plugin._capabilities import COMPLEX_REDUCE_OPS, Collective, reduce_op_name
from ._groups import state_of
from ._plan import warn_once
from ._state import GROUPS, GroupState

# EmulationWarning is public as xccl.EmulationWarning; this path is kept for filterwarnings lines that name it.
__all__ = ["EmulationWarning", "all_reduce", "block", "dispatch", "invalid", "plan", "run", "warn_once"]

C = Collective
Kernel = Callable[..., Any]
_RED_OP_TYPE: Final = dist.ReduceOp.RedOpType
_PLAIN: Final = PLAIN_OP_KEY
_TENSOR: Final = torch.Tensor


def invalid(op: str, detail: str, wrong_type: bool = False) -> Any:
    """The eager path's error-raiser for validation (``Spec.validate``'s ``fail``)."""
    raise (InvalidArgumentType if wrong_type else InvalidArgument)(op, detail)


# ------------------------------------------------------------------------------------------------------- plans


def _plan_key(reduce_op: Any) -> Any:
    # A plain op's value (its RedOpType object hashes through pybind: PLAIN_OP_KEY). ReduceOp *instances*
    # (premul_sum) are new objects per call: cache those under the op's name instead, or the cache would grow by
    # one entry per call.
    key = _PLAIN.get(id(reduce_op))
    if key is not None or reduce_op is None:
        return key
    return reduce_op.value if type(reduce_op) is _RED_OP_TYPE else reduce_op_name(reduce_op)


def plan(st: GroupState, op: Collective, dtype: torch.dtype | None, reduce_op: Any = None) -> Kernel:
    """The kernel for ``op`` with this dtype and reduce op on ``st``, from the group's plan cache; the first call of
    a shape asks the group (``GroupState.kernel_for``) and caches the answer.

    Raises:
        InvalidArgument: what torch refuses itself (a bare PREMUL_SUM, a reduce op complex numbers lack).
        UnsupportedCollective: the group cannot run it, or only emulated and the policy is ``"error"``.
    """
    key = (op, dtype, _plan_key(reduce_op))
    kernel = st.plans.get(key)
    if kernel is not None:
        return kernel
    redop = None if reduce_op is None else reduce_op_name(reduce_op)
    # What torch refuses itself (a ValueError, its message), checked here rather than in validation: every call
    # shape comes here first (these are never cached), all_reduce's inline path included, which skips validation.
    if redop == "premul_sum" and premul_factor(reduce_op) is None:
        raise InvalidArgument(op.value, BARE_PREMUL)
    if dtype is not None and dtype.is_complex and redop is not None and redop not in COMPLEX_REDUCE_OPS:
        raise InvalidArgument(op.value, complex_refusal(op.value, reduce_op))
    kernel = st.plans[key] = st.kernel_for(op, dtype, reduce_op, block)
    return kernel


# ------------------------------------------------------------------------------------------------------ running


def run(st: GroupState, spec: S.Spec, kargs: Sequence[Any], async_op: bool) -> Any:
    """Plan ``spec``'s call with validated kernel arguments, then run it through the group's hooks."""
    idx = spec.reduce_op_index
    kernel = plan(st, spec.key_of(kargs), spec.dtype_of(kargs), None if idx is None else kargs[idx])
    return st.issue(spec, kargs, kernel, async_op)


def block(st: GroupState, spec: S.Spec, kargs: Sequence[Any], async_op: bool = False) -> Any:
    """Run a building block of an emulation on ``st`` (blocking unless ``async_op``: a composition's last block),
    planned as any call, through the group's inner chain."""
    idx = spec.reduce_op_index
    kernel = plan(st, spec.key_of(kargs), spec.dtype_of(kargs), None if idx is None else kargs[idx])
    return st.issue_inner(spec, kargs, kernel, async_op)


def dispatch(spec: S.Spec, group: Any, async_op: bool, *args: Any) -> Any:
    """Validate ``args`` (the public arguments without ``group`` and ``async_op``) and run ``spec`` on ``group``.

    :func:`run`, written out for a plan-cache hit: this is every call's path but all_reduce's, and on a GPU, where a
    small collective is handed to the device in about fifteen microseconds, each Python call on it shows.
    """
    st = GROUPS.default if group is None else None
    if st is None:
        st = state_of(group)
    kargs = spec.validate(st, invalid, *args)
    idx = spec.reduce_op_index
    reduce_op = None if idx is None else kargs[idx]
    dtype = spec.dtype_of(kargs)
    key = spec.key if spec.variant is None else spec.key_of(kargs)
    kernel = st.plans.get((key, dtype, _PLAIN.get(id(reduce_op)))) or plan(st, key, dtype, reduce_op)
    return st.issue(spec, kargs, kernel, async_op)


# --------------------------------------------------------------------------------------------- all_reduce

_ALL_REDUCE: Final = C.ALL_REDUCE
_SPEC_ALL_REDUCE: Final = S.ALL_REDUCE


def all_reduce(tensor: torch.Tensor, op: Any, group: Any, async_op: bool) -> Any:
    """``dispatch(ALL_REDUCE, ...)`` with the validation of a plain call inline.

    A contiguous plain tensor on the group's device with a plain reduce op needs nothing else checked; anything
    else takes the general path, which validates fully.
    """
    st = GROUPS.default
    if st is None or (group is not None and st.group is not group):  # the world's state is at hand (DDP's buckets)
        st = state_of(group)
    dev = st.device_type
    if (
        type(tensor) is not _TENSOR
        or type(op) is not _RED_OP_TYPE
        or not (tensor.is_cpu if dev == "cpu" else tensor.is_cuda if dev == "cuda" else tensor.device.type == dev)
        or not tensor.is_contiguous()
    ):
        return run(st, _SPEC_ALL_REDUCE, _SPEC_ALL_REDUCE.validate(st, invalid, tensor, op), async_op)
    kernel = st.plans.get((_ALL_REDUCE, tensor.dtype, _PLAIN.get(id(op)))) or plan(st, _ALL_REDUCE, tensor.dtype, op)
    return st.issue(_SPEC_ALL_REDUCE, (tensor, op), kernel, async_op)
