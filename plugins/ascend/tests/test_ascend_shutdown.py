"""``xccl.shutdown`` resets the Ascend plugin's process state, so ``xccl.init`` after it starts clean.

Atlas A2 allows one MC2 communication domain per model; the plugin records the first one a fused kernel used
(``MC2_DOMAIN``). It used to outlive ``xccl.shutdown``, so a second world (a new model) in the same process found
its fused kernels refused for a domain of the first. One rank, no rendezvous: the state is the process's.
"""

from __future__ import annotations

import pytest
from xccl_ascend._constraints import FusedCall
from xccl_ascend._runtime import MC2_DOMAIN

import xccl

A2 = FusedCall("mm_reduce_scatter", "Ascend910B1", 2)


def test_a_world_after_shutdown_has_no_mc2_domain_claimed() -> None:
    xccl.init(vendor="ascend", simulate=True, rank=0, world_size=1)
    try:
        MC2_DOMAIN.claim(A2, "1", "hcom_of_the_first_model")  # what a fused kernel on group "1" records
        with pytest.raises(xccl.ConstraintViolation, match="one communication domain"):
            MC2_DOMAIN.check(A2, "npu_mm_reduce_scatter_base", "0")
    finally:
        xccl.shutdown()
    xccl.init(vendor="ascend", simulate=True, rank=0, world_size=1)
    try:
        MC2_DOMAIN.check(A2, "npu_mm_reduce_scatter_base", "0")  # a new model: nothing claimed yet
    finally:
        xccl.shutdown()
