"""The vendor's settings that would bite the script at world size N: ``xccl doctor``'s vendor-runtime checks (the
watchdog's mode and the time a hung collective takes to fail, lazy connection, communicators), judged in the
environment the preflight gave its ranks, plus the device memory the script's process groups would hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import final

from ..plugin._registry import Registry
from .cli.doctor_runtime import vendor_runtime

__all__ = ["Setting", "settings"]


@final
@dataclass(frozen=True, slots=True)
class Setting:
    """One vendor setting, as ``xccl doctor`` judges it.

    Attributes:
        name: what was checked (``watchdog``, ``communicators``, ``communicator memory``).
        status: ``ok``, ``info``, ``warn`` or ``fail``.
        summary: what was found; fix: what to do (empty: nothing).
    """

    name: str
    status: str
    summary: str
    fix: str = ""


def settings(registry: Registry, vendor: str, env: Mapping[str, str], groups: int) -> list[Setting]:
    """The vendor-runtime findings for ``vendor`` in ``env``, and what ``groups`` process groups per rank hold."""
    out = [Setting(f.name, f.status, f.summary, f.fix) for f in vendor_runtime(env, registry, vendor)]
    memory = registry.get(vendor).vendor_runtime().comm_memory
    if memory is not None and groups:
        mb = memory.comm_mb(env)
        out.append(Setting("communicator memory", "info",
                           f"the script's {groups} process group(s) per rank hold {groups} communicator(s) of "
                           f"{memory.buffers} x {memory.env}={memory.mb(env)} MB: {groups * mb} MB of device memory "
                           "per rank (a group's own buffer size, where set, changes its share)"))
    return out
