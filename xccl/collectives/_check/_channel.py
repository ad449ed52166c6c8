"""The detector's side channel: the rendezvous store (the c10d ``TCPStore`` every rank already reaches).

Each thread that talks to the store has its own :class:`Channel`, a private clone of the client (a second
connection with a short timeout of its own, so that the process groups' store keeps theirs, and so that the
detector's thread and a waiting main thread never share a socket). Nothing here touches the collective stream.

Keys, under ``xccl/chk/<epoch>/`` (the epoch counts the worlds this rank has checked on this store, so that a
world made again on the same store never reads the last one's keys)::

    pid/<rank>            host|pid, so that a peer on the same host can tell a dead rank from a slow one
    st/<group>/<rank>     the rank's last step on the group and its rolling hashes (the detector thread)
    pre/<group>/<rank>    the call it is about to issue, for the first call of its kind (the main thread)
    stall/<rank>          the calls it has been waiting in for longer than the stall threshold ({} when none)
    ev, ev/<n>            a counter of events and each event: a request to dump steps, or a verdict
    dump/<n>/<rank>       the rank's steps for event n
    verdict/<group>       the first verdict on the group (compare_set: later ones do not replace it)

Every value is JSON with a size cap; every wait is bounded by the clone's timeout. Keys are overwritten in place,
so the store holds a fixed number of keys per rank and group, plus one per event (events are rare: a mismatch).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from collections.abc import Sequence
from typing import Any, Final, final

import torch.distributed as dist

__all__ = ["Channel", "alive"]

_ROOT: Final = "xccl/chk/"
#: Largest value accepted from a peer.
_MAX_VALUE: Final = 1 << 22


@final
class Channel:
    """One thread's connection to the store, with the detector's keys.

    Args:
        rank: this process's global rank.
        timeout: seconds a read of a missing key waits before it fails.
        epoch: the detector's epoch on this store (None: claim the next one, as the first channel does).
    """

    __slots__ = ("epoch", "known", "prefix", "rank", "store")

    def __init__(self, rank: int, timeout: float, epoch: int | None = None) -> None:
        default = dist.distributed_c10d._get_default_store()
        try:
            self.store: Any = default.clone()  # type: ignore[attr-defined]  # PrefixStore/TCPStore have it
        except (AttributeError, RuntimeError):  # a store that cannot clone (FileStore): share it
            self.store = default
        self.store.set_timeout(_dt.timedelta(seconds=timeout))
        self.rank: Final = rank
        if epoch is None:
            epoch = int(self.store.add(f"{_ROOT}epoch/{rank}", 1))
        self.epoch: Final = epoch
        self.prefix: Final = f"{_ROOT}{epoch}/"
        #: Keys seen to exist: they are overwritten, never deleted, so they can be read without a check.
        self.known: Final[set[str]] = set()

    def key(self, *parts: object) -> str:
        """``<prefix>part/part/...`` (a '/' inside a group name is replaced)."""
        return self.prefix + "/".join(str(p).replace("/", "_") for p in parts)

    # ------------------------------------------------------------------------------------------------- values

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` as JSON (one way: TCPStore does not answer a set)."""
        self.store.set(key, json.dumps(value, separators=(",", ":")))
        self.known.add(key)

    def fetch(self, keys: Sequence[str]) -> list[Any]:
        """Each key's JSON value, or None where the key does not exist (yet) or holds something unreadable.

        Keys not known to exist are checked first (one round trip each), so that nothing waits for a key a peer
        has not written; the others are read in one round trip.
        """
        unknown = [k for k in keys if k not in self.known]
        if len(unknown) > 1 and self.store.check(unknown):  # all there: one round trip for all of them
            self.known.update(unknown)
        present = [k in self.known or self._exists(k) for k in keys]
        wanted = [k for k, p in zip(keys, present, strict=True) if p]
        raw = iter(self.store.multi_get(wanted) if wanted else [])
        return [_parse(next(raw)) if p else None for p in present]

    def _exists(self, key: str) -> bool:
        if self.store.check([key]):
            self.known.add(key)
            return True
        return False

    def add(self, key: str, amount: int) -> int:
        """Atomically add to a counter; its new value."""
        return int(self.store.add(key, amount))

    def first(self, key: str, value: Any) -> Any:
        """Set ``key`` to ``value`` unless it is set already; the value it holds afterwards (the first one)."""
        text = json.dumps(value, separators=(",", ":"))
        return _parse(self.store.compare_set(key, "", text))

    # ----------------------------------------------------------------------------------------------- processes

    def announce(self) -> None:
        """Publish where this rank runs (host and pid) and that it has no stall."""
        self.put(self.key("pid", self.rank), f"{socket.gethostname()}|{os.getpid()}")
        self.put(self.key("stall", self.rank), {})

    def dead(self, ranks: Sequence[int]) -> list[int]:
        """Those of ``ranks`` that ran on this host and whose process is gone (others cannot be told apart)."""
        host = socket.gethostname()
        gone = []
        for rank, where in zip(ranks, self.fetch([self.key("pid", r) for r in ranks]), strict=True):
            if not isinstance(where, str):
                continue
            name, _, pid = where.partition("|")
            if name == host and pid.isdigit() and not alive(int(pid)):
                gone.append(rank)
        return gone


def _parse(raw: bytes) -> Any:
    if len(raw) > _MAX_VALUE:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel directly
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
