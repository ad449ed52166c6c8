"""xccl's conformance suite on the Ascend plugin, in the CPU simulation of HCCL.

Graph claims compile with the ``xccl`` backend, which on Ascend is TorchAir: in simulation every graph goes through
the simulated TorchAir conversion check (``xccl_ascend._torchair``), so a claim holds only if TorchAir can convert
its graph. On a machine with Ascend NPUs, run it on the hardware: ``pytest --xccl-plugin ascend
--xccl-compile-backend xccl``.
"""

import pytest

from xccl.testing.conformance import suite

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

# The table claims float8 moves, which CANN lists for Atlas 350 (Ascend 950) only: on the default simulated chip
# (A2) the kit fails those claims, as it should. The kit runs on the one chip every claim holds for; a table that
# depends on the product line would let it run on A2 (issue 22). Likewise on a CANN with graph send/recv (8.6.0 on):
# the CANN paired with torch 2.7/2.8's torch_npu is 8.3.RC1, below which the table refuses them.
TestAscendConformance = suite("ascend", simulate=True, compile_backend="xccl",
                              env={"XCCL_SIM_ASCEND_SOC": "Ascend950PR_9599", "XCCL_SIM_CANN_VERSION": "9.0.0"})
