"""torch.distributed's own functions that xccl answers for its groups, kept for every other group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["OWN"]

#: Name -> torch's own function, as found when xccl put its own in its place (``_torch_api.install``).
OWN: Final[dict[str, Callable[..., Any]]] = {}
