"""The torch.distributed functions that refuse xccl's groups by their backend's name, answered by xccl for its own.

In torch 2.13 ``monitored_barrier`` refuses every backend but gloo by name ("monitored_barrier is only implemented
for GLOO backend."), xccl's cpu world (``xccl_gloo``) included: on xccl's groups it is ``xccl.monitored_barrier``,
which raises :class:`~xccl.CollectiveTimeout` naming the late ranks. ``shrink_group`` asks the device backend to
shrink (:mod:`._shrink`). :func:`install` puts xccl's in their place in ``torch.distributed`` and
``distributed_c10d`` once a program uses xccl's backend; each calls torch's own (``_torch_own.OWN``) for other
groups. Code that imported one from torch before xccl was set up holds torch's: call them as ``dist.<name>``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..collectives._dispatch import dispatch
from ..collectives._process_group import XcclProcessGroup
from ..ops import _specs as S
from ._shrink import shrink_group
from ._torch_own import OWN

__all__ = ["install", "monitored_barrier"]


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier``, on xccl's groups too (``xccl.monitored_barrier`` there)."""
    target = group if group is not None else (c10d._get_default_group() if dist.is_initialized() else None)
    if not isinstance(target, XcclProcessGroup):
        return OWN["monitored_barrier"](group, timeout, wait_all_ranks)  # type: ignore[no-any-return]
    dispatch(S.MONITORED_BARRIER, group, False, timeout, wait_all_ranks)
    return None


def install() -> None:
    """Put xccl's functions where torch's are (once; torch's own are kept for the other groups). ``shrink_group``
    is put there on a torch without one too (before 2.10), where it raises :class:`~xccl.UnsupportedTorch`."""
    for name, ours in (("shrink_group", shrink_group), ("monitored_barrier", monitored_barrier)):
        current = c10d.__dict__.get(name)
        if current is not ours:
            if current is not None:
                OWN[name] = current
            setattr(c10d, name, ours)
        setattr(dist, name, ours)
