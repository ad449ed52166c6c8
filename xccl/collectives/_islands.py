"""The map of a mixed-vendor world: which rank runs which vendor on which host, and the islands.

A world started with the mixed-vendor switch (``xccl.init(heterogeneous=True)`` or ``XCCL_HETEROGENEOUS=1``) lets
every rank select its own plugin. The world check at init (``xccl.runtime._rendezvous``) then collects every rank's
published Facts and builds one :class:`WorldMap`, the same on every rank: an *island* is the ranks of one plugin,
which reach each other over that vendor's own library. For now one plugin is one island, across hosts too, as the
vendor's own network (HCCS/RoCE, Sophgo's C2C and its RDMA) would carry it; islands meet only through the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import final

__all__ = ["Island", "WorldMap", "islands_of"]


@final
@dataclass(frozen=True, slots=True)
class Island:
    """The ranks of one plugin: they reach each other natively."""

    #: The plugin's name (``ascend``, ``sophgo``, ``cpu``...).
    plugin: str
    #: The vendor's torch.distributed backend (``hccl``, ``sccl``, ``gloo``).
    backend: str
    #: Global ranks, ascending.
    ranks: tuple[int, ...]


@final
@dataclass(frozen=True, slots=True)
class WorldMap:
    """Every rank's plugin and host, and the islands, in the order of their lowest rank.

    Example::

        world = xccl.init(heterogeneous=True)
        [i.plugin for i in world.map.islands]      # e.g. ['ascend', 'sophgo']
    """

    #: Rank -> plugin name.
    plugins: tuple[str, ...]
    #: Rank -> host name.
    hosts: tuple[str, ...]
    islands: tuple[Island, ...]

    @property
    def mixed(self) -> bool:
        """Whether the world has more than one island."""
        return len(self.islands) > 1

    def island_of(self, rank: int) -> Island:
        """The island of global ``rank``."""
        plugin = self.plugins[rank]
        return next(i for i in self.islands if i.plugin == plugin)

    def split(self, members: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """``members`` (global ranks, in group order) by island: each island's members in group order, the
        islands in the order of their first member in the group."""
        out: dict[str, list[int]] = {}
        for r in members:
            out.setdefault(self.plugins[r], []).append(r)
        return tuple(tuple(rs) for rs in out.values())


def islands_of(ranks: Iterable[tuple[int, str, str, str]]) -> WorldMap:
    """The :class:`WorldMap` of ``(rank, plugin, backend, host)`` records, one per rank of the world.

    Raises:
        ValueError: the records do not cover ranks ``0..n-1`` exactly once.
    """
    rows = sorted(ranks)
    if [r for r, *_ in rows] != list(range(len(rows))):
        raise ValueError(f"a world map needs ranks 0..{len(rows) - 1} once each, got {[r for r, *_ in rows]}")
    islands: dict[str, tuple[str, list[int]]] = {}
    for r, plugin, backend, _ in rows:
        islands.setdefault(plugin, (backend, []))[1].append(r)
    return WorldMap(
        plugins=tuple(p for _, p, _, _ in rows),
        hosts=tuple(h for *_, h in rows),
        islands=tuple(Island(p, b, tuple(rs)) for p, (b, rs) in islands.items()),
    )
