"""Plugin discovery: tolerant listing, strict selection.

Plugins are entry points in the ``xccl.plugins`` namespace (read with ``importlib.metadata``). Listing never
raises: a plugin whose import fails, whose target is not a plugin, whose contract version differs or whose probe
raises is reported with the reason. Selecting raises a typed error naming what is missing and how to fix it.

Selecting a plugin by name (``xccl.init(vendor="sophgo")``, ``XCCL_VENDOR``) imports that plugin's entry point
only; listing, and ``"auto"`` (which must probe every plugin), import them all (why: docs/performance-history.md,
plugin discovery).
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, final

from ..errors import BackendNotFound, BackendUnavailable, InitError
from ._contract import PLUGIN_API_VERSION, Plugin, ProbeResult

__all__ = ["NAMESPACE", "PluginInfo", "Registry", "Status", "default_registry", "plugins"]

LOG = logging.getLogger("xccl")

#: The entry-point namespace every plugin registers in.
NAMESPACE: Final = "xccl.plugins"


class Status(str, enum.Enum):
    """Outcome of discovering and probing one plugin."""

    AVAILABLE = "available"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    INCOMPATIBLE = "incompatible"

    def __str__(self) -> str:
        return self.value


@final
@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One discovered plugin as ``xccl.plugins()`` reports it."""

    #: Entry-point name.
    name: str
    status: Status
    #: Why it is not available (empty when available).
    reason: str = ""
    #: What to do about it.
    fix: str = ""
    #: ``module:attr`` the entry point targets.
    target: str = ""
    #: Distribution that declared the entry point, with its version.
    distribution: str = ""
    #: The plugin object, when it loaded.
    plugin: Plugin | None = None
    #: What the probe found.
    facts: dict[str, str] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        """Whether the plugin can be selected without simulation."""
        return self.status is Status.AVAILABLE

    @property
    def accelerator(self) -> bool:
        """Whether this is an accelerator plugin (False for the CPU one or when it failed to load)."""
        return self.plugin is not None and self.plugin.accelerator


class Registry:
    """A set of plugins, discovered from entry points or given directly (the test seam).

    Args:
        loaders: ``(name, target, distribution, load)`` tuples; ``load()`` returns the plugin object. ``None``
            discovers them from the ``xccl.plugins`` entry points.
    """

    def __init__(self, loaders: Iterable[tuple[str, str, str, Callable[[], object]]] | None = None) -> None:
        self._loaders = list(loaders) if loaders is not None else None
        self._infos: dict[str, PluginInfo] | None = None
        #: Plugins loaded one by one (``get``/``select`` by name) before a full listing.
        self._named: dict[str, PluginInfo] = {}

    @classmethod
    def from_plugins(cls, *plugins: Plugin) -> Registry:
        """A registry of the given plugin objects, no entry points involved."""
        return cls([(p.name, type(p).__qualname__, "", _const(p)) for p in plugins])

    def _discover(self) -> list[tuple[str, str, Callable[[], str], Callable[[], object]]]:
        """``(name, target, distribution, load)`` per entry point, nothing imported yet."""
        if self._loaders is not None:
            return [(name, target, _const(dist), load) for name, target, dist, load in self._loaders]
        from importlib import metadata

        return [(ep.name, ep.value, partial(_distribution_of, ep), ep.load)
                for ep in metadata.entry_points(group=NAMESPACE)]

    def _info(self, name: str) -> PluginInfo | None:
        """The plugin called ``name``, importing no other plugin; None when there is none."""
        if self._infos is not None:
            return self._infos.get(name)
        if name not in self._named:
            found = [e for e in self._discover() if e[0] == name]
            if not found:
                return None
            self._named[name] = _one_of(found)
        return self._named[name]

    def infos(self, *, refresh: bool = False) -> dict[str, PluginInfo]:
        """Every discovered plugin by name, probed. Never raises."""
        if self._infos is None or refresh:
            if refresh:
                self._named.clear()
            entries: dict[str, list[tuple[str, str, Callable[[], str], Callable[[], object]]]] = {}
            for entry in self._discover():
                entries.setdefault(entry[0], []).append(entry)
            infos = {name: self._named.get(name) or _one_of(found) for name, found in entries.items()}
            self._infos = dict(sorted(infos.items()))
        return self._infos

    def names(self) -> list[str]:
        """The names of every plugin, none imported."""
        if self._infos is not None:
            return list(self._infos)
        return sorted({e[0] for e in self._discover()})

    def get(self, name: str) -> Plugin:
        """The loaded plugin called ``name``, available or not (simulation needs unavailable ones).

        Raises:
            BackendNotFound: no plugin of that name.
            BackendUnavailable: it failed to load or targets another contract version.
        """
        info = self._info(name)
        if info is None:
            raise BackendNotFound(name, self.names())
        if info.plugin is None:
            raise BackendUnavailable(name, info.reason, info.fix)
        return info.plugin

    def select(self, vendor: str = "auto") -> Plugin:
        """Pick the plugin for ``vendor``: strict, raising a typed error when it cannot run here.

        ``"auto"`` honours ``XCCL_VENDOR``, then picks the one available accelerator plugin, else ``cpu``.

        Raises:
            BackendNotFound, BackendUnavailable: the named plugin is missing or cannot run.
            InitError: two accelerator plugins are available and none was named.
        """
        if vendor == "auto":
            vendor = os.environ.get("XCCL_VENDOR", "").strip() or "auto"
        if vendor != "auto":
            plugin = self.get(vendor)
            info = self._info(vendor)
            if info is None or not info.available:
                raise BackendUnavailable(vendor, info.reason if info else "", info.fix if info else "")
            return plugin
        accel = [i for i in self.infos().values() if i.available and i.accelerator]
        if len(accel) > 1:
            names = ", ".join(i.name for i in accel)
            raise InitError(
                f"several accelerator plugins are available ({names}); choose one with "
                f"xccl.init(vendor=...) or XCCL_VENDOR=<name>"
            )
        if accel:
            return accel[0].plugin  # type: ignore[return-value]
        # Several CPU plugins may be installed (test or debugging ones): the built-in "cpu" comes first.
        cpu = sorted((i for i in self.infos().values() if i.available and not i.accelerator), key=lambda i: i.name != "cpu")
        if not cpu:
            raise BackendNotFound("cpu", list(self.infos()))
        return cpu[0].plugin  # type: ignore[return-value]


