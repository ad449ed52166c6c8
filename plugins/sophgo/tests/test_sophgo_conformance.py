"""xccl's conformance suite on the Sophgo plugin, in the CPU simulation of SCCL.

On a machine with Sophgo TPUs, run it on the hardware: ``pytest --xccl-plugin sophgo``.
"""

import pytest

from xccl.testing.conformance import suite

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

TestSophgoConformance = suite("sophgo", simulate=True)
