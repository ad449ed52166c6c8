"""The graph path's part of the process state: order tokens, pending point-to-point work, compile passes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from ..collectives._state import Part

__all__ = ["GRAPH", "GraphPart"]


@dataclass
class GraphPart(Part):
    """What the graph path keeps between calls; ``xccl.shutdown`` forgets it."""

    #: The order token per group name (``_forms``: successive xccl graph ops of a group chain through it).
    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Point-to-point work started by graph ops and not yet waited for, per group name (``_ops``).
    pending: dict[str, list[Any]] = field(default_factory=dict)
    #: Post-grad passes of the ``xccl`` compile backend: name -> (pass, uuid) (``_backend``).
    passes: dict[str, tuple[Callable[..., None], str]] = field(default_factory=dict)


GRAPH: Final = Part.register(GraphPart())