def _one_of(found: Sequence[tuple[str, str, Callable[[], str], Callable[[], object]]]) -> PluginInfo:
    """The PluginInfo of the entry points named alike in ``found`` (two of one name: neither is loaded)."""
    name, target, dist, load = found[0]
    if len(found) > 1:
        return PluginInfo(name, Status.FAILED, f"two entry points named {name!r}: {target} and {found[1][1]}",
                          "uninstall one of the two distributions", found[1][1], found[1][2]())
    return _load_one(name, target, dist(), load)


def _load_one(name: str, target: str, dist_name: str, load: Callable[[], object]) -> PluginInfo:
    def info(status: Status, reason: str, fix: str, plugin: Plugin | None = None) -> PluginInfo:
        return PluginInfo(name, status, reason, fix, target, dist_name, plugin)

    try:
        obj = load()
        plugin = obj() if callable(obj) and not isinstance(obj, Plugin) else obj
    except Exception as exc:
        LOG.debug("xccl plugin %s failed to load", name, exc_info=True)
        return info(Status.FAILED, f"importing {target} failed: {type(exc).__name__}: {exc}",
                    f"reinstall or fix the distribution {dist_name or 'that declares it'}")
    if not isinstance(plugin, Plugin):
        return info(Status.FAILED, f"{target} is a {type(plugin).__name__}, not an xccl Plugin",
                    "the entry point must target an xccl.Plugin instance or a callable returning one")
    if plugin.api_version != PLUGIN_API_VERSION:
        return info(Status.INCOMPATIBLE,
                    f"written for plugin API {plugin.api_version}, this xccl speaks {PLUGIN_API_VERSION}",
                    f"install a version of {dist_name or name} built for xccl's plugin API {PLUGIN_API_VERSION}",
                    plugin)
    try:
        probe = plugin.probe()
    except Exception as exc:
        LOG.debug("xccl plugin %s probe raised", name, exc_info=True)
        probe = ProbeResult.unavailable(f"its probe raised {type(exc).__name__}: {exc}", "report this to its authors")
    status = Status.AVAILABLE if probe.available else Status.UNAVAILABLE
    return PluginInfo(name, status, probe.reason, probe.fix, target, dist_name, plugin, dict(probe.facts))


def _const(value: object) -> Callable[[], Any]:
    """A loader (or a distribution's name) for a value already at hand."""
    return lambda: value


def _distribution_of(ep: Any) -> str:
    """``name version`` of the distribution that declares entry point ``ep``, or ``""``."""
    try:
        return f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else ""
    except Exception:  # a distribution with broken metadata must not break listing
        return ""


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry over the installed entry points."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry()
    return _DEFAULT


def plugins(*, refresh: bool = False) -> list[PluginInfo]:
    """Every discovered plugin with its availability, reason and fix. Never raises.

    Args:
        refresh: probe again instead of returning the cached report.
    """
    return list(default_registry().infos(refresh=refresh).values())
