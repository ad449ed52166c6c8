"""Which chip each rank drives: the chip map, from the rank table, ``CHIP_MAP`` or the board's C2C ring.

SCCL needs two views of one mapping:

* ``torch_tpu.tpu.set_device(local_rank)`` selects ``CHIP_MAP[local_rank]``: this node's chip map, indexed by
  local rank, published as the comma-separated ``CHIP_MAP`` variable;
* ``ProcessGroupSCCLOptions.chip_map`` gives, for each rank *of the group*, its physical chip.

Sources, in Sophgo's own priority order (``set_chip_map``): the rank table named by ``RANK_TABLE_FILE`` (parsed
by xccl: Sophgo's reader is broken in its current source), then ``CHIP_MAP``. Then, as ``set_chip_map`` does, the
node's map is checked against the board's C2C ring and a missing or invalid one replaced by the ring
(:mod:`xccl_sophgo._c2c`; on the hardware torch_tpu decides, in simulation the documented SG2260 board): with 1 or
2 ranks and no map, chips 0 and 1. xccl logs the replacement as a warning where Sophgo logs it as information.
The job's shape (rank, world size, local rank, ranks per node) is what xccl hands the runtime
(:class:`xccl.plugin.Job`): from ``xccl.init``'s arguments or the launcher's variables, or, when a framework creates
the world itself, the world's own rank and size. :func:`resolve_placement` is the one place that reads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import final

from xccl.plugin import InitError, Job, RankTableError

from ._c2c import board, vendor_chip_map
from ._ranktable import SophgoRankTable, load_sophgo

__all__ = ["ChipMapRule", "Placement", "parse_chip_map", "resolve_placement"]

#: ``(the node's chip map or None, ranks on the node, this rank on the node) -> the map Sophgo's set_chip_map
#: settles on``: the runtime's call of its SDK's :meth:`~xccl_sophgo._sdk.TpuSdk.chip_map`.
ChipMapRule = Callable[[Sequence[int] | None, int, int], tuple[int, ...]]


@final
@dataclass(frozen=True, slots=True)
class Placement:
    """This process's chip and every rank's chip, as far as this process can know them."""

    #: Where the mapping came from: ``"rank table <path>"``, ``"CHIP_MAP"`` or ``"C2C ring"`` (none given).
    source: str
    job: Job
    #: This node's chip map, indexed by local rank: what ``CHIP_MAP`` holds and ``set_device`` reads.
    node_chips: tuple[int, ...]
    #: The chip of every global rank when a rank table lists them all; otherwise every node is assumed to use
    #: ``node_chips`` (torchrun starts the same number of ranks on each node).
    rank_chips: tuple[int, ...] | None = None
    #: The node of every global rank when a rank table lists them.
    rank_nodes: tuple[int, ...] | None = None
    #: The map ``source`` gave when it was no C2C ring and the ring replaced it, else None.
    replaced: tuple[int, ...] | None = None

    @property
    def local_world_size(self) -> int:
        """Ranks on this node (the whole job when no launcher said: one node)."""
        return self.job.ranks_per_node

    @property
    def world_size(self) -> int:
        """Ranks in the world."""
        return len(self.rank_chips) if self.rank_chips is not None else self.job.world_size

    @property
    def chip(self) -> int:
        """The chip this process drives."""
        return self.node_chips[self.job.local_rank]

    def chip_of(self, rank: int) -> int:
        """The chip global ``rank`` drives."""
        if self.rank_chips is not None:
            return self.rank_chips[rank]
        return self.node_chips[rank % self.local_world_size]

    def node_of(self, rank: int) -> int:
        """The node global ``rank`` runs on."""
        if self.rank_nodes is not None:
            return self.rank_nodes[rank]
        return rank // self.local_world_size

    def chip_map(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """The chip of each member of a group, in group-rank order (the group's communicator name says them).

        Args:
            ranks: the members' global ranks; torch orders a group's ranks ascending, so they are sorted here.
        """
        return tuple(self.chip_of(r) for r in sorted(ranks))

    def group_chip_map(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """``ProcessGroupSCCLOptions.chip_map`` for a group: the chip map of the node its members run on, whole, in
        local-rank order, as Sophgo's own code gives every group (sophgo/vllm-tpu@b010f67
        ``vllm_tpu/hack/distributed.py``: ``set_chip_map`` per group; torch-tpu's adaptor,
        ``torch_adaptor/distributed.py:102-116``: the world's map). For the world of one node that is every rank's
        chip, as Sophgo's tutorial gives it. A sub-group's own chips need not be a ring: TP groups of 4 on the
        eight-chip ring drive chips 0, 2, 6, 7, and 7 and 0 are not linked. How libsccl finds the members on the
        node's map is closed source (the first thing to check on the hardware). A group spanning nodes, which
        Sophgo does not document, gets its members' chips.
        """
        members = sorted(ranks)
        nodes = {self.node_of(r) for r in members}
        if len(nodes) > 1:
            return self.chip_map(members)
        return tuple(self.chip_of(r) for r in self._ranks_on(nodes.pop()))

    def _ranks_on(self, node: int) -> range | list[int]:
        """The global ranks on ``node``, in local-rank order."""
        if self.rank_nodes is not None:
            return [r for r, n in enumerate(self.rank_nodes) if n == node]
        per_node = self.local_world_size
        return range(node * per_node, min((node + 1) * per_node, self.job.world_size))


def resolve_placement(
    job: Job, device_count: int, env: Mapping[str, str] | None = None, *, rule: ChipMapRule | None = None
) -> Placement:
    """Decide this node's chip map from the rank table or ``CHIP_MAP``, checked against the C2C ring.

    Args:
        job: this process's place in the job, as xccl hands it to the runtime.
        device_count: TPUs on this node; every chip id must be below it.
        env: the environment, for Sophgo's own variables ``RANK_TABLE_FILE`` and ``CHIP_MAP`` (default
            ``os.environ``).
        rule: what Sophgo's ``set_chip_map`` makes of a map (the runtime passes its SDK's); default: the
            simulated node of ``device_count`` chips of the SG2260 board.

    Raises:
        RankTableError: ``RANK_TABLE_FILE`` is unreadable, malformed, or does not describe this job.
        InitError: ``CHIP_MAP`` is malformed, the node has too few TPUs for its ranks, or no C2C ring of that
            many chips exists.
    """
    env = os.environ if env is None else env
    rule = rule or (lambda given, size, _: vendor_chip_map(given, size, board(device_count)))
    path = env.get("RANK_TABLE_FILE", "").strip()
    local_world = job.ranks_per_node
    if path:
        placement = _from_rank_table(path, job, device_count)
    elif raw := env.get("CHIP_MAP", "").strip():
        placement = Placement("CHIP_MAP", job, parse_chip_map(raw, device_count, local_world))
    elif local_world > device_count:
        raise InitError(
            f"{local_world} ranks on this node but only {device_count} TPUs: start at most {device_count} "
            "ranks per node (torchrun --nproc-per-node), or give a rank table / CHIP_MAP"
        )
    else:
        return Placement("C2C ring", job, _settled(rule, None, job, device_count))
    chips = _settled(rule, placement.node_chips, job, device_count)
    return placement if chips == placement.node_chips else _replaced(placement, chips)


def _settled(rule: ChipMapRule, given: tuple[int, ...] | None, job: Job, device_count: int) -> tuple[int, ...]:
    """The map ``rule`` settles on, checked to give every local rank an existing chip."""
    size = job.ranks_per_node
    chips = tuple(rule(given, size, job.local_rank))
    if len(chips) < size or not all(0 <= c < device_count for c in chips[:size]):
        raise InitError(f"the C2C ring {list(chips)} does not give {size} local ranks a chip each among this node's "
                        f"{device_count} TPUs")
    return chips


def _replaced(placement: Placement, chips: tuple[int, ...]) -> Placement:
    """``placement`` with this node's map replaced by ``chips`` (the ring), the given map kept as ``replaced``."""
    rank_chips = placement.rank_chips
    if rank_chips is not None and placement.rank_nodes is not None:
        node = placement.rank_nodes[placement.job.rank]
        mine = [r for r in range(len(rank_chips)) if placement.rank_nodes[r] == node]  # ascending = local order
        updated = list(rank_chips)
        for local, rank in enumerate(mine):
            updated[rank] = chips[local]
        rank_chips = tuple(updated)
    return replace(placement, node_chips=chips, rank_chips=rank_chips, replaced=placement.node_chips)


