"""The vendor's run time where ``xccl.init`` meets it: the watchdog's mode and what bounds a collective, and
connecting communicators while every rank is together (``Plugin.vendor_runtime()``; docs/vendors/ascend.md)."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from typing import Any

from ..collectives._groups import state_of
from ..collectives._state import GROUPS, PROCESS
from ..collectives._watchdog import choose_mode, settings_of
from ..errors import InitError
from ..plugin._contract import Runtime

__all__ = ["collective_timeout", "connect", "connect_world", "group_options", "watchdog_settings"]


def watchdog_settings(runtime: Runtime, *, choose: bool) -> Any:
    """The vendor watchdog's settings in force; with ``choose``, xccl's mode unless the user set one.

    Raises:
        InitError: the user's mode variable holds no mode.
    """
    vendor = runtime.plugin.vendor_runtime()
    if vendor.watchdog is None:
        return None
    try:
        source = choose_mode(vendor.watchdog, os.environ) if choose else (
            "the vendor's default" if vendor.watchdog.mode_source(os.environ) is None else "set by the user")
        return settings_of(vendor, os.environ, source)
    except ValueError as exc:
        raise InitError(f"{exc}: 0 (no handling), 1 (tear down), 2 (clean up only) or 3 (skip clean up)") from None


def group_options(runtime: Runtime, ranks: Sequence[int] | None) -> dict[str, Any]:
    """``{"pg_options": ...}``: the plugin's options for a group over ``ranks`` (None: the world), or nothing."""
    options = runtime.process_group_options(ranks)
    return {} if options is None else {"pg_options": options}


def collective_timeout(group_timeout: _dt.timedelta) -> _dt.timedelta:
    """How long a collective waits on a group with this timeout: the vendor's execution timeout may come first."""
    settings = PROCESS.watchdog
    if settings is None:
        return group_timeout
    return _dt.timedelta(seconds=settings.collective_bound(group_timeout.total_seconds()))


def connect_world() -> None:
    """Connect the world's communicator now, where the vendor connects lazily: every rank is here, right after the
    rendezvous, so a rank that reaches its first collective late (a slow checkpoint load, a first compile) is
    bounded by the execution timeout instead of the much shorter connect timeout (HCCL_CONNECT_TIMEOUT)."""
    runtime, world = PROCESS.runtime, GROUPS.default
    if runtime is not None and world is not None and runtime.plugin.vendor_runtime().lazy_connect is not None:
        # A mixed world's vendor communicator is its island's (``_mixed``): every island member is here too.
        runtime.connect(world.communicator_group)


def connect(group: Any = None) -> None:
    """Connect ``group``'s communicator now (default: the world's; ``xccl.init`` already did). Every member calls it.

    Where the vendor connects a group at its first collective (HCCL, within ``HCCL_CONNECT_TIMEOUT``), a member that
    reaches that first collective late makes the others fail; calling this right after creating the group, while
    its ranks are together, moves the connect there. On other vendors it costs one tiny collective.

    Example::

        tp = xccl.new_group([0, 1])
        xccl.runtime.connect(tp)
    """
    st = state_of(group)
    st.runtime.connect(st.communicator_group)
