"""The world must be on the backend xccl asked for.

A vendor SDK may replace ``torch.distributed.init_process_group`` when it is imported, and the replacement may
choose the backend itself: Sophgo's torch adaptor passes ``backend="sccl"`` whatever it is given
(``torch_tpu/accelerator/adaptor/torch_adaptor/distributed.py:83-97``). The world then exists and works, but it is
the vendor's own group: none of xccl's dispatch, emulations or typed errors, and FSDP2's reduce_scatter fails on
SCCL. So after creating the world (and when adopting one a framework created on the name
``process_group_backend`` gave it) xccl checks the backend it got and explains, from the plugin's declared
:class:`~xccl.plugin.TorchPatch` entries, what replaced it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from typing import Any

import torch.distributed as dist

from ..errors import InitError
from ..plugin._contract import Plugin
from ..plugin._fake_world import transport

__all__ = ["all_arrived", "wrong_backend"]

_TARGET = "torch.distributed.init_process_group"


def wrong_backend(expected: str, got: str, plugin: Plugin) -> InitError:
    """The error for a world created on ``got`` where xccl asked for ``expected``.

    Args:
        expected: xccl's backend name (``xccl_<backend>``).
        got: what ``dist.get_backend()`` says.
        plugin: the selected plugin, whose declared patches of ``init_process_group`` explain the difference.
    """
    func = dist.init_process_group
    where = ""
    # Replacements patch the package attribute (torch's own function stays in distributed_c10d); torch's function
    # is itself a functools.wraps wrapper (c10d_logger), so __wrapped__ tells nothing.
    if func is not dist.distributed_c10d.init_process_group:
        code = getattr(func, "__code__", None)
        origin = f" by {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        where = f" ({_TARGET} is replaced{origin})"
    known = " ".join(f"{plugin.name}'s SDK does this{f' {p.condition}' if p.condition else ''}: {_TARGET} {p.effect} "
                     f"({p.source})." for p in plugin.vendor_runtime().patches if p.target == _TARGET)
    return InitError(
        f"torch.distributed created the world on {got!r}, not on xccl's backend {expected!r}{where}: that world has "
        f"none of xccl's dispatch, emulations or typed errors. {known} Turn the replacement off (or do not import "
        "what makes it) before xccl.init() or xccl.process_group_backend(): the world must be created on xccl's "
        "backend"
    )


def all_arrived(store: Any, rank: int, size: int, timeout: _dt.timedelta) -> None:
    """Wait (at most ``timeout``) until every rank has reached this point too, through the world's store.

    Every rank finds the same wrong backend; one that tears its world down at once would fail the peers still
    connecting theirs (gloo: "Connection closed by peer") with a message that hides the cause.
    """
    if not transport().waits:
        return  # the other ranks of a fake world exist only by assumption: none will set its key
    key = "xccl/wrong_backend"
    with contextlib.suppress(Exception):  # the error to raise is the caller's, whatever happens here
        store.set(f"{key}/{rank}", "1")
        store.wait([f"{key}/{r}" for r in range(size)], timeout)
