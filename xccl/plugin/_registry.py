"""Plugin discovery: tolerant listing, strict selection.

Plugins are entry points in the ``xccl.plugins`` namespace, loaded with stevedore. Listing never raises: a
plugin whose import fails, whose target is not a plugin, whose contract version differs or whose probe raises is
reported with the reason. Selecting raises a typed error naming what is missing and how to fix it.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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

    @classmethod
    def from_plugins(cls, *plugins: Plugin) -> Registry:
        """A registry of the given plugin objects, no entry points involved."""
        return cls([(p.name, type(p).__qualname__, "", _loaded(p)) for p in plugins])

    def _discover(self) -> list[tuple[str, str, str, Callable[[], object]]]:
        if self._loaders is not None:
            return self._loaders
        from stevedore import ExtensionManager

        failed: list[tuple[str, str, Callable[[], object]]] = []

        def on_failure(_mgr: object, ep: object, exc: BaseException) -> None:
            # stevedore would log and drop it; we list it as failed with its error instead. Only its type name
            # and message are kept (see _ImportFailed for why not the exception itself).
            failed.append((getattr(ep, "name", "?"), getattr(ep, "value", "?"), _raiser(exc)))

        mgr: Any = ExtensionManager(NAMESPACE, invoke_on_load=False, on_load_failure_callback=on_failure)
        out: list[tuple[str, str, str, Callable[[], object]]] = [
            (ext.name, ext.entry_point.value, _distribution_of(ext.entry_point.value), _loaded(ext.plugin))
            for ext in mgr
        ]
        for name, target, load in failed:
            out.append((name, target, _distribution_of(target), load))
        return out

    def infos(self, *, refresh: bool = False) -> dict[str, PluginInfo]:
        """Every discovered plugin by name, probed. Never raises."""
        if self._infos is None or refresh:
            infos: dict[str, PluginInfo] = {}
            for name, target, dist_name, load in self._discover():
                if name in infos:
                    infos[name] = PluginInfo(
                        name,
                        Status.FAILED,
                        f"two entry points named {name!r}: {infos[name].target} and {target}",
                        "uninstall one of the two distributions",
                        target,
                        dist_name,
                    )
                    continue
                infos[name] = _load_one(name, target, dist_name, load)
            self._infos = dict(sorted(infos.items()))
        return self._infos

    def get(self, name: str) -> Plugin:
        """The loaded plugin called ``name``, available or not (simulation needs unavailable ones).

        Raises:
            BackendNotFound: no plugin of that name.
            BackendUnavailable: it failed to load or targets another contract version.
        """
        infos = self.infos()
        info = infos.get(name)
        if info is None:
            raise BackendNotFound(name, list(infos))
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
            info = self.infos()[vendor]
            if not info.available:
                raise BackendUnavailable(vendor, info.reason, info.fix)
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


def _load_one(name: str, target: str, dist_name: str, load: Callable[[], object]) -> PluginInfo:
    try:
        obj = load()
        plugin = obj() if callable(obj) and not isinstance(obj, Plugin) else obj
    except Exception as exc:
        LOG.debug("xccl plugin %s failed to load", name, exc_info=True)
        return PluginInfo(
            name,
            Status.FAILED,
            f"importing {target} failed: {getattr(exc, 'type_name', type(exc).__name__)}: {exc}",
            f"reinstall or fix the distribution {dist_name or 'that declares it'}",
            target,
            dist_name,
        )
    if not isinstance(plugin, Plugin):
        return PluginInfo(
            name,
            Status.FAILED,
            f"{target} is a {type(plugin).__name__}, not an xccl Plugin",
            "the entry point must target an xccl.Plugin instance or a callable returning one",
            target,
            dist_name,
        )
    if plugin.api_version != PLUGIN_API_VERSION:
        return PluginInfo(
            name,
            Status.INCOMPATIBLE,
            f"written for plugin API {plugin.api_version}, this xccl speaks {PLUGIN_API_VERSION}",
            f"install a version of {dist_name or name} built for xccl's plugin API {PLUGIN_API_VERSION}",
            target,
            dist_name,
            plugin,
        )
    try:
        probe = plugin.probe()
    except Exception as exc:
        LOG.debug("xccl plugin %s probe raised", name, exc_info=True)
        probe = ProbeResult.unavailable(f"its probe raised {type(exc).__name__}: {exc}", "report this to its authors")
    status = Status.AVAILABLE if probe.available else Status.UNAVAILABLE
    return PluginInfo(name, status, probe.reason, probe.fix, target, dist_name, plugin, dict(probe.facts))


class _ImportFailed(Exception):
    """Stands in for an entry point's import error: its type name and message, nothing else.

    Keeping the original exception and raising it again makes a reference cycle (exception -> traceback ->
    frame -> closure -> exception) that keeps the calling frames alive until the garbage collector runs; those
    frames can hold process groups (``xccl.init``'s), whose gloo threads then die at interpreter exit
    (``std::terminate``: "terminate called without an active exception").
    """

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        super().__init__(message)


def _loaded(obj: object) -> Callable[[], object]:
    """A loader for an object already at hand (a given plugin, or what stevedore imported)."""
    return lambda: obj


def _raiser(exc: BaseException) -> Callable[[], object]:
    type_name, message = type(exc).__name__, str(exc)

    def load() -> object:
        raise _ImportFailed(type_name, message)

    return load


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def _distribution_of(target: str) -> str:
    """``name version`` of the distribution providing ``target``'s top-level module, or ``""``."""
    from importlib import metadata

    top = target.split(":", 1)[0].split(".", 1)[0]
    try:
        names = _packages_distributions().get(top, [])
        return " ".join((names[0], metadata.version(names[0]))) if names else ""
    except Exception:
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
