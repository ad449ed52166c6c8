"""HCCL's communication cost model per Atlas generation, as data: every figure with its source, or unknown.

No public source found gives HCCL's latency or bus bandwidth per op for a named Atlas product. Ascend's HCCL Test
documentation defines what the tool measures (the algorithm bandwidth, data size over time) and shows one example
run, but that example names no product; the link rates of HCCS and RoCE on Atlas A2/A3 appear only in third-party
posts (https://www.meemx.com/p/hccl-contest-log-overall: "56 GB/s per HCCS link", from "民间资料", hearsay by its
own account, and a link rate is not a collective's bus bandwidth anyway), which a model must not rest on. So
every figure here is None (unknown) with what was searched: a team with one node fills them in with
``xccl preflight --calibrate FILE`` from its own HCCL Test or ``xccl bench --json`` run
(:func:`xccl.tools._cost_fit.calibrate`), which is the point of publishing the gap rather than a guess.
"""

from __future__ import annotations

from typing import Final

from xccl.plugin import Collective, CostModel, LinkCost

__all__ = ["MODELS", "SOURCES"]

C = Collective

#: The ops HCCL runs natively (ProcessGroupHCCL's overrides; gather is not among them: it is emulated).
OPS: Final = (C.ALL_REDUCE, C.ALL_GATHER, C.ALL_GATHER_INTO_TENSOR, C.REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR,
              C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE, C.BROADCAST, C.REDUCE, C.SCATTER, C.SEND, C.RECV)

HCCL_TEST: Final = ("https://www.hiascend.com/document/detail/en/CANNCommunityEdition/latest/devaids/hccltool/"
                    "HCCLpertest_16_0006.html")
HCCL_TEST_INTRO: Final = ("https://www.hiascend.com/document/detail/en/canncommercial/800/devaids/hccltool/"
                          "HCCLpertest_16_0001.html")
#: Where figures were looked for, and why none was taken.
SOURCES: Final = (
    f"unknown: Ascend's HCCL Test docs ({HCCL_TEST}) define algbw = data_size / time but publish no figure for a "
    "named Atlas product (their example run names none); no vendor page in the searched corpus gives HCCS or RoCE "
    "collective latency or bandwidth per op",
)


def _unknown(generation: str, inter: str) -> CostModel:
    intra = {op: LinkCost(None, None, SOURCES[0]) for op in OPS}
    return CostModel(
        generation=generation,
        intra=intra,
        inter={op: LinkCost(None, None, f"{SOURCES[0]}; {inter}") for op in OPS},
        notes="every figure unknown: calibrate from an HCCL Test log or `xccl bench --json` on one node",
    )


#: Atlas A2 first (the simulation's default chip), then A3.
MODELS: Final = (
    _unknown("Atlas A2", f"across nodes the link is RoCE ({HCCL_TEST_INTRO}: 'RDMA bandwidth between servers')"),
    _unknown("Atlas A3", f"across nodes the link is RoCE ({HCCL_TEST_INTRO}: 'RDMA bandwidth between servers')"),
)
