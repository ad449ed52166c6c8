"""Fused matmul + collective ops: the public API, portable pipelines, and the graph pass."""
