"""Capability entries any plugin can reuse: the emulations xccl provides over the even collectives."""

from __future__ import annotations

from typing import Final

from ._capabilities import Collective, Level, Support

C = Collective

#: Emulations available on any backend that has the even collectives: what gloo and nccl lack.
PORTABLE: Final[dict[Collective, Support]] = {
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: Support(
        Level.EMULATED, via="padding", note="rows padded to the largest split, then all_gather_into_tensor"
    ),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: Support(
        Level.EMULATED, via="padding", note="chunks padded to the largest split, then an even reduce-scatter"
    ),
    C.ALL_TO_ALL_V: Support(Level.EMULATED, via="all_to_all_single", note="all_to_all_single with the matrix's splits"),
    C.MONITORED_BARRIER: Support(
        Level.EMULATED, via="store",
        note="torch's gloo algorithm over the rendezvous store (the backend needs no monitoredBarrier): rank 0 waits "
        "for every rank's arrival within the timeout, then every rank raises naming the late ones",
    ),
    C.MM_REDUCE_SCATTER: Support(Level.EMULATED, via="pipelined", note="chunked matmul overlapped with async reduce_scatter"),
    C.ALL_GATHER_MM: Support(Level.EMULATED, via="pipelined", note="async all_gather of chunks overlapped with matmuls"),
    C.MM_ALL_REDUCE: Support(Level.EMULATED, via="pipelined", note="chunked matmul overlapped with async all_reduce"),
}
