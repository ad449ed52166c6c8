"""Batched point-to-point: ``P2POp`` and ``batch_isend_irecv`` with torch.distributed's semantics.

Every operation of the batch is validated before any is issued, so a bad one fails on its own rank before that
rank sends or receives anything; then each is issued asynchronously through dispatch (the plugin's kernel or the
host-side emulation) and the handles are returned in order, as ``torch.distributed.batch_isend_irecv`` does on
backends without coalescing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import torch

from ..errors import InvalidArgument, InvalidArgumentType
from ..ops import _specs as S
from ._dispatch import invalid, run
from ._groups import state_of

__all__ = ["P2POp", "batch_isend_irecv"]

_KINDS = {"isend": S.ISEND, "irecv": S.IRECV}


def _kind(op: Any) -> S.Spec | None:
    """The spec of ``xccl.isend``/``xccl.irecv`` or ``torch.distributed.isend``/``irecv`` (by name: both are
    plain functions of those names)."""
    return _KINDS.get(getattr(op, "__name__", ""))


@final
class P2POp:
    """One point-to-point operation of a :func:`batch_isend_irecv` call (``torch.distributed.P2POp``'s fields).

    Args:
        op: ``xccl.isend`` or ``xccl.irecv`` (``torch.distributed``'s are accepted too).
        tensor: the tensor to send, or to receive into.
        peer: the peer's global rank (or ``group_peer``, its rank in ``group``).
        group: the process group (``None``: the world).
        tag: matches a send with a receive.
        group_peer: the peer's rank within ``group``.

    Raises:
        InvalidArgument: ``op`` is not an isend or irecv (a ``ValueError``, as torch's); ``tensor`` is not a tensor
            (:class:`~xccl.InvalidArgumentType`, a ``TypeError``).
    """

    __slots__ = ("group", "group_peer", "op", "peer", "tag", "tensor")

    def __init__(self, op: Any, tensor: torch.Tensor, peer: int | None = None, group: Any = None, tag: int = 0,
                 group_peer: int | None = None) -> None:
        # torch's messages (_check_op, _check_single_tensor), and its builtins: ValueError, TypeError.
        if _kind(op) is None:
            raise InvalidArgument("P2POp", "Invalid ``op``. Expected ``op`` to be of type "
                                  f"``torch.distributed.isend`` or ``torch.distributed.irecv``. (xccl's or torch's; "
                                  f"got {op!r})")
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentType("P2POp", "Invalid function argument. Expected parameter `tensor` of type "
                                      f"torch.Tensor but got {type(tensor)} instead.")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        peer = f"peer={self.peer}" if self.group_peer is None else f"group_peer={self.group_peer}"
        return f"P2POp({getattr(self.op, '__name__', self.op)}, {tuple(self.tensor.shape)}, {peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Sequence[Any]) -> list[Any]:
    """Issue every operation of ``p2p_op_list`` asynchronously; returns their work handles, in order.

    Raises:
        InvalidArgument: the list is empty, holds something else than P2POps, mixes groups, or an operation is
            invalid (checked for every operation before any is issued).
    """
    ops = list(p2p_op_list) if isinstance(p2p_op_list, (list, tuple)) else None
    if not ops:
        raise InvalidArgument("batch_isend_irecv", "p2p_op_list must be a non-empty list of P2POp")
    calls = []
    group = ops[0].group if hasattr(ops[0], "group") else None
    for i, p in enumerate(ops):
        spec = _kind(getattr(p, "op", None))
        if spec is None or not hasattr(p, "tensor"):
            raise InvalidArgument("batch_isend_irecv", "Invalid ``p2p_op_list``. Each op is expected to to be of type "
                                  f"``torch.distributed.P2POp``. (p2p_op_list[{i}] is {p!r})")
        if p.group is not group:
            raise InvalidArgument("batch_isend_irecv", "All ops need to use the same group.")
        st = state_of(p.group)
        peer, group_peer = p.peer, getattr(p, "group_peer", None)
        if peer is None and group_peer is None:
            raise InvalidArgument("batch_isend_irecv", f"p2p_op_list[{i}] has no peer")
        if peer is not None and group_peer is not None:
            # torch's own P2POp fills both (group_peer derived from peer); the global rank is the one its caller gave.
            group_peer = None
        calls.append((st, spec, spec.validate(st, invalid, p.tensor, peer, p.tag, group_peer)))
    return [run(st, spec, kargs, True) for st, spec, kargs in calls]
