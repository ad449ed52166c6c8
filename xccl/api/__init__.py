"""The public collectives: where the eager path and the graph path meet.

Every function here has ``torch.distributed``'s signature and semantics and does one thing: while
``torch.compile`` traces, it hands over to the op's graph form (``xccl.graph``); otherwise it dispatches
(``xccl.collectives``). Both validate with the op's one description (``xccl.ops._specs``), so a bad call
raises the same typed error in both modes.
"""

from ._collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
)
from ._extensions import (
    all_gather_coalesced,
    all_gather_into_tensor_uneven,
    all_reduce_coalesced,
    all_to_all_v,
    reduce_scatter_tensor_uneven,
)
from ._p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "gather",
    "irecv",
    "monitored_barrier",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_uneven",
    "scatter",
    "send",
]