def parse_chip_map(raw: str, device_count: int, local_world_size: int) -> tuple[int, ...]:
    """Parse ``CHIP_MAP`` as torch_tpu reads it: comma-separated chip ids, one per local rank.

    Raises:
        InitError: not comma-separated integers, repeated or nonexistent chips, or fewer chips than local ranks.
    """
    text = raw.strip()
    where = f"CHIP_MAP={raw!r}"
    if text[:1] in "[(":
        # Sophgo's set_chip_map(use_rank_table=True) assigns a Python list to CHIP_MAP (manifest gotcha 7).
        raise InitError(
            f"{where} looks like a Python list; torch_tpu reads CHIP_MAP as comma-separated chip ids, e.g. "
            "CHIP_MAP=7,6,2,3"
        )
    chips: list[int] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part.isdigit():
            raise InitError(f"{where}: entry {i} ({part!r}) is not a chip id; expected e.g. CHIP_MAP=1,0,2,3")
        chip = int(part)
        if chip >= device_count:
            raise InitError(f"{where}: chip {chip} does not exist; this node has {device_count} TPUs "
                            f"(0..{device_count - 1})")
        if chip in chips:
            raise InitError(f"{where}: chip {chip} appears twice; each local rank needs its own chip")
        chips.append(chip)
    if len(chips) < local_world_size:
        raise InitError(
            f"{where} maps {len(chips)} local ranks, but this node runs {local_world_size} (LOCAL_WORLD_SIZE): "
            "give one chip per local rank"
        )
    return tuple(chips)


