"""``xccl.parallel_groups``: named tensor-, pipeline- and data-parallel groups laid out as Megatron does.

A world of ``W = tp * pp * dp`` ranks is a grid; the default order, ``"tp-dp-pp"`` (fastest varying first,
Megatron-LM's), keeps tensor-parallel peers, the chattiest group, on consecutive ranks, so within a node
(``rank = tp_index + tp * (dp_index + dp * pp_index)``; docs/concepts.md shows a layout). Every group is created with
:func:`xccl.new_group`, so the plugin's process-group options apply; :attr:`ParallelGroups.mesh` is the same grid as
a torch ``DeviceMesh`` built from these groups (DeviceMesh's own would lack the plugin's options).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ..errors import InvalidArgument
from ._init import comm_name, get_world, new_group

__all__ = ["DEFAULT_ORDER", "ParallelGroup", "ParallelGroups", "parallel_groups", "parallel_layout"]

#: Megatron-LM's default: tensor parallel fastest varying, then data parallel, then pipeline stages.
DEFAULT_ORDER: Final = "tp-dp-pp"
_KINDS: Final = ("tp", "pp", "dp")
_OP: Final = "parallel_groups"


@final
@dataclass(frozen=True, slots=True)
class ParallelGroup:
    """This rank's group of one kind (``"tp"``, ``"pp"`` or ``"dp"``)."""

    #: ``"tp"``, ``"pp"`` or ``"dp"``.
    kind: str
    #: The ``torch.distributed`` process group: pass it as ``group=`` to any xccl collective.
    group: Any
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: This rank's index within the group (its TP rank, pipeline stage or DP rank).
    rank: int
    #: The plugin's communicator name for the group (HCCL's own name on Ascend).
    comm_name: str

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)


