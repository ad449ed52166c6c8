"""Adapters that put xccl under other projects' own abstractions, one module per project.

Nothing here is imported by ``import xccl``: each module imports its project, which only its users install.

* :mod:`xccl.integrations.torchft`: :class:`~xccl.integrations.torchft.ProcessGroupXccl`, torchft's reconfigurable
  process group over xccl's group, for the replica groups of a fault-tolerant job on HCCL, SCCL, gloo or NCCL.
"""
