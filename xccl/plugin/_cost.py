"""A vendor's communication cost model, as plugin data: latency and bus bandwidth per op and link.

The model is nccl-tests' (``PERFORMANCE.md`` of NVIDIA/nccl-tests): a collective over ``n`` ranks moving ``S``
bytes per rank takes ``latency + S * factor(op, n) / busbw``, where ``factor`` converts the algorithm bandwidth
into the bus bandwidth that a link of that speed sustains (all_reduce ``2(n-1)/n``; all_gather, reduce_scatter and
all_to_all ``(n-1)/n``; broadcast, reduce and point-to-point ``1``). A plugin publishes one :class:`LinkCost` per
op and link kind (inside a node, across nodes); a value nobody has published is ``None`` (unknown), never a guess.
Every value carries its source, which docs/fidelity.md lists like the vendor's other claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ..ops._specs import ALL
from ..ops._vocab import Collective

__all__ = ["BUS_FACTOR", "CostModel", "LinkCost", "bus_factor", "cost_rows"]


@dataclass(frozen=True, slots=True)
class LinkCost:
    """One op's cost over one kind of link.

    Attributes:
        latency_us: the time of a zero-byte call, in microseconds (None: unknown).
        busbw_gbps: the bus bandwidth it sustains at large sizes, in GB/s (10**9 bytes; None: unknown).
        source: where the figures come from (a document and section, a published log, or ``"fitted: FILE"``).
    """

    latency_us: float | None
    busbw_gbps: float | None
    source: str


@dataclass(frozen=True, slots=True)
class CostModel:
    """A vendor's cost model for one hardware generation.

    Attributes:
        generation: the hardware it describes (``"Atlas 800T A2"``, ``"SG2260"``, ``"this host"``).
        intra: per op, the cost inside a node.
        inter: per op, the cost across nodes.
        notes: what the model leaves out (congestion, topology beyond intra/inter, overlap with compute).
    """

    generation: str
    intra: Mapping[Collective, LinkCost] = field(default_factory=dict)
    inter: Mapping[Collective, LinkCost] = field(default_factory=dict)
    notes: str = ""


#: nccl-tests' bus-bandwidth factor per op (``n`` ranks), as it prints it: the specs' ``bus``.
BUS_FACTOR: Final[Mapping[Collective, str]] = {key: spec.bus for key, spec in ALL.items()}


def bus_factor(op: Collective, n: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth for ``op`` over ``n`` ranks."""
    spec = ALL.get(op)
    if n <= 1 or spec is None:
        return 0.0 if n <= 1 else 1.0
    return spec.bus_factor(n)


def cost_rows(model: CostModel) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """The model as fidelity rows: per link kind, ``(subject, text, sources)`` with the ops grouped by figure.

    A plugin's ``_fidelity.py`` turns each row into one of its claims, so that docs/fidelity.md lists every figure
    (or says it is unknown) with its source, as it lists the vendor's other claims.
    """
    rows = []
    for link, costs in (("intra-node", model.intra), ("inter-node", model.inter)):
        groups: dict[tuple[float | None, float | None], list[str]] = {}
        for op, cost in costs.items():
            groups.setdefault((cost.latency_us, cost.busbw_gbps), []).append(op.value)
        text = "; ".join(
            f"{', '.join(ops)}: latency {'unknown' if lat is None else f'{lat:g} us'}, bus bandwidth "
            f"{'unknown' if bw is None else f'{bw:g} GB/s'}" for (lat, bw), ops in groups.items())
        sources = tuple(dict.fromkeys(cost.source for cost in costs.values()))
        rows.append((f"cost model: {model.generation}, {link}", text, sources))
    return tuple(rows)
