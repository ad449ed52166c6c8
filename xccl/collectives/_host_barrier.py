"""A barrier that blocks the host, on a vendor whose works complete at once (:attr:`Completion.AT_ONCE`).

``torch.distributed.barrier`` returns once every rank of the group entered it, and code relies on it to order
host-side steps: rank 0 writes a checkpoint or downloads a dataset, the others read it after the barrier. On a
vendor whose ``Work.wait()`` returns at once nothing holds the host: SCCL's barrier is an all_reduce queued on the
TPU stream whose work is complete when made (sophgo/torch-tpu@fe9b478 ``ProcessGroupSCCL.cpp:183-191,745-782``).

So xccl's barrier on such a vendor queues the vendor's own barrier, as the vendor does (it orders the device's
stream), then waits on the host-side gloo group xccl creates with each of its groups. Gloo's barrier returns only
once every rank entered it, over TCP on the hosts, whatever the vendor's runtime does, and under the group's
timeout: a rank that never comes is a typed :class:`~xccl.CollectiveTimeout`, not a hang.

A group xccl did not create has no host-side group; there the barrier all_reduces one element on the vendor and
reads it on the host. The read returns once the all_reduce completed, which needs every rank's contribution:
torch_tpu's device-to-host copy synchronises the device's default stream first (``TPUDeviceManager.cpp:413-431``,
``CopyFrom.cpp:404-408``), the stream SCCL queues on unless the caller made another current. No timeout there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BarrierOptions

from ..plugin._c10d import c10d_kernel, done
from ..plugin._capabilities import Collective
from ..plugin._work import Work
from ._state import GroupState

__all__ = ["host_barrier"]

Kernel = Callable[..., Any]


def host_barrier(st: GroupState, vendor: Kernel) -> Kernel:
    """The barrier kernel for ``st``: ``vendor``'s barrier, then one that blocks the host (see the module)."""
    side = st.side
    if side is not None:
        opts = BarrierOptions()

        def barrier(async_op: bool) -> Any:
            vendor(True)  # complete at once: its work is not worth waiting for
            return done(side.barrier(opts), async_op)

        return barrier
    all_reduce = c10d_kernel(Collective.ALL_REDUCE, st.native)
    if all_reduce is None:  # pragma: no cover - c10d always has all_reduce
        return vendor
    device_type = st.device_type

    def read_back(async_op: bool) -> Any:
        vendor(True)
        one = torch.ones(1, device=device_type)
        all_reduce(one, dist.ReduceOp.SUM, False)
        one.item()  # returns once the device finished the all_reduce: every rank had entered it
        return Work() if async_op else None

    return read_back
