"""This process's place in the job, as xccl hands it to a plugin's runtime (:meth:`Runtime.place`).

xccl decides the job's shape once, from what it was told (``xccl.init``'s arguments, the launcher's variables) or,
when a framework creates the world itself after :func:`xccl.process_group_backend`, from the world's own rank and
size when its first group is created. A plugin reads the job from here, never from the environment, so that every
launcher xccl understands places its ranks the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ..errors import InitError

__all__ = ["Job"]


@final
@dataclass(frozen=True, slots=True)
class Job:
    """Where this process runs: its global and local rank, and how many ranks there are in all and on its node.

    Raises:
        InitError: on construction, when the values contradict each other (a local rank outside the node, a node
            larger than the job).
    """

    #: Global rank.
    rank: int
    #: Ranks in the job.
    world_size: int
    #: Rank on this node: which of the node's devices this process drives.
    local_rank: int
    #: Ranks on this node, or None when no launcher said (a plugin then assumes a single node, see
    #: :attr:`ranks_per_node`).
    local_world_size: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise InitError(f"rank {self.rank} is outside [0, {self.world_size}) for world size {self.world_size}")
        local = self.ranks_per_node
        if not 0 <= self.local_rank < local <= self.world_size:
            raise InitError(
                f"local rank {self.local_rank} with {local} ranks per node (LOCAL_WORLD_SIZE) and WORLD_SIZE="
                f"{self.world_size} is inconsistent: expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE; "
                "launch with torchrun, or pass consistent rank=, world_size= and local_rank= to xccl.init"
            )

    @property
    def ranks_per_node(self) -> int:
        """:attr:`local_world_size`, or the whole job when unknown (one node)."""
        return self.world_size if self.local_world_size is None else self.local_world_size
