"""The Example Devices runtime: one code path for the hardware and the simulation, differing only in the SDK object.

Imported only once the plugin is selected (``TemplatePlugin.runtime``). The base class, ``xccl.plugin.Runtime``,
is plain torch.distributed with working defaults: override only what differs. xccl checks every override's
signature, and every kernel's, when ``xccl.init`` selects the plugin.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from xccl.plugin import Collective, InitError, KernelContext, Plugin, Runtime, c10d_kernel

if TYPE_CHECKING:
    from ._sdk import TemplateSdk

__all__ = ["TemplateRuntime"]


def all_to_all_v(ctx: KernelContext, output: torch.Tensor, input: torch.Tensor,
                 send_count_matrix: list[list[int]], async_op: bool, /) -> Any:
    """``xccl.all_to_all_v`` natively: ``send_count_matrix[i][j]`` elements go from group rank i to group rank j.

    A kernel takes ``ctx`` (``ctx.rank``, ``ctx.size``, ``ctx.ranks``, ``ctx.native``: the library's own process
    group) and the op's kernel arguments (``xccl.plugin.KERNEL_SIGNATURES``), validated by xccl on every rank. It
    returns a work handle when ``async_op`` and None otherwise, and may raise ``xccl.ConstraintViolation`` before
    communicating when the library's documented limits do not hold.
    """
    me = ctx.rank
    # The library's all_to_all_single with split sizes, on ctx.native: torch.distributed on ctx.group would
    # dispatch back into xccl.
    a2a = c10d_kernel(Collective.ALL_TO_ALL_SINGLE_UNEVEN, ctx.native)
    if a2a is None:  # c10d has a method for every standard collective; None is for the uneven and fused ops
        raise NotImplementedError("c10d has no all_to_all_single with split sizes")
    return a2a(output.view(-1), input.view(-1), [row[me] for row in send_count_matrix],
               list(send_count_matrix[me]), async_op)


class TemplateRuntime(Runtime):
    """templatecl through torch_template (or its simulation).

    Args:
        plugin: the plugin.
        simulate: run on CPU over xccl's simulated process group.
        sdk: the SDK object (default: torch_template, or its simulation); a test seam.
    """

    def __init__(self, plugin: Plugin, *, simulate: bool, sdk: TemplateSdk | None = None) -> None:
        super().__init__(plugin, simulate=simulate)
        if sdk is None:
            if simulate:
                from ._sdk_sim import SimTemplateSdk

                sdk = SimTemplateSdk()
            else:
                from ._sdk import RealTemplateSdk

                sdk = RealTemplateSdk()
        self.sdk: TemplateSdk = sdk

    def setup_device(self, local_rank: int) -> torch.device:
        """Make device ``local_rank`` current, after checking this process sees it.

        Raises:
            InitError: fewer devices are visible than this local rank needs.
        """
        count = self.sdk.device_count()
        if not 0 <= local_rank < count:
            visible = os.environ.get("TEMPLATE_VISIBLE_DEVICES")
            raise InitError(
                f"local rank {local_rank} needs device {local_rank}, but {count} Example Devices device(s) are visible "
                f"(TEMPLATE_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}): start at most {count} ranks "
                "per node, or widen TEMPLATE_VISIBLE_DEVICES"
            )
        self.sdk.set_device(local_rank)
        return torch.device("cpu") if self.sdk.device_type == "cpu" else torch.device(self.sdk.device_type, local_rank)

    def process_group_options(self, ranks: Sequence[int] | None) -> Any:
        """The library's options for every group xccl creates (None: its defaults)."""
        return self.sdk.options(ranks)

    def comm_name(self, group: dist.ProcessGroup) -> str:
        """Stable, the same on every member, unique per group: torch's group name is all three.
        VENDOR: the library's own communicator name, where its fused kernels need it."""
        return f"template:{group.group_name}"

    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        """Kernels for what torch.distributed has no function for (here: the count-matrix all-to-all)."""
        return {Collective.ALL_TO_ALL_V: all_to_all_v}

    def sdk_versions(self) -> Mapping[str, str]:
        """The SDK versions found (checked against the table's ``min_sdk`` floors)."""
        return self.sdk.versions()
