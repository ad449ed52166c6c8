"""The capability table: per collective and mode, native, emulated or unsupported, with dtypes and reduce ops.

Write it from Example Devices's documentation of templatecl, and claim only what runs: xccl's conformance kit calls
every claimed dtype x reduce op x collective and compares the result with the operation's mathematical result
computed on CPU; every shape marked unsupported must be refused before anything is sent. ``xccl caps template``
prints this table.
"""

from __future__ import annotations

import functools
from typing import Final

import torch
from xccl.plugin import PORTABLE, CapabilityTable, Collective, Level, Support, graph_entries, table_from

__all__ = ["DTYPES", "template_table"]

C = Collective
_FLOATS: Final = frozenset({torch.float32, torch.float16, torch.bfloat16})
_INTEGERS: Final = frozenset({torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool})
#: VENDOR: the dtypes templatecl's collectives accept.
DTYPES: Final = _FLOATS | _INTEGERS
#: VENDOR: the reduce ops its kernels apply, per dtype. AVG is left out: xccl runs it as SUM then a divide.
_ARITHMETIC: Final = frozenset({"sum", "product", "min", "max"})
_BITWISE: Final = frozenset({"band", "bor", "bxor"})

_REDUCING: Final = Support(
    Level.NATIVE,
    dtypes=DTYPES,
    reduce_ops=_ARITHMETIC | _BITWISE,                     # integers and bool
    dtype_reduce_ops=dict.fromkeys(_FLOATS, _ARITHMETIC),  # floats: no bitwise ops
    note="avg: sum then a divide; bitwise ops over integers and bool only",
)
_MOVING: Final = Support(Level.NATIVE, dtypes=DTYPES)

#: VENDOR: eager mode, one entry per collective the library has; xccl composes the others where it can.
EAGER: Final = {
    C.ALL_REDUCE: _REDUCING,
    C.REDUCE: _REDUCING,
    C.REDUCE_SCATTER_TENSOR: _REDUCING,
    C.ALL_GATHER: _MOVING,
    C.ALL_GATHER_INTO_TENSOR: _MOVING,
    C.ALL_TO_ALL_SINGLE: _MOVING,
    C.ALL_TO_ALL_SINGLE_UNEVEN: Support(Level.NATIVE, dtypes=DTYPES, note="split sizes honoured"),
    C.BROADCAST: _MOVING,
    C.GATHER: _MOVING,
    C.SCATTER: _MOVING,
    C.SEND: _MOVING,
    C.RECV: _MOVING,
    C.BARRIER: Support(Level.NATIVE),
    # What the library lacks, composed by xccl from what it has.
    C.REDUCE_SCATTER: Support(Level.EMULATED, via="reduce_scatter_tensor", note="the list concatenated, then one "
                              "reduce_scatter_tensor"),
    C.ALL_TO_ALL: Support(Level.EMULATED, via="all_to_all_single", note="the list concatenated, then one "
                          "all_to_all_single"),
    C.ALL_REDUCE_COALESCED: Support(Level.EMULATED, via="all_reduce", note="one all_reduce per tensor"),
    C.ALL_GATHER_COALESCED: Support(Level.EMULATED, via="all_gather", note="one all_gather per tensor"),
    # The uneven collectives and the fused matmul + collective ops, portable (xccl's compositions) ...
    **PORTABLE,
    # ... except all_to_all_v, which the runtime runs natively (_runtime.py: a kernel over all_to_all_single).
    C.ALL_TO_ALL_V: Support(Level.NATIVE, dtypes=DTYPES, note="the plugin's kernel over all_to_all_single"),
}


#: VENDOR: graph mode (inside torch.compile), the ops the graph compiler takes. Inductor takes xccl's graph forms,
#: which end in the same process-group calls as eager mode, so ``graph_entries`` derives the entries from the eager
#: ones (``graph_entries(EAGER)`` claims every op; each claim costs a compilation in the kit). Ops left out are
#: unsupported in graph mode.
GRAPH: Final = graph_entries({op: EAGER[op] for op in (C.ALL_REDUCE, C.ALL_GATHER_INTO_TENSOR,
                                                       C.REDUCE_SCATTER_TENSOR, C.BROADCAST)})


@functools.cache
def template_table(name: str) -> CapabilityTable:
    """The table, built once."""
    return table_from(name, EAGER, graph=GRAPH,
                      notes=["Example Devices: templatecl through torch_template; simulated on CPU with XCCL_SIMULATE=template."])
