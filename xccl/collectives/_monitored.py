"""``monitored_barrier``: a barrier that names the ranks that did not arrive, on every backend.

torch's own (``ProcessGroupGloo::monitoredBarrier``, torch 2.13) exists on gloo only (``torch.distributed`` refuses
it on any other backend by name, xccl's ``xccl_gloo`` included: "monitored_barrier is only implemented for GLOO
backend."; ``xccl.runtime._torch_api`` answers ``torch.distributed.monitored_barrier`` for xccl's groups with this).
xccl runs torch's algorithm on every backend, over the rendezvous store rather than the backend itself:

* every rank posts its arrival; group rank 0 waits for each other rank's within ``timeout`` (for every rank, with
  ``wait_all_ranks``; else until the first one that is late, as torch's fails fast);
* rank 0 then posts who arrived in time, and raises naming the others; every other rank waits for that answer
  (bounded by the collective timeout) and raises naming the late ranks too.

Two differences from gloo's, on purpose. The ranks that arrived raise at once, naming the late ones, instead of
waiting out the group's timeout with "received errors while waiting for send/recv from rank 0". And the group
stays usable: gloo closes its connection to a peer when a receive's timed wait expires ("Application timeout
caused pair closure"), so a gloo group is dead after its monitored barrier fails; the store has no such state, and
a late rank that arrives afterwards reads the answer and raises too.

Each call is numbered per group (``GroupState.barriers``), so a late rank's arrival matches the call it is late
for, as long as it eventually makes it.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any

import torch.distributed as dist

from ..errors import CollectiveTimeout
from ..ops._emulations import implements
from ..ops._vocab import Collective
from ..plugin._fake_world import transport
from ._compose import Call

__all__ = ["via_store"]


@implements(Collective.MONITORED_BARRIER, "store")
def via_store(st: Any, call: Call, timeout: _dt.timedelta | None, wait_all: bool, a: bool) -> None:
    """The monitored barrier on ``st``'s group (``a`` is ignored: like torch's, it always blocks).

    Raises:
        CollectiveTimeout: a rank did not arrive within ``timeout``; its ``ranks`` are the late global ranks.
    """
    from ._state import PROCESS  # the collective timeout, read when the barrier runs

    started = time.monotonic()
    collective = PROCESS.world.timeout if PROCESS.world is not None else _dt.timedelta(minutes=5)
    limit = timeout or collective
    st.barriers += 1
    if st.size == 1 or not transport().waits:
        return  # a fake world's other ranks arrive by assumption (and its store is this process's own)
    store = dist.distributed_c10d._get_default_store()
    prefix = f"xccl/monitored_barrier/{st.name}/{st.barriers}/"
    store.set(f"{prefix}arrived/{st.rank}", "1")
    if st.rank == 0:
        arrived = _arrivals(store, prefix, st.size, limit, wait_all)
        store.set(f"{prefix}answer", json.dumps(arrived))
        late = [st.ranks[r] for r in range(1, st.size) if not arrived[r]]
        # Failing fast names the first late rank, as torch's does; every rank is told who was late.
        named, who = (late if wait_all else late[:1]), "[Rank 0]:"
    else:
        store.wait([f"{prefix}answer"], collective)
        arrived = json.loads(store.get(f"{prefix}answer"))
        named = [st.ranks[r] for r in range(1, st.size) if not arrived[r]]
        who = f"rank 0 (global rank {st.ranks[0]}) reported:"
    if named:
        ms = int(limit.total_seconds() * 1000)
        raise CollectiveTimeout(
            f"{who} Rank{'s' if len(named) > 1 else ''} {', '.join(map(str, named))} failed to pass monitoredBarrier "
            f"in {ms} ms (global ranks; group ranks {[st.ranks.index(r) for r in named]})",
            rank=st.ranks[st.rank], op="monitored_barrier", group=st.name, elapsed=time.monotonic() - started,
            ranks=tuple(named),
        )


def _arrivals(store: Any, prefix: str, n: int, limit: _dt.timedelta, wait_all: bool) -> list[int]:
    """Rank 0's view: 1 for each group rank that arrived in time (rank 0 itself included)."""
    arrived = [1] + [0] * (n - 1)
    deadline = time.monotonic() + limit.total_seconds()
    for r in range(1, n):
        key = f"{prefix}arrived/{r}"
        if not wait_all and not all(arrived[1:r]):
            arrived[r] = int(store.check([key]))  # past the first late rank: who is here already
            continue
        # wait_all_ranks: the whole timeout for each rank, as torch's (or there would be none left for the later
        # ones after a late rank); else the time left.
        left = limit.total_seconds() if wait_all else deadline - time.monotonic()
        try:
            store.wait([key], _dt.timedelta(seconds=max(left, 0.001)))
            arrived[r] = 1
        except RuntimeError:  # the store's wait timed out (DistStoreError): this rank is late
            arrived[r] = int(store.check([key]))
    return arrived
