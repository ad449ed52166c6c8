"""Plugins that break the contract in ways only running them shows: the conformance kit and ``xccl.init`` must
fail each, with a message that names the claim or the method and says what to write.

``bool-liar`` claims bool AVG and bool BXOR natively for all_reduce, as a vendor might copy from its integer
row; its simulated library (like CNCL) reduces bool with sum, product, min and max only (a per-dtype rule of its
simulation profile), and AVG over bool means nothing.
``bad-kernel`` returns an all_to_all_v kernel written for another signature (no count matrix).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from xccl.plugin import (
    CapabilityTable,
    Collective,
    KernelContext,
    Level,
    Plugin,
    Runtime,
    SimProfile,
    Support,
    table_from,
)

C = Collective
_DTYPES = frozenset({torch.float32, torch.int64, torch.bool})
_ARITHMETIC = frozenset({"sum", "product", "min", "max"})
_BITWISE = frozenset({"band", "bor", "bxor"})


class BoolLiar(Plugin):
    """A simulated vendor whose table claims more over bool than its library does."""

    name = "bool-liar"
    vendor = "xccl tests"
    device_type = "cpu"
    backend = "boolliarcl"
    accelerator = False

    @functools.cache  # noqa: B019
    def capabilities(self) -> CapabilityTable:
        claimed = Support(
            Level.NATIVE, dtypes=_DTYPES, reduce_ops=_ARITHMETIC | _BITWISE,
            # The lie: copied from the integer row of another library.
            dtype_reduce_ops={torch.float32: _ARITHMETIC, torch.bool: _ARITHMETIC | {"avg", "bxor"}},
        )
        return table_from(self.name, {C.ALL_REDUCE: claimed, C.BROADCAST: Support(Level.NATIVE, dtypes=_DTYPES),
                                      C.BARRIER: Support(Level.NATIVE)})

    def simulation(self) -> SimProfile:
        return SimProfile(
            backend=self.backend, vendor_name="ProcessGroupBoolLiar",
            native_ops={"allreduce": None, "broadcast": None, "barrier": None},
            dtypes=_DTYPES, reduce_ops=_ARITHMETIC | _BITWISE, uneven_all_to_all=True,
            dtype_reduce_ops={torch.bool: _ARITHMETIC},
        )


def _all_to_all_v(ctx: KernelContext, output: torch.Tensor, input: torch.Tensor, async_op: bool) -> Any:
    """Written for a contract without the count matrix: xccl passes one argument more than it takes."""
    raise AssertionError("never called: xccl.init refuses the plugin first")


class _BadKernelRuntime(Runtime):
    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        return {C.ALL_TO_ALL_V: _all_to_all_v}


class BadKernel(Plugin):
    """A gloo plugin whose native all_to_all_v kernel has the wrong signature."""

    name = "bad-kernel"
    vendor = "xccl tests"
    device_type = "cpu"
    backend = "gloo"
    accelerator = False

    @functools.cache  # noqa: B019
    def capabilities(self) -> CapabilityTable:
        from xccl import capabilities

        return capabilities("cpu")

    def runtime(self, *, simulate: bool) -> Runtime:
        return _BadKernelRuntime(self, simulate=simulate)


bool_liar = BoolLiar()
bad_kernel = BadKernel()
