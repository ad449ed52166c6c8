"""Fused matmul + collective ops: the public API (``_api``), how a call picks its kernel and the graph ops
(``_ops``), the portable pipelined versions (``_portable``) and their cost model (``_cost``), validation
(``_validate``), gradients (``_autograd``), and the graph pass that introduces them (``_pass``)."""
