"""Dispatch: native kernel, else an emulation the table allows, else a typed error - before any communication.

Every collective, from every entry point (``xccl.<op>``, ``torch.distributed.<op>`` on xccl's process group, the
graph ops at run time), goes through :func:`dispatch`:

1. find the group's :class:`~xccl.runtime.GroupState`;
2. validate the public arguments with the op's :class:`~xccl.ops._specs.Spec` (what every rank can check
   alone), which also turns them into the kernel arguments;
3. find the kernel for this call shape in the group's plan cache; the first call of a shape plans it
   (``_plan.plan_call``: one question to the capability table, then the fallback policy) and caches the kernel
   built from the plan (:func:`plan`). Where the table prefers a
   composition to the native kernel for some sizes only, the cached kernel picks per call by the call's agreed
   size, which every rank passes alike;
4. while a dispatcher-level tool watches (CommDebugMode, the profiler), show it the call as torch's own path
   would (``_observe``: a flag check on every call, the rest only while watched);
5. with the mismatch detector on, hand the call to it (``_check.checked``: it records the call, and issues and
   watches the kernel itself);
6. call the kernel, translating backend faults into typed errors; an asynchronous call's handle is wrapped so that
   ``wait()`` raises them typed too.

``all_reduce`` has a flat copy of the same steps (:func:`all_reduce`): its cost per call is benchmarked
(``benchmarks/overhead.py``), and a plan-cache hit on a plain tensor calls no helper at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as dist
import torch.utils._python_dispatch

from ..errors import EmulationWarning, InvalidArgument, InvalidArgumentType, UnsupportedCollective
from ..ops import _specs as S
from ..ops._validate import BARE_PREMUL, complex_refusal
from ..plugin._c10d import c10d_kernel
from ..plugin._capabilities import COMPLEX_REDUCE_OPS, Collective, Level, Resolution, reduce_op_name
from ..plugin._kernels import kernel_problems
from ..plugin._vendor_runtime import Completion
from . import _emulate, _faults, _flight, _observe
from ._host_barrier import host_barrier
from ._plan import guarded, plan_call, warn_once
from ._state import STATE, GroupState, state_of

# EmulationWarning is public as xccl.EmulationWarning; this path is kept for filterwarnings lines that name it.
__all__ = ["EmulationWarning", "all_reduce", "dispatch", "invalid", "native_kernel", "plan", "run", "warn_once"]

C = Collective
Kernel = Callable[..., Any]
_RED_OP_TYPE: Final = dist.ReduceOp.RedOpType
_TENSOR: Final = torch.Tensor
_monotonic: Final = time.monotonic
_time_ns: Final = time.time_ns
_TypedWork: Final = _faults.TypedWork
#: What tells whether a dispatcher-level tool may watch (``_observe.watched``): torch's module flags, read per call.
_python_dispatch: Final = torch.utils._python_dispatch


def invalid(op: str, detail: str, wrong_type: bool = False) -> Any:
    """The eager path's error-raiser for validation (``Spec.validate``'s ``fail``)."""
    raise (InvalidArgumentType if wrong_type else InvalidArgument)(op, detail)


# ------------------------------------------------------------------------------------------------------- plans


def _plan_key(reduce_op: Any) -> Any:
    # ReduceOp *instances* (premul_sum) are new objects per call: cache those under the op's name instead, or
    # the cache would grow by one entry per call.
    return reduce_op if reduce_op is None or type(reduce_op) is _RED_OP_TYPE else reduce_op_name(reduce_op)


def plan(st: GroupState, op: Collective, dtype: torch.dtype | None, reduce_op: Any = None) -> Kernel:
    """The kernel for ``op`` with this dtype and reduce op on ``st``'s backend, from the group's plan cache; the
    first call of a shape plans it (:func:`~xccl.collectives._plan.plan_call`) and builds the kernel.

    Raises:
        UnsupportedCollective: the backend cannot run it, or only emulated and the policy is ``"error"``.
    """
    key = (op, dtype, _plan_key(reduce_op))
    kernel = st.plans.get(key)
    if kernel is not None:
        return kernel
    redop = None if reduce_op is None else reduce_op_name(reduce_op)
    # What torch refuses itself (a ValueError, its message), checked here rather than in validation: every call
    # shape comes here first (these are never cached), all_reduce's flat path included, which skips validation.
    if redop == "premul_sum" and not hasattr(reduce_op, "factor"):
        raise InvalidArgument(op.value, BARE_PREMUL)
    if dtype is not None and dtype.is_complex and redop is not None and redop not in COMPLEX_REDUCE_OPS:
        raise InvalidArgument(op.value, complex_refusal(op.value, reduce_op))
    mixed = getattr(st.group, "mixed", None)
    if mixed is not None:
        # A group spanning islands of a mixed-vendor world: its own composition (``_mixed``), checked against every
        # island's table on every rank.
        composed: Kernel = mixed.compose(op, dtype, reduce_op)
        st.plans[key] = composed
        return composed
    p = plan_call(st.table, op, st.fallback, dtype=dtype, reduce_op=redop, world_size=st.size,
                  sdk_versions=st.runtime.sdk_versions())
    native = native_kernel(st, op)
    kernel = _kernel(st, op, p.resolution, native, dtype)
    if p.bounds:
        # A composition preferred at some sizes only: one kernel per size range, chosen per call by the call's
        # agreed size (the same on every rank, so every rank chooses alike).
        kernel = _emulate.by_size(op, p.bounds, [_kernel(st, op, res, native, dtype) for res in p.by_size])
    st.plans[key] = kernel
    return kernel


def _kernel(st: GroupState, op: Collective, res: Resolution, native: Kernel | None, dtype: torch.dtype | None) -> Kernel:
    """The kernel for one resolution: the native one as is, else composed (``_emulate.build``), warning once."""
    if res.via == "" and not res.layered:
        if native is None:
            raise UnsupportedCollective(str(op), st.backend, "marked native but the plugin has no kernel")
        return native
    kernel = _emulate.with_result(op, _emulate.build(st, op, res, native, partial(_block, st)))
    if res.level is Level.EMULATED and st.fallback == "warn":
        warn_once(
            (op.value, st.backend),
            f"xccl: {op.value} is emulated on {st.backend}: {_emulate.describe(op, res, dtype)}. Pass "
            "fallback='emulate' to xccl.init to silence this, or fallback='error' to forbid emulation.",
        )
    return kernel


def native_kernel(st: GroupState, op: Collective) -> Kernel | None:
    """The plugin's kernel for ``op`` (bound to the group's kernel context), else c10d's over the native group.

    A plugin's kernel may refuse a call its documented constraints exclude (``ConstraintViolation``): the fallback
    policy then decides (:func:`~xccl.collectives._plan.guarded`), falling back to xccl's composition of the op
    where it has one. c10d's kernels never refuse, and are returned bare (all_reduce's hot path).

    Raises:
        UnsupportedCollective: the plugin's kernel cannot take the arguments xccl passes (checked once per plan,
            as pluggy checks a hook implementation when it is registered).
    """
    plugin = st.runtime.kernels().get(op)
    if plugin is not None:
        problems = kernel_problems(op, plugin)
        if problems:
            raise UnsupportedCollective(op.value, st.backend, f"the plugin's kernel is broken: {'; '.join(problems)}")
        kernel: Kernel | None = partial(plugin, st.kernel_context)
        via = next(iter(_emulate.EMULATIONS.get(op, ())), None)
        if kernel is not None and via is not None:
            kernel = guarded(st, op, kernel, partial(_constraint_fallback, st, op, via), f"xccl's composition via {via}")
    else:
        kernel = c10d_kernel(op, st.native)
    if op is C.BARRIER and kernel is not None and st.runtime.plugin.vendor_runtime().completion is Completion.AT_ONCE:
        # The vendor's barrier does not hold the host (SCCL): torch's contract, that it returns once every rank
        # entered it, is kept by a barrier on the host (_host_barrier).
        return host_barrier(st, kernel)
    return kernel


def _constraint_fallback(st: GroupState, op: Collective, via: str) -> Kernel:
    """The composition a refusing native kernel falls back to (its building blocks are planned as they run)."""
    return _emulate.with_result(op, _emulate.composition(st, op, via, partial(_block, st)))


# ------------------------------------------------------------------------------------------------------ running


def run(st: GroupState, spec: S.Spec, kargs: Sequence[Any], async_op: bool, *, inner: bool = False) -> Any:
    """Plan and call ``spec``'s kernel with validated kernel arguments.

    Args:
        st: the group.
        spec: the collective.
        kargs: its kernel arguments (``spec.validate``'s result).
        async_op: return a work handle instead of waiting.
        inner: a building block of an emulation: not recorded by the mismatch detector (the emulated call was),
            no typed wrapper (the outer call translates faults), not shown to dispatcher-level tools on its own.
    """
    idx = spec.reduce_op_index
    key = spec.key_of(kargs)
    kernel = plan(st, key, spec.dtype_of(kargs), None if idx is None else kargs[idx])
    if inner:
        if st.flight is not None:
            st.flight.part(spec, kargs)
        return kernel(*kargs, async_op)
    if _python_dispatch._is_in_torch_dispatch_mode or _profiler._is_profiler_enabled:  # see _observe
        return _observe.visible(st, key, spec.name, kargs, partial(_issue, st, spec, kargs, kernel, async_op))
    return _issue(st, spec, kargs, kernel, async_op)


def _issue(st: GroupState, spec: S.Spec, kargs: Sequence[Any], kernel: Kernel, async_op: bool) -> Any:
    """Call a planned kernel (recorded by the flight recorder when it is on): through the mismatch detector when it
    is on, with typed faults."""
    flight = st.flight
    if flight is not None:
        entry = flight.begin(st, spec, kargs)
        entry.started = _time_ns()
        work = _checked_or_typed(st, spec, kargs, kernel, async_op)
        _flight.finish(flight, entry, work)
        return work
    return _checked_or_typed(st, spec, kargs, kernel, async_op)


def _checked_or_typed(st: GroupState, spec: S.Spec, kargs: Sequence[Any], kernel: Kernel, async_op: bool) -> Any:
    if st.check:
        # Imported on the first checked call: the detector is off by default, and importing it costs start-up.
        from ._check import checked

        return checked(st, spec, kargs, kernel, async_op)
    started = _monotonic()
    try:
        work = kernel(*kargs, async_op)
    except RuntimeError as exc:
        raise_typed(exc, st, spec.name, started)
        raise
    if work is None or type(work) is _TypedWork:
        return work
    return _TypedWork(work, st, spec.name, started)


def _block(st: GroupState, spec: S.Spec, kargs: Sequence[Any], async_op: bool = False) -> Any:
    """Run a building block of an emulation on ``st`` (blocking unless ``async_op``: a composition's last block)."""
    return run(st, spec, kargs, async_op, inner=True)


def dispatch(spec: S.Spec, group: Any, async_op: bool, *args: Any) -> Any:
    """Validate ``args`` (the public arguments without ``group`` and ``async_op``) and run ``spec`` on ``group``."""
    st = state_of(group)
    return run(st, spec, spec.validate(st, invalid, *args), async_op)


def raise_typed(exc: RuntimeError, st: GroupState, name: str, started: float | None = None) -> None:
    """Raise the typed error for a backend fault (chaining it), or return when it is not a fault we know."""
    typed = _faults.translate(exc, st, name, started)
    if typed is not exc:
        raise typed from exc


# --------------------------------------------------------------------------------------------- the hot path

_ALL_REDUCE: Final = C.ALL_REDUCE
_SPEC_ALL_REDUCE: Final = S.ALL_REDUCE


def all_reduce(tensor: torch.Tensor, op: Any, group: Any, async_op: bool) -> Any:
    """``dispatch(ALL_REDUCE, ...)``, written flat: the per-call cost of this path is benchmarked.

    On a plan-cache hit with a contiguous plain tensor on the right device and a plain reduce op, nothing but
    the kernel is called; anything else takes the general path, which validates fully.
    """
    st = STATE.default if group is None else None
    if st is None:
        st = state_of(group)
    dev = st.device_type
    if (
        type(tensor) is not _TENSOR
        or type(op) is not _RED_OP_TYPE
        or not (tensor.is_cpu if dev == "cpu" else tensor.is_cuda if dev == "cuda" else tensor.device.type == dev)
        or not tensor.is_contiguous()
    ):
        return run(st, _SPEC_ALL_REDUCE, _SPEC_ALL_REDUCE.validate(st, invalid, tensor, op), async_op)
    kernel = st.plans.get((_ALL_REDUCE, tensor.dtype, op)) or plan(st, _ALL_REDUCE, tensor.dtype, op)
    if _python_dispatch._is_in_torch_dispatch_mode or _profiler._is_profiler_enabled:  # CommDebugMode...: _observe
        kargs = (tensor, op)
        return _observe.visible(st, _ALL_REDUCE, "all_reduce", kargs,
                                partial(_issue, st, _SPEC_ALL_REDUCE, kargs, kernel, async_op))
    flight = st.flight
    if flight is not None:  # the flight recorder: the call, its site and times (_flight), around the same steps
        entry = flight.all_reduce(st, tensor)
        entry.started = _time_ns()
        work = _all_reduce_issue(st, tensor, op, kernel, async_op)
        _flight.finish(flight, entry, work)
        return work
    # _all_reduce_issue, inlined: with the recorder off, a plan-cache hit calls no helper.
    if st.check:
        from ._check import checked_all_reduce

        return checked_all_reduce(st, tensor, op, kernel, async_op)
    try:
        work = kernel(tensor, op, async_op)
    except RuntimeError as exc:
        raise_typed(exc, st, "all_reduce")
        raise
    return work if work is None else _TypedWork(work, st, "all_reduce", _monotonic())


def _all_reduce_issue(st: GroupState, tensor: torch.Tensor, op: Any, kernel: Kernel, async_op: bool) -> Any:
    if st.check:  # the mismatch detector records the call and runs the kernel (what run() would do, flat)
        from ._check import checked_all_reduce

        return checked_all_reduce(st, tensor, op, kernel, async_op)
    try:
        work = kernel(tensor, op, async_op)
    except RuntimeError as exc:
        raise_typed(exc, st, "all_reduce")
        raise
    # Async handles are wrapped so wait() raises typed faults too; the sync path returns None untouched.
    return work if work is None else _TypedWork(work, st, "all_reduce", _monotonic())
