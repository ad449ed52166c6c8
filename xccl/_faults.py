"""Backend faults as typed errors.

gloo reports a dead peer as ``RuntimeError: ... Connection reset by peer`` (or "Connection closed by peer",
"Broken pipe") and a silent one as ``RuntimeError: ... Timed out waiting ...``. They become
:class:`~xccl.PeerFailure` and :class:`~xccl.CollectiveTimeout`, carrying rank, op, group and elapsed time, with
the backend's exception chained (``raise ... from exc``) so nothing is hidden.
"""

from __future__ import annotations

import time
from typing import Any, Final

from ._errors import CollectiveTimeout, PeerFailure, XcclError

__all__ = ["translate"]

_PEER_GONE: Final = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
    "read error",
    "write error",
    "eof",
)
_TIMEOUT: Final = ("timed out", "timeout")


def translate(exc: BaseException, ctx: Any, op: str, started: float | None = None) -> BaseException:
    """The typed error for a backend exception raised during ``op`` on ``ctx``'s group, or ``exc`` itself when it
    is not a fault (the caller then re-raises it unchanged)."""
    if isinstance(exc, XcclError):
        return exc
    text = str(exc)
    low = text.lower()
    elapsed = time.monotonic() - started if started is not None else 0.0
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    where = {"rank": ctx.ranks[ctx.rank], "op": op, "group": ctx.name, "elapsed": elapsed}
    if any(s in low for s in _TIMEOUT):
        return CollectiveTimeout(
            f"no answer from a peer ({first}). A peer is hung, slow, or called a different collective; "
            "turn on xccl.init(check=True) to catch mismatched calls",
            **where,
        )
    if any(s in low for s in _PEER_GONE):
        return PeerFailure(
            f"a peer closed its connection ({first}). It probably died: look at its log; the group is unusable, "
            "so restart the job (or re-create the process group)",
            **where,
        )
    return exc
