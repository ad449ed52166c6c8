"""xccl's conformance suite on the Ascend plugin, in the CPU simulation of HCCL.

Graph claims compile with the ``xccl`` backend, which on Ascend is TorchAir: in simulation every graph goes through
the simulated TorchAir conversion check (``xccl_ascend._torchair``), so a claim holds only if TorchAir can convert
its graph. On a machine with Ascend NPUs, run it on the hardware: ``pytest --xccl-plugin ascend
--xccl-compile-backend xccl``.
"""

from xccl.testing.conformance import suite

TestAscendConformance = suite("ascend", simulate=True, compile_backend="xccl")
