"""HCCL as xccl's simulation layer enforces it: which c10d methods exist, dtypes, reduce ops, options.

The table follows ``ProcessGroupHCCL.hpp`` (manifest A3): every standard collective is overridden; ``recvAnysource``
raises; ``allgather_coalesced`` is not overridden, so it raises c10d's base-class message. Reductions the profile
cannot tell apart per op (HCCL reduces fewer dtypes than it moves) are kept from HCCL by xccl's capability table,
which casts or refuses them before they reach the group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

from xccl.plugin import SimProfile

from ._capabilities import MOVED_DTYPES
from ._hccl_config import torch_check

__all__ = ["SimHcclOptions", "check_options", "hccl_profile"]

LOG = logging.getLogger("xccl.ascend")

_IMPLEMENTED: Final = (
    "allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_into_tensor_coalesced",
    "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base",
    "broadcast", "reduce", "gather", "scatter", "barrier", "send", "recv",
)


@dataclass
class SimHcclOptions:
    """Stands in for ``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options`` in simulation (same fields)."""

    #: HCCL communicator options; see :data:`xccl_ascend.HCCL_CONFIG_KEYS`.
    hccl_config: dict[str, int | str] = field(default_factory=dict)
    op_timeout: int | None = None
    #: Overwritten by torch_npu's creator in the real backend (gotcha 10); kept for the same shape.
    is_high_priority_stream: bool = False
    global_ranks_in_group: list[int] = field(default_factory=list)
    group_id: str = ""


def check_options(pg_options: object | None, group_rank: int, group_size: int) -> None:
    """What torch_npu's creator and ``createHcclCommConfigWithOptions`` do with ``pg_options``.

    Anything that is not an Options object is replaced by fresh Options (so its settings are lost, which the
    simulation logs); ``hccl_config`` values of the wrong type fail HCCL's ``TORCH_CHECK`` (on hardware at the
    first collective, here at group creation).

    Raises:
        RuntimeError: "Value type of <key> should be int." / "... should be string".
    """
    if pg_options is None:
        return
    if not isinstance(pg_options, SimHcclOptions):
        LOG.warning(
            "pg_options of type %s is not ProcessGroupHCCL.Options: HCCL builds fresh Options and ignores it "
            "(group rank %d of %d)", type(pg_options).__name__, group_rank, group_size,
        )
        return
    torch_check(pg_options.hccl_config)


def hccl_profile() -> SimProfile:
    """The profile registered as the ``hccl`` backend in simulation."""
    ops: dict[str, str | None] = dict.fromkeys(_IMPLEMENTED)
    ops["recv_anysource"] = "ProcessGroupHCCL does not support recv"
    return SimProfile(
        backend="hccl",
        vendor_name="ProcessGroupHCCL",
        native_ops=ops,
        dtypes=frozenset(MOVED_DTYPES),
        reduce_ops=frozenset({"sum", "product", "min", "max", "avg", "premul_sum"}),
        uneven_all_to_all=True,
        check_options=check_options,
    )
