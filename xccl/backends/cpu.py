"""The ``cpu`` plugin: torch.distributed's gloo backend.

Every entry of the table was established by running it (``scripts/probe_backend.py --backend gloo``, torch 2.13,
2 ranks, results checked against a local reference), and ``tests/test_capabilities_truth.py`` re-checks each
claim on every CI run, on every torch leg: the table is the installed torch's, since gloo differs between releases
(``xccl.ops._torch``: torch 2.7 and 2.8's gloo sums whatever reduce op a reduce_scatter is given, and lacks the list
all_to_all; 2.7's lacks AVG and the list reduce_scatter). Where it lacks or miscomputes an op, the entry composes it.

Where a composition of gloo's own ops measured faster than its native op, the entry prefers it (``Prefer``), with
the figure from ``benchmarks/emulation.py`` (variants interleaved in one run, 2 and 4 ranks) that shows it.
"""

from __future__ import annotations

import functools
from typing import Final

import torch

from ..ops._torch import GLOO_ALL_TO_ALL, GLOO_AVG, GLOO_REDUCE_SCATTER, GLOO_REDUCE_SCATTER_OPS, TORCH, Change
from ..plugin import (
    PORTABLE,
    CapabilityTable,
    Collective,
    Level,
    Plugin,
    Prefer,
    ProbeResult,
    Support,
    graph_entries,
    table_from,
)
from ..plugin._capabilities import REAL_DTYPES

__all__ = ["CpuPlugin", "plugin"]

C = Collective
_FLOAT_OPS: Final = frozenset({"sum", "product", "min", "max"} | ({"avg"} if TORCH.has(GLOO_AVG) else set()))
_INT_OPS: Final = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})
_FLOAT_DTYPES: Final = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


#: gloo's native reduce-scatter (of a tensor) against all_to_all_single + a local reduction of the same bytes, from 1 MiB of
#: input (``python benchmarks/emulation.py --sweep``, 2 runs, busbw ratio min-max, 2 shared vCPUs).
RS_VIA_ALL_TO_ALL: Final = Prefer(
    "all_to_all", min_bytes=1 << 20,
    why="benchmarks/emulation.py --sweep: 1.5-3.9x gloo's native reduce-scatter from 1 MiB to 64 MiB at 2 ranks, "
    "1.3-2.7x at 4",
)
#: ... and below 1 MiB at 4 ranks (at 2 ranks the two are within noise there: 0.56-4.1x from 1 KiB to 256 KiB).
RS_VIA_ALL_TO_ALL_SMALL: Final = Prefer(
    "all_to_all", max_bytes=1 << 20, world_sizes=(4,),
    why="benchmarks/emulation.py --sweep: 1.5-3.7x gloo's native reduce-scatter from 1 KiB to 256 KiB at 4 ranks "
    "(at 2 ranks within noise: 0.56-4.1x)",
)
#: gloo's list all_to_all against one all_to_all_single with split sizes (benchmarks/emulation.py).
A2A_VIA_SINGLE: Final = Prefer(
    "all_to_all_single",
    why="benchmarks/emulation.py: 2.8-3.7x gloo's list all_to_all at 64 MiB, 2 and 4 ranks (scratch reused; 1.0-1.7x "
    "with fresh buffers); and gloo's requires equal tensor sizes, failing on one rank only where they differ",
)


def composed_before(change: Change, via: str, entry: Support) -> Support:
    """``entry`` on a torch whose gloo has ``change``; on an older one, the composition ``via``, saying why."""
    if TORCH.has(change):
        return entry
    return Support(Level.EMULATED, via=via, dtypes=frozenset(REAL_DTYPES),
                   note=f"torch {TORCH.version}'s gloo lacks what torch {change.needs} has ({change.what}): {via}")


def gloo_reducing(*prefer: Prefer, via: str = "") -> Support:
    """gloo's reductions: AVG only for floats, bitwise ops only for integers and bool, never PREMUL_SUM. ``via``: a
    reduce-scatter's composition for every op but SUM, on a torch whose gloo sums whatever op it is given."""
    if via and not TORCH.has(GLOO_REDUCE_SCATTER_OPS):
        change = GLOO_REDUCE_SCATTER_OPS
        return Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES), reduce_ops=frozenset({"sum"}), prefer=prefer,
                       reduce_op_via=dict.fromkeys(sorted(_INT_OPS | _FLOAT_OPS - {"sum", "avg"}), via),
                       note=f"torch {TORCH.version}'s gloo lacks what torch {change.needs} has ({change.what}): "
                       "sum natively, avg as sum then a divide, the other ops composed")
    return Support(
        Level.NATIVE,
        dtypes=frozenset(REAL_DTYPES),
        reduce_ops=_INT_OPS,
        dtype_reduce_ops={d: _FLOAT_OPS for d in _FLOAT_DTYPES},
        note="avg: floats only natively (integers: sum then a truncating divide); band/bor/bxor: integers and "
        "bool only; premul_sum: unsupported ('Cannot use ReduceOp.PREMUL_SUM with Gloo')",
        prefer=prefer,
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
        return ProbeResult.ok(torch=TORCH.version)

    @functools.cache  # noqa: B019 - one plugin object per process; the table is immutable data
    def capabilities(self) -> CapabilityTable:
        """gloo's table: every standard collective native, the HCCL extras and fused ops emulated."""
        native = Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES))
        eager = {op: native for op in C} | {
            C.ALL_REDUCE: gloo_reducing(),
            C.ALL_REDUCE_COALESCED: gloo_reducing(),
            C.REDUCE: gloo_reducing(),
            C.REDUCE_SCATTER: composed_before(GLOO_REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR.value,
                                              gloo_reducing(via=C.REDUCE_SCATTER_TENSOR.value)),
            C.REDUCE_SCATTER_TENSOR: gloo_reducing(RS_VIA_ALL_TO_ALL, RS_VIA_ALL_TO_ALL_SMALL, via="all_to_all"),
            C.BARRIER: Support(Level.NATIVE),
            C.ALL_TO_ALL_SINGLE_UNEVEN: Support(Level.NATIVE, dtypes=frozenset(REAL_DTYPES), note="split sizes honoured"),
            # gloo's list all_to_all needs every tensor of a call to have one size, and a rank that violates it
            # raises alone while its peers wait for the timeout; no rank can see its peers' sizes, so the
            # composition is preferred at every size (it is faster too), never only above some size.
            C.ALL_TO_ALL: composed_before(GLOO_ALL_TO_ALL, "all_to_all_single", Support(
                Level.NATIVE, dtypes=frozenset(REAL_DTYPES), prefer=(A2A_VIA_SINGLE,))),
            **PORTABLE,
            # gloo's all_to_all_single honours split sizes: the uneven collectives move their splits, unpadded.
            C.ALL_GATHER_INTO_TENSOR_UNEVEN: Support(
                Level.EMULATED, via="all_to_all_single", note="all_to_all_single with split sizes, no padding",
            ),
            C.REDUCE_SCATTER_TENSOR_UNEVEN: Support(
                Level.EMULATED, via="all_to_all_single",
                note="all_to_all_single with split sizes + local reduction, no padding",
            ),
        }
        # Graph mode: every op compiles to a _c10d_functional op or an xccl graph op that ends in the same
        # process-group call as eager mode (tests/test_graph_claims.py checks each entry).
        return table_from("cpu", eager, graph=graph_entries(eager))


#: The entry point's target.
plugin: Final = CpuPlugin()
