"""Backend names that several installed plugins drive, for ``xccl doctor`` and ``xccl new-plugin`` to warn about.

Two vendors may name their torch.distributed backend alike (Ascend's and Habana's ``hccl``). Selecting a plugin by
name (``xccl.init(vendor=...)``) is unaffected; adopting a world someone else created on that backend
(``dist.init_process_group("hccl")`` then ``xccl.init()``) picks the plugin whose SDK is importable here, and
raises ``InitError`` naming them all when none or several are (``xccl/runtime/_backend_check.py``, ``plugin_for``).
A name one of xccl's own plugins drives (gloo, nccl) is no ambiguity: adoption takes xccl's plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xccl.plugin._registry import PluginInfo
from xccl.runtime._backend_check import is_builtin

__all__ = ["consequence", "shared_backends", "xccl_drives"]


def shared_backends(infos: Iterable[PluginInfo]) -> dict[str, tuple[PluginInfo, ...]]:
    """Backend name -> the loaded plugins driving it, for every name two or more drive and none of xccl's own."""
    by_backend: dict[str, list[PluginInfo]] = {}
    for info in infos:
        if info.plugin is not None:
            by_backend.setdefault(info.plugin.backend, []).append(info)
    return {backend: tuple(found) for backend, found in sorted(by_backend.items())
            if len(found) > 1 and not xccl_drives(found)}


def xccl_drives(infos: Iterable[PluginInfo]) -> bool:
    """Whether one of ``infos`` is xccl's own plugin, which adopts its backend's worlds whatever else drives the
    name (the rule of ``plugin_for``)."""
    return any(is_builtin(i) for i in infos)


def consequence(backend: str, names: Sequence[str]) -> str:
    """What sharing ``backend`` among the plugins ``names`` means, and what settles it: one sentence."""
    return (
        f"adopting a world created on {backend!r} (dist.init_process_group({backend!r}) then xccl.init()) picks the "
        "plugin whose SDK is importable here, and raises InitError naming them when none or several are; "
        f"xccl.init(vendor=...) settles it (e.g. vendor={names[0]!r}, or XCCL_VENDOR=<{'|'.join(names)}>)"
    )
