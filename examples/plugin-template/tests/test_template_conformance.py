"""xccl's conformance kit on the plugin, in the CPU simulation: a plain `pytest` here runs it at 2 and 4 ranks.

On the hardware: `pytest --xccl-plugin template` (every claim, against the real library).
"""

from xccl.testing.conformance import suite

TestTemplateConformance = suite("template", simulate=True)
