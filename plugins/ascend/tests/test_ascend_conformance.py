"""xccl's conformance suite on the Ascend plugin, in the CPU simulation of HCCL.

On a machine with Ascend NPUs, run it on the hardware: ``pytest --xccl-plugin ascend``.
"""

from xccl.testing.conformance import suite

TestAscendConformance = suite("ascend", simulate=True)
