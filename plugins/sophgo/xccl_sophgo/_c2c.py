"""The C2C ring SCCL runs on, and what Sophgo's ``set_chip_map`` makes of a node's chip map.

SCCL's collectives run a ring over the chip-to-chip (C2C) links of one board, and four- and eight-chip chip maps
must be given in ring order (torch-tpu fe9b478, ``docs/quick_start/source_zh/03_Tutorial.rst:81-94``): each chip
directly linked to the next, the last to the first.
``torch_tpu.tpu.set_chip_map`` (``torch_tpu/tpu/utils.py:193-229``) enforces it:

* no map given and 1 or 2 ranks on the node (``LOCAL_WORLD_SIZE``): ``[0, 1]``, unchecked;
* 1 rank: the given map as it is;
* otherwise the map is checked against the board (``_tpu_checkChipMap``), and a missing or invalid one is replaced
  by the driver's ring of that many chips (``_tpu_getC2CRing``), logging "Use the recommended chip_map".

The check and the ring are computed by the driver (``tpudnnCheckChipMap`` / ``tpudnnGetC2CRing`` in the closed
``libtpudnn``), so on the hardware xccl asks torch_tpu for the decision. The simulation decides it on
:data:`SG2260`, the 8-chip board of Sophgo's own documentation (``docs/quick_start/assets/3_c2c_topology.png``,
drawn by ``tpu_show_topology``): the ring 0-2-6-7-3-1-5-4 and the links 0-1 and 2-3. On it the documented maps are
rings ([0,2,6,7,3,1,5,4] for eight chips; [7,6,2,3], [1,0,2,3], [1,0,4,5] for four) and :meth:`C2CTopology.ring`
finds the documented eight-chip ring. What the closed check accepts beyond "consecutive chips are linked" and
which four-chip ring the driver recommends are not documented [inferred: ``ring(4)`` = [0,1,3,2], the tutorial's
[1,0,2,3] walked the other way]. The board has no cycle of odd length, so 3, 5 or 7 ranks on a node have no ring.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, final

from xccl.plugin import InitError

__all__ = ["SG2260", "C2CTopology", "board", "vendor_chip_map"]


@final
@dataclass(frozen=True, slots=True)
class C2CTopology:
    """A board: its chips ``0..chips-1`` and the direct C2C links between them."""

    chips: int
    #: Each link as the pair of chips it joins, smaller first.
    links: frozenset[tuple[int, int]]

    @classmethod
    def of(cls, chips: int, links: Iterable[tuple[int, int]]) -> C2CTopology:
        """A board from undirected links in any order."""
        return cls(chips, frozenset((min(a, b), max(a, b)) for a, b in links if a != b))

    def linked(self, a: int, b: int) -> bool:
        """Whether chips ``a`` and ``b`` are directly linked."""
        return (min(a, b), max(a, b)) in self.links

    def neighbours(self, chip: int) -> tuple[int, ...]:
        """The chips linked to ``chip``, ascending."""
        return tuple(sorted(b if a == chip else a for a, b in self.links if chip in (a, b)))

    def is_ring(self, chips: Sequence[int]) -> bool:
        """Whether ``chips`` (two or more, distinct, on this board) form a ring: each linked to the next, the last
        to the first (two chips: one link)."""
        if len(chips) < 2 or len(set(chips)) != len(chips) or not all(0 <= c < self.chips for c in chips):
            return False
        return all(self.linked(chips[i], chips[(i + 1) % len(chips)]) for i in range(len(chips)))

    def ring(self, size: int) -> tuple[int, ...] | None:
        """A ring of ``size`` chips: depth first from the lowest chip, neighbours ascending (as
        ``torch_tpu.utils.c2c_topology.find_hamiltonian_cycle`` searches); None when the board has none."""
        for start in range(self.chips):
            found = self._extend([start], size)
            if found is not None:
                return found
        return None

    def _extend(self, path: list[int], size: int) -> tuple[int, ...] | None:
        if len(path) == size:
            return tuple(path) if self.is_ring(path) else None
        for nxt in self.neighbours(path[-1]):
            if nxt not in path:
                found = self._extend([*path, nxt], size)
                if found is not None:
                    return found
        return None


#: Sophgo's documented SG2260 board: the ring 0-2-6-7-3-1-5-4 and the links 0-1 and 2-3.
SG2260: Final = C2CTopology.of(8, [(0, 2), (2, 6), (6, 7), (7, 3), (3, 1), (1, 5), (5, 4), (4, 0), (0, 1), (2, 3)])


def board(chips: int) -> C2CTopology:
    """The simulated node of ``chips`` chips: SG2260's links among them (none to chips beyond the eighth)."""
    return C2CTopology.of(chips, [(a, b) for a, b in SG2260.links if a < chips and b < chips])


def vendor_chip_map(given: Sequence[int] | None, size: int, topology: C2CTopology) -> tuple[int, ...]:
    """The chip map ``set_chip_map`` settles on for ``size`` ranks on a node of ``topology``.

    Args:
        given: the node's chip map (rank table or ``CHIP_MAP``), or None.
        size: ranks on the node (``LOCAL_WORLD_SIZE``).
        topology: the board.

    Raises:
        InitError: the map must be replaced and the board has no ring of ``size`` chips.
    """
    if given is None and size in (1, 2):
        return (0, 1)
    if given is not None and (size == 1 or topology.is_ring(given[:size])):
        return tuple(given)
    ring = topology.ring(size)
    if ring is None:
        raise InitError(
            f"no C2C ring of {size} chips on this node: SCCL runs a ring over directly linked chips, and the "
            f"{topology.chips}-chip board has none of that length (Sophgo documents 4 and 8 chips); start 2, 4 or "
            "8 ranks per node"
        )
    return ring
