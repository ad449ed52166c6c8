"""templatecl as xccl's CPU simulation enforces it: which c10d methods the library has, its dtypes and reduce ops.

With ``XCCL_SIMULATE=template`` every group is xccl's simulated process group: gloo computes, and every call is
first checked against this profile, raising what the library would raise. Write it from the library's own
documentation (its ``ProcessGroup`` class), not from the capability table: the conformance kit then compares two
independent statements with the operation's mathematical result, and a claim the library refuses fails the kit.
"""

from __future__ import annotations

from typing import Final

import torch
from xccl.plugin import SimProfile

__all__ = ["template_profile"]

#: VENDOR: the ``Backend`` methods the library's process group implements (None), or the message it raises.
#: Methods left out raise c10d's "Backend templatecl does not support <method>".
NATIVE_OPS: Final = dict.fromkeys(
    ("allreduce", "allgather", "_allgather_base", "_reduce_scatter_base", "alltoall_base", "broadcast", "reduce",
     "gather", "scatter", "barrier", "send", "recv"),
)
_FLOATS: Final = frozenset({torch.float32, torch.float16, torch.bfloat16})
#: VENDOR: what its collectives accept, and reduce.
DTYPES: Final = _FLOATS | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}
REDUCE_OPS: Final = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})


def template_profile() -> SimProfile:
    """The profile (one object, shared by every simulated group)."""
    return SimProfile(
        backend="templatecl",
        vendor_name="ProcessGroupTemplate",      # how the library's messages name itself
        native_ops=NATIVE_OPS,
        dtypes=DTYPES,
        reduce_ops=REDUCE_OPS,
        dtype_reduce_ops=dict.fromkeys(_FLOATS, frozenset({"sum", "product", "min", "max"})),
        uneven_all_to_all=True,                    # all_to_all_single honours split sizes
    )
