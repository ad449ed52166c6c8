"""What the simulated ProcessGroupSCCL raises for the c10d methods it does not override (runtime audit 2, row 26).

c10d's ``Backend`` base class raises ``"Backend " + getBackendName() + " does not support <method>"``, and
ProcessGroupSCCL's ``getBackendName()`` returns ``"SCCL"`` (sophgo/torch-tpu@fe9b478
``torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.hpp:23,65-66``), upper case, although torch.distributed knows the
backend as ``sccl``.
"""

from __future__ import annotations

import pytest

#: c10d method (xccl's key) -> the base class's message on ProcessGroupSCCL (C++ method names, as libtorch's
#: Backend.hpp spells them).
UNSUPPORTED = {
    "_reduce_scatter_base": "Backend SCCL does not support _reduce_scatter_base",
    "alltoall": "Backend SCCL does not support alltoall",
    "allreduce_coalesced": "Backend SCCL does not support allreduce_coalesced",
    "allgather_coalesced": "Backend SCCL does not support allgather_coalesced",
    "allgather_into_tensor_coalesced": "Backend SCCL does not support allgather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced": "Backend SCCL does not support reduce_scatter_tensor_coalesced",
    "recv_anysource": "Backend SCCL does not support recvAnysource",
}


@pytest.mark.parametrize(("method", "message"), list(UNSUPPORTED.items()), ids=list(UNSUPPORTED))
def test_methods_sccl_does_not_override_raise_the_base_class_message(method: str, message: str) -> None:
    from xccl_sophgo._simulation import sccl_profile

    assert sccl_profile().refusal(method) == message


def test_the_methods_sccl_overrides_are_not_refused() -> None:
    from xccl_sophgo._simulation import sccl_profile

    profile = sccl_profile()
    for method in ("allreduce", "broadcast", "reduce", "allgather", "_allgather_base", "gather", "scatter",
                   "alltoall_base", "barrier", "send", "recv"):
        assert profile.refusal(method) is None, method
    assert profile.refusal("reduce_scatter") == "ProcessGroupSCCL does not support reduce_scatter"
