"""What the plugin does once selected: the place to import the vendor SDK, set devices, name communicators and
provide kernels beyond torch.distributed. The base class, ``xccl.Runtime``, is plain torch.distributed; override
only what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from xccl import Collective, Plugin, Runtime

__all__ = ["TemplateRuntime"]


def _all_to_all_v(ctx: Any, output: torch.Tensor, input: torch.Tensor, matrix: list[list[int]], group: Any,
                  async_op: bool) -> Any:
    """``xccl.all_to_all_v`` natively: ``matrix[i][j]`` elements go from group rank i to group rank j.

    A kernel takes ``ctx`` (the group's dispatch context: ``ctx.rank``, ``ctx.size``, ``ctx.ranks``) and then the
    public function's arguments, already validated by xccl on every rank. It returns what torch.distributed would
    (a Work handle when ``async_op``). A kernel with documented limits raises ``xccl.ConstraintViolation`` before
    communicating when they do not hold.
    """
    me = ctx.rank
    return dist.all_to_all_single(
        output.view(-1), input.view(-1), [row[me] for row in matrix], list(matrix[me]), group=group, async_op=async_op
    )


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
