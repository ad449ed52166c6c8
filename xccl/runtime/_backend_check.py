"""The world must be on the backend xccl asked for, and an adopted world's backend names its plugin.

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
import os
from typing import Any

import torch.distributed as dist

from ..collectives._backend import PREFIX
from ..errors import InitError
from ..plugin._contract import Plugin
from ..plugin._fake_world import transport
from ..plugin._registry import PluginInfo, Registry

__all__ = ["all_arrived", "is_builtin", "plugin_for", "wrong_backend"]

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


def plugin_for(backend: str, vendor: str, registry: Registry) -> Plugin:
    """The plugin whose torch.distributed backend is ``backend`` (``vendor``'s, when one is named).

    Raises:
        InitError: no plugin drives ``backend``, or, of a backend name two vendors share (Ascend's and Habana's
            ``hccl``), none or several can run here; it names them and the ``vendor=`` that settles it.
    """
    if backend.startswith(PREFIX):
        raise InitError(
            f"torch.distributed was initialised on xccl's backend {backend!r} without xccl.process_group_backend() "
            "in this process; call it before init_process_group"
        )
    if vendor == "auto":
        vendor = os.environ.get("XCCL_VENDOR", "").strip() or os.environ.get("XCCL_SIMULATE", "").strip() or "auto"
    if vendor != "auto":
        plugin = registry.get(vendor)
        if plugin.backend != backend:
            raise InitError(f"torch.distributed is initialised on {backend!r}, but plugin {vendor!r} drives "
                            f"{plugin.backend!r}; pass the plugin of that backend, or vendor='auto'")
        return plugin
    infos = [i for i in registry.infos().values() if i.plugin is not None and i.plugin.backend == backend]
    if not infos:
        raise InitError(f"torch.distributed is initialised on {backend!r}, which no installed xccl plugin drives; "
                        "install the vendor's xccl plugin, or initialise on a backend one drives")
    builtin = [i for i in infos if is_builtin(i)]
    if builtin or len(infos) == 1:
        # gloo and nccl: xccl's own plugin of the backend, whatever else drives it (test plugins over gloo).
        return (builtin or infos)[0].plugin  # type: ignore[return-value]
    usable = [i for i in infos if i.available]  # of the vendors sharing the name, the one whose SDK is here
    if len(usable) == 1:
        return usable[0].plugin  # type: ignore[return-value]
    names = ", ".join(i.name for i in infos)
    why = ("each of them finds its SDK here" if usable else
           "none of them finds its SDK here (" + "; ".join(f"{i.name}: {i.reason}" for i in infos) + ")")
    raise InitError(
        f"torch.distributed is initialised on {backend!r}, a backend name that several installed plugins drive "
        f"({names}), and {why}; name the one this world is: xccl.init(vendor={infos[0].name!r}) or "
        f"XCCL_VENDOR=<{'|'.join(i.name for i in infos)}>"
    )


def is_builtin(info: PluginInfo) -> bool:
    """Whether ``info`` is one of xccl's own plugins (cpu, cuda), which adopts its backend's worlds whatever else
    drives the name."""
    return info.plugin is not None and type(info.plugin).__module__.startswith("xccl.")
