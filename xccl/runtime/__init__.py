"""The runtime: ``xccl.init`` and the lifecycle of the world and its groups (the state they fill lives with
dispatch, in ``xccl.collectives``)."""

from ._init import vendor_group

__all__ = ["vendor_group"]
