"""pytest plugin: session-wide pools of live rank processes.

Registered through the ``pytest11`` entry point, so any test suite in an environment with xccl installed can
ask for ``rank_pools`` and get ``rank_pools.get(world_size, **init_kwargs)``: a started :class:`RankPool`, shared
by every test that asks for the same configuration.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ._pool import RankPool

__all__ = ["RankPools"]


class RankPools:
    """Pools keyed by configuration; at most ``keep`` pools stay alive (2 cores do not run many ranks)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._pools: dict[tuple[Any, ...], RankPool] = {}

    def get(self, world_size: int, env: Mapping[str, str] | None = None, **init_kwargs: Any) -> RankPool:
        """A started pool of ``world_size`` ranks initialised with ``xccl.init(**init_kwargs)`` and ``env``."""
        key = (world_size, tuple(sorted((env or {}).items())), tuple(sorted(init_kwargs.items())))
        pool = self._pools.pop(key, None)
        if pool is None:
            while len(self._pools) >= self.keep:
                self._pools.pop(next(iter(self._pools))).close()
            pool = RankPool(world_size, init_kwargs, env)
        self._pools[key] = pool  # most recently used last
        if not pool.alive:
            pool.start()
        return pool

    def close(self) -> None:
        """Stop every pool."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[RankPools]:
    """Session-wide :class:`RankPools`."""
    pools = RankPools()
    try:
        yield pools
    finally:
        pools.close()
