"""The runtime: ``xccl.init`` and the lifecycle of the world and its groups (the state they fill lives with
dispatch, in ``xccl.collectives``)."""

from ._communicators import Communicator, communicators
from ._init import vendor_group
from ._vendor import connect

__all__ = ["Communicator", "communicators", "connect", "vendor_group"]
