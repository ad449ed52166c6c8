"""The capability table: per collective and per mode, native, emulated or unsupported, as data.

Every claim here is checked by xccl's conformance suite (``pytest``): native and emulated call shapes must run
and match gloo's results at 2 and 4 ranks, unsupported ones must raise ``xccl.UnsupportedCollective`` before
communicating, graph-mode claims must compile with ``fullgraph=True``. Claim only what the suite confirms.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

import torch

from xccl.plugin import CapabilityTable, Collective, Level, Mode, Support

__all__ = ["template_table"]

C = Collective
_FLOATS: Final = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_INTEGERS: Final = frozenset({torch.int8, torch.uint8, torch.int32, torch.int64})
#: What the backend's kernels accept.
DTYPES: Final = _FLOATS | _INTEGERS | {torch.bool}
_FLOAT_OPS: Final = frozenset({"sum", "product", "min", "max", "avg"})
_INTEGER_OPS: Final = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})

# Reductions: floats get AVG, integers get the bitwise ops (gloo's rules). An op outside these is unsupported,
# except AVG on integers, which xccl emulates as SUM then a divide because SUM is listed.
_REDUCING: Final = Support(
    Level.NATIVE,
    dtypes=DTYPES,
    reduce_ops=_INTEGER_OPS,
    dtype_reduce_ops={d: _FLOAT_OPS for d in _FLOATS},
    note="avg for floats only (integers: sum then divide); bitwise ops for integers and bool only",
)
_MOVING: Final = Support(Level.NATIVE, dtypes=DTYPES)

#: Eager mode. Pretend the vendor library has no reduce_scatter (as Sophgo's SCCL has none): xccl then runs
#: it as all_to_all + a local reduction, which moves the same bytes as a ring reduce_scatter.
EAGER: Final[Mapping[Collective, Support]] = {
    C.ALL_REDUCE: _REDUCING,
    C.REDUCE: _REDUCING,
    C.ALL_GATHER: _MOVING,
    C.ALL_GATHER_INTO_TENSOR: _MOVING,
    C.ALL_TO_ALL: _MOVING,
    C.ALL_TO_ALL_SINGLE: _MOVING,
    C.ALL_TO_ALL_SINGLE_UNEVEN: Support(Level.NATIVE, dtypes=DTYPES, note="split sizes honoured"),
    C.BROADCAST: _MOVING,
    C.GATHER: _MOVING,
    C.SCATTER: _MOVING,
    C.SEND: _MOVING,
    C.RECV: _MOVING,
    C.BARRIER: Support(Level.NATIVE),
    C.REDUCE_SCATTER_TENSOR: Support(
        Level.EMULATED,
        via="all_to_all",
        dtypes=DTYPES - {torch.bool},
        reduce_ops=_INTEGER_OPS,
        dtype_reduce_ops={d: _FLOAT_OPS for d in _FLOATS},
        note="no reduce_scatter in the library: all_to_all_single + local reduction",
    ),
    C.REDUCE_SCATTER: Support(Level.EMULATED, via="reduce_scatter_tensor", note="concatenated, then as above"),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: Support(Level.EMULATED, via="padding", note="padded to the largest split"),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: Support(Level.EMULATED, via="padding", note="padded to the largest split"),
    # The plugin's own kernel (see _runtime.py): all_to_all_single with the count matrix's row and column.
    C.ALL_TO_ALL_V: Support(Level.NATIVE, dtypes=DTYPES, note="the plugin's kernel over all_to_all_single"),
    C.MM_REDUCE_SCATTER: Support(Level.EMULATED, via="pipelined", note="xccl's chunked matmul + async collective"),
    C.ALL_GATHER_MM: Support(Level.EMULATED, via="pipelined", note="xccl's chunked async all_gather + matmuls"),
    C.MM_ALL_REDUCE: Support(Level.EMULATED, via="pipelined", note="xccl's chunked matmul + async all_reduce"),
}

#: Graph mode (inside torch.compile): these compile to torch's functional collectives, which run the same
#: process-group call as eager mode. Ops left out are unsupported in graph mode.
GRAPH: Final[Mapping[Collective, Support]] = {
    C.ALL_REDUCE: _REDUCING,
    C.ALL_GATHER_INTO_TENSOR: _MOVING,
    C.BROADCAST: _MOVING,
}

_UNSUPPORTED: Final = Support(Level.UNSUPPORTED, note="not offered by this backend")


@functools.cache
def template_table(name: str) -> CapabilityTable:
    """The table, with one entry per (collective, mode); built once."""
    entries = {}
    for op in Collective:
        entries[(op, Mode.EAGER)] = EAGER.get(op, _UNSUPPORTED)
        entries[(op, Mode.GRAPH)] = GRAPH.get(op, _UNSUPPORTED)
    return CapabilityTable(name, entries, notes=["A template: gloo on CPU, posing as a vendor library."])
