"""Point-to-point, as in ``torch.distributed``: send, recv (from a given or any source), isend, irecv, and batches.

Peers are *global* ranks unless given as ``group_dst`` / ``group_src`` (ranks within ``group``). Errors as in
``xccl.api._collectives``; sending to or receiving from oneself is an :class:`~xccl.InvalidArgument`.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from ..collectives._dispatch import dispatch
from ..collectives._groups import state_of
from ..collectives._p2p import P2POp, batch_isend_irecv
from ..graph import _forms as G
from ..ops import _specs as S
from ._collectives import _run

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send"]

_compiling: Final = torch.compiler.is_compiling


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst``; returns once the backend has taken it (``torch.distributed.send``).

    Args:
        tensor: the data, contiguous, on the group's device.
        dst: the destination's global rank (or ``group_dst``).
        group: the process group (``None``: the world).
        tag: matches this send with a receive.
        group_dst: the destination's rank within ``group``.

    Raises:
        InvalidArgument: the destination is this rank, not a member, or given twice.
        UnsupportedCollective: the backend has no point-to-point and no emulation for it.

    Example::

        if rank == 0:
            xccl.send(torch.ones(2), dst=1)
    """
    _run(S.SEND, group, False, tensor, dst, tag, group_dst)


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from rank ``src``, or from any rank when ``src`` is not given.

    Args:
        tensor: filled with what arrives.
        src: the source's global rank (or ``group_src``); neither: whichever rank sends first.
        group: the process group (``None``: the world).
        tag: matches this receive with a send.
        group_src: the source's rank within ``group``.

    Returns:
        The sender's global rank (``torch.distributed.recv``'s result).

    Raises:
        InvalidArgument: the source is this rank or not a member.
        UnsupportedCollective: the backend cannot receive from any source (HCCL, NCCL) when ``src`` is omitted.

    Example::

        if rank == 1:
            sender = xccl.recv(buf)               # from whoever sends
    """
    if _compiling():
        return int(G.run(S.RECV, group, False, tensor, src, tag, group_src))
    st = state_of(group)
    if src is None and group_src is None:
        work = dispatch(S.RECV, group, True, tensor, None, tag, None)
        work.wait()
        return int(st.ranks[work.source_rank()])
    dispatch(S.RECV, group, False, tensor, src, tag, group_src)
    return src if src is not None else st.ranks[group_src]  # type: ignore[index]


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
    """Asynchronous :func:`send`; returns a work handle to ``wait()`` on (``torch.distributed.isend``).

    Example::

        work = xccl.isend(torch.ones(2), dst=1)
        work.wait()
    """
    return _run(S.ISEND, group, True, tensor, dst, tag, group_dst)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Any:
    """Asynchronous :func:`recv`; returns a work handle to ``wait()`` on (``torch.distributed.irecv``).

    Without ``src``, the handle's ``source_rank()`` tells the sender's rank within the group.

    Example::

        work = xccl.irecv(buf, src=0)
        work.wait()
    """
    return _run(S.IRECV, group, True, tensor, src, tag, group_src)
