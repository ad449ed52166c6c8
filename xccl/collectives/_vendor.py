"""A group of one vendor (:class:`VendorGroup`), and how it runs a call shape: the planner's answer as a kernel.

``VendorGroup.kernel_for`` comes here the first time a group sees a call shape (op, dtype, reduce op):

* the planner (``_plan.plan_call``) asks the vendor's capability table one question and applies the group's fallback
  policy: unsupported, or emulated under ``"error"``, is an :class:`~xccl.UnsupportedCollective`, raised before any
  rank communicates;
* the one rule: the resolution's ``via`` names the composition (``_emulate``); empty means the native kernel: the
  plugin's own (bound to the group's kernel context; a refusal of a documented constraint takes the fallback
  policy, ``_plan.guarded``), else c10d's over the vendor's group. Layers (a cast, avg or premul_sum via sum, a
  complex view) wrap either (``_layers``); an emulation warns once under ``"warn"``;
* a composition preferred at some sizes only (``Prefer``) gives one kernel per size range, chosen per call by the
  call's agreed size, which every rank passes alike.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ..errors import UnsupportedCollective
from ..plugin._c10d import c10d_kernel
from ..plugin._capabilities import Collective, Level, Resolution, reduce_op_name
from ..plugin._kernels import kernel_problems
from ..plugin._vendor_runtime import Completion
from . import _emulate
from ._host_barrier import host_barrier
from ._plan import guarded, plan_call, warn_once
from ._state import GroupState

__all__ = ["VendorGroup", "native_kernel", "plan_kernel"]

C = Collective
Kernel = Callable[..., Any]


class VendorGroup(GroupState):
    """A group of one vendor: its kernels planned from the vendor's capability table under its fallback policy."""

    __slots__ = ()

    def kernel_for(self, op: Collective, dtype: torch.dtype | None, reduce_op: Any, block: Kernel,
                   fallback: Callable[[], Kernel] | None = None) -> Kernel:
        """The kernel of one call shape: :func:`plan_kernel`."""
        return plan_kernel(self, op, dtype, reduce_op, block, fallback)


def plan_kernel(st: GroupState, op: Collective, dtype: torch.dtype | None, reduce_op: Any, block: Kernel,
                fallback: Callable[[], Kernel] | None = None) -> Kernel:
    """The kernel for one call shape on ``st`` (see the module docstring); for a fused op, its native kernel where
    the plan has one, else the portable version ``fallback`` builds.

    Raises:
        UnsupportedCollective: the backend cannot run it, or only emulated and the policy is ``"error"``.
    """
    if fallback is not None:
        return _fused(st, op, dtype, fallback)
    redop = None if reduce_op is None else reduce_op_name(reduce_op)
    p = plan_call(st.table, op, st.fallback, dtype=dtype, reduce_op=redop, world_size=st.size,
                  sdk_versions=st.runtime.sdk_versions())
    call = partial(block, st)
    native = native_kernel(st, op, call)
    kernel = _kernel(st, op, p.resolution, native, dtype, call)
    if p.bounds:
        # A composition preferred at some sizes only: one kernel per size range, chosen per call by the call's
        # agreed size (the same on every rank, so every rank chooses alike).
        kernel = _emulate.by_size(op, p.bounds, [_kernel(st, op, res, native, dtype, call) for res in p.by_size])
    return kernel


def _fused(st: GroupState, op: Collective, dtype: torch.dtype | None, portable: Callable[[], Kernel]) -> Kernel:
    """A fused op's kernel, called as ``kernel(*kernel_args, async_op)`` (its last kernel argument ``chunks`` is the
    portable version's): the plugin's, whose refusal takes the fallback policy, else the portable version under the
    policy for emulations."""
    p = plan_call(st.table, op, st.fallback, dtype=dtype, world_size=st.size, sdk_versions=st.runtime.sdk_versions())
    if p.native:
        native = native_kernel(st, op)
        if native is None:
            raise UnsupportedCollective(op.value, st.plugin, "marked native but the plugin has no kernel")

        def kernel(*kargs: Any) -> Any:
            return native(*kargs[:-2])  # without chunks and async_op

        # A refusal (ConstraintViolation) takes the fallback policy, in the one place collectives take it too.
        return guarded(st, op, kernel, portable, "the portable pipelined version")
    if st.fallback == "warn":
        warn_once(
            (op.value, st.plugin),
            f"xccl: {op.value} is emulated on {st.plugin}: via pipelined (chunked matmul overlapped with async "
            "collectives). Pass fallback='emulate' to xccl.init to silence this.",
        )
    return portable()


def _kernel(st: GroupState, op: Collective, res: Resolution, native: Kernel | None, dtype: torch.dtype | None,
            call: Kernel) -> Kernel:
    """The kernel for one resolution: the native one as is, else composed (``_emulate.build``), warning once."""
    if res.via == "" and not res.layered:
        if native is None:
            raise UnsupportedCollective(str(op), st.plugin, "marked native but the plugin has no kernel")
        return native
    kernel = _emulate.with_result(op, _emulate.build(st, op, res, native, call))
    if res.level is Level.EMULATED and st.fallback == "warn":
        warn_once(
            (op.value, st.plugin),
            f"xccl: {op.value} is emulated on {st.plugin}: {_emulate.describe(op, res, dtype)}. Pass "
            "fallback='emulate' to xccl.init to silence this, or fallback='error' to forbid emulation.",
        )
    return kernel


def native_kernel(st: GroupState, op: Collective, call: Kernel | None = None) -> Kernel | None:
    """The plugin's kernel for ``op`` (bound to the group's kernel context), else c10d's over the native group.

    A plugin's kernel may refuse a call its documented constraints exclude (``ConstraintViolation``): the fallback
    policy then decides (:func:`~xccl.collectives._plan.guarded`), falling back to xccl's composition of the op
    where it has one (its building blocks run through ``call``). c10d's kernels never refuse, and are returned bare.

    Raises:
        UnsupportedCollective: the plugin's kernel cannot take the arguments xccl passes (checked once per plan,
            as pluggy checks a hook implementation when it is registered).
    """
    plugin = st.runtime.kernels().get(op)
    if plugin is not None:
        problems = kernel_problems(op, plugin)
        if problems:
            raise UnsupportedCollective(op.value, st.plugin, f"the plugin's kernel is broken: {'; '.join(problems)}")
        kernel: Kernel | None = partial(plugin, st.kernel_context)
        via = _emulate.first_via(op)
        if kernel is not None and via is not None and call is not None:
            kernel = guarded(st, op, kernel, partial(_constraint_fallback, st, op, via, call),
                             f"xccl's composition via {via}")
    else:
        kernel = c10d_kernel(op, st.native)
    if op is C.BARRIER and kernel is not None and st.runtime.plugin.vendor_runtime().completion is Completion.AT_ONCE:
        # The vendor's barrier does not hold the host (SCCL): torch's contract, that it returns once every rank
        # entered it, is kept by a barrier on the host (_host_barrier).
        return host_barrier(st, kernel)
    return kernel


def _constraint_fallback(st: GroupState, op: Collective, via: str, call: Kernel) -> Kernel:
    """The composition a refusing native kernel falls back to (its building blocks are planned as they run)."""
    return _emulate.with_result(op, _emulate.composition(st, op, via, call))
