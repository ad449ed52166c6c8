"""SCCL's communication cost model for SG2260, as data: every figure with its source, or unknown.

Sophgo publishes no latency or bandwidth of SCCL's collectives, nor of the C2C links between SG2260 chips, in any
source found (torch-tpu's tutorial, its SCCL chapter, the quick start). Its SCCL chapter (seed 002) describes SCCL
as communication between the cards of one machine ("单机多卡"), so across nodes there is not even a link to model.
Every figure here is None (unknown) with that explanation; ``xccl preflight --calibrate FILE`` fills them from an
``xccl bench --json`` run on the board (:func:`xccl.tools._cost_fit.calibrate`).
"""

from __future__ import annotations

from typing import Final

from xccl.plugin import Collective, CostModel, LinkCost

__all__ = ["MODELS", "SOURCES"]

C = Collective

#: The ops SCCL runs natively (ProcessGroupSCCL's overrides; reduce_scatter is not: it is emulated).
OPS: Final = (C.ALL_REDUCE, C.ALL_GATHER, C.ALL_GATHER_INTO_TENSOR, C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE, C.BROADCAST,
              C.REDUCE, C.GATHER, C.SCATTER, C.SEND, C.RECV)

#: Where figures were looked for, and why none was taken (intra-node, inter-node).
SOURCES: Final = (
    "unknown: sophgo/torch-tpu@fe9b478 docs/quick_start (tutorial, SCCL chapter: seed 002) publish no SCCL latency "
    "or bandwidth and no SG2260 C2C link rate; none found in the searched corpus",
    "unknown: SCCL is documented for the cards of one machine only (seed 002: '单机多卡'); no multi-node figure",
)

MODELS: Final = (
    CostModel(
        generation="SG2260",
        intra={op: LinkCost(None, None, SOURCES[0]) for op in OPS},
        inter={op: LinkCost(None, None, SOURCES[1]) for op in OPS},
        notes="every figure unknown: calibrate from `xccl bench --json` on an SG2260 board",
    ),
)
