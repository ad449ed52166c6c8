"""``xccl.dump_trace()``: write this rank's flight record now; ``xccl.trace_summary()``: its recent waits.

Both read the flight recorder (``xccl.collectives._flight``, ``_flight_dump``).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..collectives import _flight_dump
from ..collectives._flight import FLIGHT, Entry

__all__ = ["dump_trace", "trace_summary"]


def dump_trace(reason: str = "dump_trace") -> str | None:
    """Write this rank's flight record, in torch's flight-recorder layout, to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``.

    The file is what ``torch._C._distributed_c10d._dump_fr_trace()`` returns for NCCL or gloo groups, for the
    collectives that went through xccl: ``python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX`` and
    ``xccl trace DIR`` read a directory of them. Only this rank writes (a typed fault makes every rank write).

    Args:
        reason: recorded in the dump (its ``xccl`` key).

    Returns:
        The file written, or None when the recorder is off (``XCCL_TRACE=0`` or ``TORCH_FR_BUFFER_SIZE=0``).

    Example::

        >>> import xccl
        >>> xccl.dump_trace() is None  # before xccl.init: nothing recorded
        True
    """
    return _flight_dump.dump(reason)


def trace_summary(last: int = 100) -> dict[str, dict[str, Any]]:
    """This rank's view of its groups' recent calls, from the flight recorder: cheap enough to log every K steps.

    For each group: the last sequence number entered and completed, and, over its last ``last`` completed calls,
    the median and largest time from entering a call to its completion (ms). In a collective every rank waits for
    the last to arrive, so the rank that makes the others wait is the one whose wait is the *shortest*: compare the
    ranks' logged ``wait_ms`` (no communication is needed to compute them).

    Returns:
        Group name -> ``{"ranks", "entered", "completed", "calls", "wait_ms", "max_wait_ms"}``; empty when the
        recorder is off.
    """
    flight = FLIGHT.ring
    if flight is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    per_group: dict[str, list[Entry]] = {}
    for e in flight.entries():
        if not e.is_p2p:
            per_group.setdefault(str(e.group.name), []).append(e)
    for name, entries in per_group.items():
        done = [e for e in entries if e.completed][-last:]
        waits = [(e.completed - e.created) / 1e6 for e in done]
        out[name] = {
            "ranks": list(entries[-1].group.ranks),
            "entered": entries[-1].seq,
            "completed": done[-1].seq if done else 0,
            "calls": len(done),
            "wait_ms": statistics.median(waits) if waits else None,
            "max_wait_ms": max(waits) if waits else None,
        }
    return out