@final
@dataclass(frozen=True)
class ParallelGroups:
    """The TP, PP and DP groups of this rank, and the layout of every group in the world.

    Example::

        pg = xccl.parallel_groups(tp=2, pp=2)          # dp inferred: world_size / (tp * pp)
        xccl.all_reduce(partial, group=pg.tp.group)    # tensor-parallel reduction
        xccl.all_reduce(grad, op=xccl.ReduceOp.AVG, group=pg.dp.group)
        if pg.pp.rank < pg.pp.size - 1:
            xccl.send(activations, dst=pg.pp.ranks[pg.pp.rank + 1])
    """

    tp: ParallelGroup
    pp: ParallelGroup
    dp: ParallelGroup
    #: The layout order, fastest varying first (e.g. ``"tp-dp-pp"``).
    order: str
    world_size: int
    #: Every group of each kind, as tuples of global ranks: ``layout["dp"]`` lists all DP groups.
    layout: Mapping[str, tuple[tuple[int, ...], ...]]
    device_type: str

    def __getitem__(self, kind: str) -> ParallelGroup:
        """The group of ``kind`` (``"tp"``, ``"pp"`` or ``"dp"``)."""
        if kind not in _KINDS:
            raise KeyError(f"no parallel group {kind!r}; the kinds are {', '.join(_KINDS)}")
        return getattr(self, kind)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[ParallelGroup]:
        return iter((self.tp, self.pp, self.dp))

    @functools.cached_property
    def mesh(self) -> Any:
        """A torch ``DeviceMesh`` over the same groups, dims named ``("pp", "dp", "tp")`` in ``order``'s
        reverse (slowest first), for DTensor / FSDP2. Built on first access; creates no process group."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        dims = list(reversed(self.order.split("-")))  # DeviceMesh is row-major: last dim fastest
        grid = torch.arange(self.world_size, dtype=torch.int).reshape([self[d].size for d in dims])
        return DeviceMesh.from_group([self[d].group for d in dims], self.device_type, grid, mesh_dim_names=tuple(dims))


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(_OP, f"{name}={value!r} must be a positive integer")
    if value < 1:
        raise InvalidArgument(_OP, f"{name}={value} must be at least 1 (1 means: no {name.upper()} parallelism)")
    return value


def _sizes(world_size: int, tp: int, pp: int, dp: int | None) -> dict[str, int]:
    tp, pp = _check_size("tp", tp), _check_size("pp", pp)
    if dp is None:
        if world_size % (tp * pp):
            raise InvalidArgument(
                _OP, f"tp={tp} x pp={pp} = {tp * pp} does not divide the world size {world_size}, so dp cannot be "
                f"inferred; choose tp and pp whose product divides {world_size}"
            )
        dp = world_size // (tp * pp)
    dp = _check_size("dp", dp)
    if tp * pp * dp != world_size:
        hint = (
            f"; with tp={tp} and pp={pp}, dp={world_size // (tp * pp)} fits (or leave dp out to infer it)"
            if world_size % (tp * pp) == 0
            else ""
        )
        raise InvalidArgument(
            _OP, f"tp={tp} x pp={pp} x dp={dp} = {tp * pp * dp} ranks, but the world has {world_size}: the product "
            f"must equal the world size{hint}"
        )
    return {"tp": tp, "pp": pp, "dp": dp}


def parallel_layout(
    world_size: int, *, tp: int = 1, pp: int = 1, dp: int | None = None, order: str = DEFAULT_ORDER
) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Every TP, PP and DP group of a world, as tuples of global ranks; no process group is created.

    Args:
        world_size: number of ranks.
        tp: tensor-parallel size.
        pp: pipeline-parallel size (number of stages).
        dp: data-parallel size; ``None`` infers ``world_size / (tp * pp)``.
        order: the grid's dimensions, fastest varying first; Megatron's default ``"tp-dp-pp"``.

    Returns:
        ``{"tp": groups, "pp": groups, "dp": groups}``; each group lists ranks in group-rank order, and the
        groups of one kind are ordered by their smallest rank.

    Raises:
        InvalidArgument: a size below 1 or not an integer, a product other than ``world_size``, a bad order.

    Example::

        >>> parallel_layout(8, tp=2, pp=2)["pp"]
        ((0, 4), (1, 5), (2, 6), (3, 7))
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgument(_OP, f"world_size={world_size!r} must be a positive integer")
    dims = order.split("-")
    if sorted(dims) != sorted(_KINDS):
        raise InvalidArgument(
            _OP, f"order={order!r} must name tp, dp and pp once each, fastest varying first (e.g. {DEFAULT_ORDER!r})"
        )
    sizes = _sizes(world_size, tp, pp, dp)
    strides = {d: math.prod(sizes[e] for e in dims[: dims.index(d)]) for d in dims}
    layout: dict[str, tuple[tuple[int, ...], ...]] = {}
    for kind in _KINDS:
        # A group of `kind` fixes every other coordinate and varies this one: its members are
        # base + i * stride for the bases whose `kind` coordinate is 0.
        bases = [r for r in range(world_size) if (r // strides[kind]) % sizes[kind] == 0]
        layout[kind] = tuple(tuple(b + i * strides[kind] for i in range(sizes[kind])) for b in bases)
    return layout


def parallel_groups(
    *, tp: int = 1, pp: int = 1, dp: int | None = None, order: str = DEFAULT_ORDER
) -> ParallelGroups:
    """Create the tensor-, pipeline- and data-parallel groups of the world, Megatron-style.

    Every rank must call it, with the same arguments, after :func:`xccl.init`: it creates every group of every
    kind (``torch.distributed`` requires all ranks to take part in creating each group) and returns this rank's.

    Args:
        tp: tensor-parallel size: ranks that split each layer's weights (consecutive ranks by default).
        pp: pipeline-parallel size: the number of stages a model is cut into.
        dp: data-parallel size: model replicas that split the batch; ``None`` infers ``world_size / (tp * pp)``.
        order: the grid's dimensions, fastest varying first (see :func:`parallel_layout`).

    Returns:
        :class:`ParallelGroups` with ``.tp``, ``.pp``, ``.dp`` (group, ranks, rank, comm name) and ``.layout``.

    Raises:
        InitError: xccl is not initialised.
        InvalidArgument: a size below 1, ``tp * pp * dp`` other than the world size, a bad order (raised on
            every rank alike, before any group is created).
    """
    world = get_world()
    layout = parallel_layout(world.world_size, tp=tp, pp=pp, dp=dp, order=order)
    mine: dict[str, ParallelGroup] = {}
    for kind in _KINDS:
        for ranks in layout[kind]:
            group = new_group(list(ranks))  # collective: every rank creates every group, in the same order
            if world.rank in ranks:
                mine[kind] = ParallelGroup(kind, group, ranks, ranks.index(world.rank), "")
    # Names after creation: HCCL makes its communicator on the first name query, so every member asks for it.
    named = {k: dataclasses.replace(g, comm_name=comm_name(g.group)) for k, g in mine.items()}
    return ParallelGroups(named["tp"], named["pp"], named["dp"], order, world.world_size, layout, world.device.type)