def _from_rank_table(path: str, job: Job, device_count: int) -> Placement:
    table = load_sophgo(path, max_devices=device_count)
    if table.world_size() != job.world_size:
        raise RankTableError(
            path, "node_list",
            f"lists {table.world_size()} ranks, but this job has WORLD_SIZE={job.world_size}; generate a table "
            "for this job, e.g. `xccl rank-table sophgo --device-id '[[0,1,2,3]]'`",
        )
    node = table.node_of(job.rank)
    local = table.local_rank_of(job.rank)
    if local != job.local_rank:
        raise RankTableError(
            path, _device_field(table, job.rank),
            f"rank {job.rank} is local rank {local} of node {node} in the table, but this process has "
            f"LOCAL_RANK={job.local_rank}; start each node's ranks in the table's order or fix the table",
        )
    node_chips = table.chip_map(node)
    if job.local_world_size is not None and job.local_world_size != len(node_chips):
        raise RankTableError(
            path, f"node_list[{node}].device_list",
            f"has {len(node_chips)} devices, but LOCAL_WORLD_SIZE={job.local_world_size} ranks run on this node; "
            "start one rank per device listed for the node",
        )
    chips, nodes = [0] * job.world_size, [0] * job.world_size
    for index, entry in enumerate(table.nodes):
        for device in entry.devices:
            chips[device.rank], nodes[device.rank] = device.device_id, index
    return Placement(f"rank table {path}", job, node_chips, tuple(chips), tuple(nodes))


def _device_field(table: SophgoRankTable, rank: int) -> str:
    for i, node in enumerate(table.nodes):
        for j, device in enumerate(node.devices):
            if device.rank == rank:
                suffix = ".local_rank" if device.local_rank is not None else ""
                return f"node_list[{i}].device_list[{j}]{suffix}"
    return "node_list"
