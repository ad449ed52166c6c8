"""What the plugin does once selected: the place to import the vendor SDK, set devices, name communicators and
provide kernels beyond torch.distributed. The base class, ``xccl.plugin.Runtime``, is plain torch.distributed;
override only what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from xccl.plugin import Collective, KernelContext, Plugin, Runtime, c10d_kernel

__all__ = ["TemplateRuntime"]


def _all_to_all_v(ctx: KernelContext, output: torch.Tensor, input: torch.Tensor, matrix: list[list[int]],
                  async_op: bool) -> Any:
    """``xccl.all_to_all_v`` natively: ``matrix[i][j]`` elements go from group rank i to group rank j.

    A kernel takes ``ctx`` (a ``KernelContext``: ``ctx.rank``, ``ctx.size``, ``ctx.ranks``, ``ctx.native`` the
    vendor's own process group) and then the op's kernel arguments (``xccl.plugin.KERNEL_SIGNATURES``), already
    validated by xccl on every rank. It returns a work handle when ``async_op`` and None otherwise. A kernel with
    documented limits raises ``xccl.plugin.ConstraintViolation`` before communicating when they do not hold.
    """
    me = ctx.rank
    # The vendor's own all_to_all_single with split sizes (c10d's alltoall_base on ctx.native): calling
    # torch.distributed on ctx.group instead would dispatch back into xccl.
    a2a = c10d_kernel(Collective.ALL_TO_ALL_SINGLE_UNEVEN, ctx.native)
    return a2a(output.view(-1), input.view(-1), [row[me] for row in matrix], list(matrix[me]), async_op)


class TemplateRuntime(Runtime):
    """The template's runtime: a vendor prefix on communicator names, and one native kernel."""

    def __init__(self, plugin: Plugin, *, simulate: bool) -> None:
        super().__init__(plugin, simulate=simulate)
        # A real plugin imports its SDK here, and only here (e.g. `import torch_npu`), turning an ImportError
        # into xccl.BackendUnavailable(name, reason, fix).

    def comm_name(self, group: dist.ProcessGroup) -> str:
        """Stable, the same on every member, unique per group: torch's group name is all three."""
        return f"template:{group.group_name}"

    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        """Native kernels for ops torch.distributed has no function for (here: the count-matrix all-to-all)."""
        return {Collective.ALL_TO_ALL_V: _all_to_all_v}
