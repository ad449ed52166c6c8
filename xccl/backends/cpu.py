"""The ``cpu`` plugin: torch.distributed's gloo backend.

Every entry of the table was established by running it (``scripts/probe_backend.py --backend gloo``, torch 2.13,
2 ranks, results checked against a local reference), and ``tests/test_capabilities_truth.py`` re-checks each
claim on every CI run.
"""

from __future__ import annotations

import functools
from typing import Final

import torch

from ..plugin import (
    PORTABLE,
    REAL_DTYPES,
    CapabilityTable,
    Collective,
    Level,
    Plugin,
    ProbeResult,
    Support,
    graph_entries,
    table_from,
)

__all__ = ["CpuPlugin", "plugin"]

C = Collective
_FLOAT_OPS: Final = frozenset({"sum", "product", "min", "max", "avg"})
_INT_OPS: Final = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})
_FLOAT_DTYPES: Final = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def gloo_reducing() -> Support:
    """gloo's reductions: AVG only for floats, bitwise ops only for integers and bool, never PREMUL_SUM."""
    return Support(
        Level.NATIVE,
        dtypes=frozenset(REAL_DTYPES),
        reduce_ops=_INT_OPS,
        dtype_reduce_ops={d: _FLOAT_OPS for d in _FLOAT_DTYPES},
        note="avg: floats only natively (integers: sum then a truncating divide); band/bor/bxor: integers and "
        "bool only; premul_sum: unsupported ('Cannot use ReduceOp.PREMUL_SUM with Gloo')",
    )


class CpuPlugin(Plugin):
    """CPU ranks over gloo: always available, and the reference every other plugin is tested against."""

    name = "cpu"
    vendor = "PyTorch (gloo)"
    device_type = "cpu"
    backend = "gloo"
    accelerator = False

    def probe(self) -> ProbeResult:
        """gloo ships with every torch build that has torch.distributed."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            return ProbeResult.unavailable(
                "this torch build has no gloo backend", "install a torch wheel built with distributed support"
            )
        return ProbeResult.ok(torch=torch.__version__)

    @functools.cache  # noqa: B019 - one plugin object per process; the table is immutable data
    def capabilities(self) -> CapabilityTable:
        """gloo's table: every standard collective native, the HCCL extras and fused ops emulated."""
        native = Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES))
        eager = {op: native for op in C} | {
            C.ALL_REDUCE: gloo_reducing(),
            C.ALL_REDUCE_COALESCED: gloo_reducing(),
            C.REDUCE: gloo_reducing(),
            C.REDUCE_SCATTER: gloo_reducing(),
            C.REDUCE_SCATTER_TENSOR: gloo_reducing(),
            C.BARRIER: Support(Level.NATIVE),
            C.ALL_TO_ALL_SINGLE_UNEVEN: Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES), note="split sizes honoured"),
            # gloo's list all_to_all needs every tensor of a call to have one size, and a rank that violates it
            # raises alone while its peers wait for the timeout; no rank can see its peers' sizes, so always go
            # through all_to_all_single with explicit sizes (one concatenation and one copy more).
            C.ALL_TO_ALL: Support(
                Level.EMULATED, via="all_to_all_single",
                note="gloo's native list all_to_all requires equal tensor sizes and fails on one rank only",
            ),
            **PORTABLE,
        }
        # Graph mode: every op compiles to a _c10d_functional op or an xccl graph op that ends in the same
        # process-group call as eager mode (tests/test_graph_claims.py checks each entry).
        return table_from("cpu", eager, graph=graph_entries(eager))


#: The entry point's target.
plugin: Final = CpuPlugin()
