"""What each rank publishes about itself at ``xccl.init``: its :class:`Facts`, read back by the world check
(``xccl.runtime._rendezvous``), by a look at a fault (``._liveness``) and by ``xccl doctor --world``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, final

__all__ = ["VENDOR_FIELDS", "WORLD", "Facts", "describe_ranks", "parse_lines"]

#: Largest Facts record accepted from the store.
_MAX_FACTS: Final = 4096

#: The Facts every rank must agree on, with the names the user knows them by.
WORLD: Final = (
    ("world_size", "WORLD_SIZE"),
    ("plugin", "plugin (XCCL_VENDOR / xccl.init(vendor=...))"),
    ("backend", "backend"),
    ("simulate", "simulation (XCCL_SIMULATE)"),
    ("check", "mismatch detector (XCCL_CHECK / check=)"),
    ("fallback", "fallback policy (fallback=)"),
    ("xccl", "xccl version"),
    ("torch", "torch version"),
    ("heterogeneous", "mixed-vendor switch (XCCL_HETEROGENEOUS / heterogeneous=)"),
)
#: The fields a mixed-vendor world lets differ between ranks (each rank selects its own plugin: docs/mixed.md).
VENDOR_FIELDS: Final = frozenset({"plugin", "backend", "simulate"})

@final
@dataclass(frozen=True, slots=True)
class Facts:
    """What a rank was told and where it runs, published at init. Parsed field by field: never evaluated."""

    rank: int
    world_size: int
    local_rank: int
    #: ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the node), -1 where the launcher did not set them.
    local_world_size: int
    node: int
    plugin: str
    backend: str
    simulate: bool
    check: bool
    fallback: str
    xccl: str
    #: torch's release (``2.13.0``, without the local ``+cu126`` label).
    torch: str
    host: str
    #: The address this rank reaches the store from (its side of the route to ``MASTER_ADDR``).
    addr: str
    #: Its liveness port (0: none).
    port: int
    pid: int
    #: The rank was started with the mixed-vendor switch: its plugin, backend and simulation are its own.
    heterogeneous: bool = False

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def view(self) -> str:
        """The world this rank was told of: what every rank must agree on, as a string to compare."""
        names = [n for n, _ in WORLD if not (self.heterogeneous and n in VENDOR_FIELDS)]
        return json.dumps([getattr(self, name) for name in names], separators=(",", ":"))

    @classmethod
    def decode(cls, raw: bytes | str) -> Facts | None:
        """The Facts in ``raw``, or None if it is not a well-formed record of this xccl."""
        if len(raw) > _MAX_FACTS:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        kw: dict[str, Any] = {}
        for f in fields(cls):
            value, want = data.get(f.name), {"int": int, "str": str, "bool": bool}[str(f.type)]
            if type(value) is not want:
                return None
            kw[f.name] = value
        return cls(**kw)

    def where(self) -> str:
        return f"{self.host} ({self.addr})"


def parse_lines(raw: bytes) -> list[Facts]:
    """Every well-formed Facts record of a newline-separated log, in order."""
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        facts = Facts.decode(line) if line.strip() else None
        if facts is not None:
            out.append(facts)
    return out


def describe_ranks(ranks: Iterable[int], facts: Mapping[int, Facts]) -> str:
    """``ranks [2, 3] on xccl-host1 (10.0.0.11)``, one phrase per host, joined with ``and``."""
    by_host: dict[str, list[int]] = {}
    for r in sorted(set(ranks)):
        f = facts.get(r)
        by_host.setdefault(f.where() if f is not None else "", []).append(r)
    parts = []
    for where, rs in by_host.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"
        parts.append(f"{who} on {where}" if where else who)
    return " and ".join(parts)
