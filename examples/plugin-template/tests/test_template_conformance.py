"""The template plugin runs xccl's conformance suite on itself: a plain `pytest` here runs it."""

from xccl.testing.conformance import suite

TestTemplateConformance = suite("template")
