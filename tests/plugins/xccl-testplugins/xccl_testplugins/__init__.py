"""Test-only xccl plugins, installed by the test setup (never shipped)."""
