"""xccl's conformance suite on the Sophgo plugin, in the CPU simulation of SCCL.

On a machine with Sophgo TPUs, run it on the hardware: ``pytest --xccl-plugin sophgo``.
"""

from xccl.testing.conformance import suite

TestSophgoConformance = suite("sophgo", simulate=True)
