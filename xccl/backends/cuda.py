"""The ``cuda`` plugin: torch.distributed's NCCL backend on CUDA GPUs.

The table follows ProcessGroupNCCL in torch 2.13: every standard collective is native; NCCL reduces with SUM,
PRODUCT, MIN, MAX, AVG and PREMUL_SUM (floats) and rejects the bitwise ops ("Cannot use ReduceOp.BAND with
NCCL"); bool is carried as uint8. ``scripts/probe_backend.py --backend nccl --device cuda`` re-checks the entries on
a GPU (not yet run on one: docs/performance.md).
"""

from __future__ import annotations

import functools
import os
from typing import Final

import torch

from ..ops._torch import TORCH
from ..plugin import (
    PORTABLE,
    CapabilityTable,
    Collective,
    Level,
    Plugin,
    ProbeResult,
    Support,
    graph_entries,
    table_from,
)
from ..plugin._capabilities import REAL_DTYPES

__all__ = ["CudaPlugin", "plugin"]

C = Collective
_NCCL_OPS: Final = frozenset({"sum", "product", "min", "max", "avg", "premul_sum"})


class CudaPlugin(Plugin):
    """CUDA GPUs over NCCL."""

    name = "cuda"
    vendor = "NVIDIA (nccl)"
    device_type = "cuda"
    backend = "nccl"
    accelerator = True
    visible_devices_env = "CUDA_VISIBLE_DEVICES"

    def probe(self) -> ProbeResult:
        """Available when torch was built with CUDA and NCCL and sees at least one GPU."""
        import torch.distributed as dist

        if torch.version.cuda is None:
            return ProbeResult.unavailable(
                f"torch {TORCH.version} is a CPU-only build",
                "install a CUDA build of torch (e.g. from the cu12x index) on a machine with an NVIDIA GPU",
                torch=TORCH.version,
            )
        if not dist.is_available() or not dist.is_nccl_available():
            return ProbeResult.unavailable("this torch build has no NCCL backend", "install a torch build with NCCL")
        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if count == 0:
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r} hides them?)" if visible is not None else ""
            return ProbeResult.unavailable(
                f"no CUDA device is visible{hint}", "check nvidia-smi and CUDA_VISIBLE_DEVICES", cuda=str(torch.version.cuda)
            )
        return ProbeResult.ok(cuda=str(torch.version.cuda), devices=str(count), nccl=".".join(map(str, torch.cuda.nccl.version())))  # type: ignore[no-untyped-call]

    @functools.cache  # noqa: B019 - one plugin object per process; the table is immutable data
    def capabilities(self) -> CapabilityTable:
        """NCCL's table."""
        reducing = Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES), reduce_ops=_NCCL_OPS,
                           note="bitwise reduce ops are rejected by NCCL; bool is reduced as uint8")
        native = Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES))
        eager = {op: native for op in C} | {
            C.ALL_REDUCE: reducing,
            C.ALL_REDUCE_COALESCED: reducing,
            # ProcessGroupNCCL::allgather_coalesced and recvAnysource raise "ProcessGroupNCCL does not support ...".
            C.ALL_GATHER_COALESCED: Support(Level.EMULATED, via="all_gather",
                                            note="ProcessGroupNCCL does not support allgather_coalesced"),
            C.RECV_ANY_SOURCE: Support(Level.UNSUPPORTED, note="NCCL cannot receive from any source "
                                       "(ProcessGroupNCCL does not support recvAnysource); pass src"),
            C.REDUCE: reducing,
            C.REDUCE_SCATTER: reducing,
            C.REDUCE_SCATTER_TENSOR: reducing,
            C.BARRIER: Support(Level.NATIVE),
            **PORTABLE,
        }
        # Graph mode: every op compiles to a _c10d_functional op or an xccl graph op that ends in the same
        # process-group call as eager mode (tests/test_graph_claims.py checks each entry).
        return table_from("cuda", eager, graph=graph_entries(eager))


#: The entry point's target.
plugin: Final = CudaPlugin()
