"""Capability entries any plugin can reuse: the emulations xccl provides over the even collectives
(:data:`PORTABLE`), and the graph column derived from the eager column and how each op is represented.

In graph mode an op is

* **native** when it compiles to a standard functional collective (``torch.ops._c10d_functional.<op>`` +
  ``wait_tensor``) that runs the backend's own kernel, or to one of xccl's graph ops (``torch.ops.xccl.<op>``)
  whose eager kernel is native;
* **emulated** when it compiles to xccl's graph op and that op runs xccl's eager emulation at run time;
* **unsupported** when tracing it raises :class:`~xccl.UnsupportedCollective`.

The dtypes, reduce ops and world sizes are those of the eager entry: both forms end in the same process-group
call. :func:`graph_entries` builds the column for a plugin whose graph ops need no converter (the built-in cpu
and cuda plugins); a vendor plugin with converters or a graph compiler of its own states its column itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from ..ops._specs import SPECS
from ._capabilities import Collective, Level, Support

__all__ = ["GRAPH_FORMS", "PORTABLE", "graph_entries"]

C = Collective
_F: Final = "torch.ops._c10d_functional"

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

#: How each op appears in a graph when native: the standard functional op where torch has one, else xccl's (the
#: specs' ``graphs``).
GRAPH_FORMS: Final[Mapping[Collective, str]] = {
    key: form for spec in dict.fromkeys(SPECS.values()) for key, form in spec.graphs.items()
}

# The xccl op an emulated standard collective compiles to on a group created outside xccl (it runs the eager
# emulation at run time); on xccl's own process group the standard form carries the emulation (``Spec.graph_via``).
_XCCL_FORM: Final = {
    key: spec.graph_via for spec in dict.fromkeys(SPECS.values()) for key in spec.graphs if spec.graph_via is not None
}


def _entry(op: Collective, eager: Support) -> Support:
    if eager.level is Level.UNSUPPORTED or op not in GRAPH_FORMS:
        return Support(Level.UNSUPPORTED, note="no graph form" if op not in GRAPH_FORMS else eager.note)
    form = GRAPH_FORMS[op]
    if eager.level is Level.NATIVE:
        note = f"graph: {form}"
    else:
        xop = _XCCL_FORM.get(op, op).value
        if form.startswith(_F):
            note = (f"graph: {form} on xccl's process group (its c10d methods run the emulation, {eager.via}), "
                    f"torch.ops.xccl.{xop} on groups created outside xccl")
        else:
            note = f"graph: {form}, running the eager emulation ({eager.via})"
    return dataclasses.replace(eager, note=f"{note}; {eager.note}" if eager.note else note)


def graph_entries(eager: Mapping[Collective, Support]) -> dict[Collective, Support]:
    """The graph column for a plugin whose eager column is ``eager`` and that needs no graph converters.

    Ops with no graph form (the fused matmul + collective ops, which xccl's graph pass introduces instead) and
    ops unsupported in eager mode are unsupported.
    """
    return {op: _entry(op, sup) for op, sup in eager.items()}
