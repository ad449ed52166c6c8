"""The rank table of Example Devices clusters (``RANK_TABLE_FILE``): which device of which host each rank runs on.

``xccl rank-table validate FILE`` and ``xccl doctor`` read it through :class:`TemplateRankTable`; every defect is
an ``xccl.RankTableError`` with the JSON path of the field. VENDOR: replace the format with the one the vendor's
launcher writes (the Ascend and Sophgo plugins' ``_ranktable.py`` are complete examples)::

    {"template_rank_table": "1.0",
     "nodes": [{"host": "10.0.0.1", "devices": [{"device_id": 0, "rank": 0}, {"device_id": 1, "rank": 1}]}]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from xccl.plugin import (
    RankTableError,
    RankTableFormat,
    as_object,
    check_device_ids,
    check_ranks,
    describe,
    non_negative,
    nonempty_list,
    optional_ipv4,
    require,
)

__all__ = ["TemplateRankTable", "Node"]

_KEY: Final = "template_rank_table"


@final
@dataclass(frozen=True, slots=True)
class Node:
    """One host: its address and, per device, the global rank on it."""

    host: str | None
    ranks: Mapping[int, int]


@final
@dataclass(frozen=True, slots=True)
class _Table:
    nodes: tuple[Node, ...]

    def world_size(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)


class TemplateRankTable(RankTableFormat):
    """The format, as ``Plugin.rank_table_formats`` returns it."""

    name = "template"
    description = "Example Devices rank table"

    def detect(self, data: Mapping[str, object]) -> bool:
        return _KEY in data

    def parse(self, data: object, path: str, *, max_devices: int | None = None) -> Any:
        doc = as_object(data, path, "$", f'a JSON object with "{_KEY}" and "nodes"')
        if require(doc, _KEY, path, "") != "1.0":
            raise RankTableError(path, _KEY, f"is {describe(doc[_KEY])}; expected \"1.0\"")
        nodes, ranks = [], []
        for i, raw in nonempty_list(doc, "nodes", path, "", "one object per host"):
            where = f"nodes[{i}]"
            node = as_object(raw, path, where, 'an object with "host" and "devices"')
            host = optional_ipv4(node, "host", path, where, _string)
            devices, ids = {}, []
            for j, dev in nonempty_list(node, "devices", path, where, "one object per device"):
                at = f"{where}.devices[{j}]"
                entry = as_object(dev, path, at, 'an object with "device_id" and "rank"')
                device_id = non_negative(_int(require(entry, "device_id", path, at), path, f"{at}.device_id"),
                                         path, f"{at}.device_id")
                rank = non_negative(_int(require(entry, "rank", path, at), path, f"{at}.rank"), path, f"{at}.rank")
                ids.append((device_id, f"{at}.device_id"))
                ranks.append((rank, f"{at}.rank"))
                devices[device_id] = rank
            check_device_ids(ids, path, max_devices)
            nodes.append(Node(host, devices))
        check_ranks(ranks, path, "rank")
        return _Table(tuple(nodes))

    def summary(self, table: Any) -> list[str]:
        lines = [f"{self.description}: {table.world_size()} ranks on {len(table.nodes)} node(s)"]
        for i, node in enumerate(table.nodes):
            pairs = ", ".join(f"device {d}: rank {r}" for d, r in sorted(node.ranks.items()))
            lines.append(f"  node {i} ({node.host or 'no host'}): {pairs}")
        return lines


def _int(value: object, path: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RankTableError(path, field, f"{describe(value)} is not an integer")
    return value


def _string(value: object, path: str, field: str) -> str:
    if not isinstance(value, str):
        raise RankTableError(path, field, f"{describe(value)} is not a string; expected an IPv4 address")
    return value
