"""What the conformance suite runs on each rank for the vendor's run time (``Plugin.vendor_runtime()``).

For each behaviour the plugin declares (watchdog, lazy connect, patches of ``torch.distributed``), checks that
xccl's policy holds on it (:func:`runtime_batch` names each); with the vendor's timeouts made short
(:func:`short_timeouts`: the suite sets them in simulation, a user on the hardware), also that the failure the
vendor gives reaches every rank typed (the suite checks in its own process that a simulated SDK's patches are
undone at shutdown). Every rank runs the same calls in the same order; each check returns failure messages.
"""

from __future__ import annotations

import importlib
import itertools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch

import xccl
import xccl.runtime
from xccl.errors import CollectiveTimeout, XcclError
from xccl.plugin._sim_runtime import SIM_CONNECT_ENV, sim_wait
from xccl.plugin._vendor_runtime import TorchPatch, VendorRuntime

from ._bodies import note
from ._pool import all_here

__all__ = ["SHORT_CONNECT", "SHORT_EXEC", "merged", "patch_targets", "resolve", "runtime_batch", "short_timeouts"]

#: The vendor's execution timeout in the suite's simulated runtime checks, seconds.
SHORT_EXEC: Final = 4
#: Its connect timeout there, seconds.
SHORT_CONNECT: Final = 2
#: Which run of :func:`runtime_batch` this process is in (the same on every rank), for fresh store keys.
_RUNS: Final = itertools.count()
#: A late peer's delay below the execution timeout, and the group timeout below it that xccl must lift.
_LATE: Final = 1.5
_GROUP_TIMEOUT: Final = 1.0


def short_timeouts(declared: VendorRuntime) -> dict[str, str]:
    """The environment that makes the vendor's timeouts short in simulation, so its failures show in seconds."""
    env: dict[str, str] = {}
    if declared.watchdog is not None and declared.watchdog.exec_timeout_env:
        env[declared.watchdog.exec_timeout_env] = str(SHORT_EXEC)
    if declared.lazy_connect is not None:
        # A value the vendor takes (HCCL: at least 120 s), and the simulated connect told to wait the short one.
        env[declared.lazy_connect.timeout_env] = f"{max(SHORT_CONNECT, declared.lazy_connect.minimum):g}"
        env[SIM_CONNECT_ENV] = str(SHORT_CONNECT)
    return env


def resolve(target: str) -> Any:
    """The object a dotted path names (``torch.distributed.gather``)."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ValueError(f"{target!r} names no importable module")


def runtime_batch(progress: str | None = None) -> dict[str, list[str]]:
    """Every declared behaviour's checks on this rank: ``{check: failures}`` (absent: not declared, or not
    checkable here; a skipped check says why in ``"skipped: ..."``)."""
    from xccl.collectives._state import PROCESS

    runtime = PROCESS.runtime
    if runtime is None:
        return {"setup": ["xccl is not initialised on this rank"]}
    declared = runtime.plugin.vendor_runtime()
    checks: list[tuple[str, Callable[[VendorRuntime, bool], list[str]]]] = []
    if declared.watchdog is not None:
        checks += [("watchdog: a peer late by less than the execution timeout kills no process", _slow_peer),
                   ("watchdog: a peer later than the execution timeout gives a typed error", _hung_peer)]
    if declared.lazy_connect is not None:
        checks += [("connect: the world is connected by xccl.init", _world_connected),
                   ("connect: a group connected by xccl.runtime.connect survives a late rank", _connected_group),
                   ("connect: a late rank on an unconnected group is named", _late_rank_named)]
    if declared.patches_on_import:
        checks.append(("patches: every declared replacement is in place", _patched))
    out: dict[str, list[str]] = {}
    run = next(_RUNS)
    for i, (name, check) in enumerate(checks):
        # Every rank reaches the check before it starts: a check's late rank must not make the next check's first
        # collective late (which the vendor's timeouts would punish).
        all_here(f"conformance.runtime/{run}/{i}", timeout=120.0)
        note(progress, xccl.get_world().rank, name)
        try:
            out[name] = check(declared, runtime.simulate)
        except Exception as exc:  # reported with the check's name
            out[name] = [f"{type(exc).__name__}: {exc}"]
    return out


def _lined_up_group(**kwargs: Any) -> Any:
    """A new group, connected and with every rank past its first collective."""
    g = xccl.new_group(**kwargs)
    xccl.all_reduce(torch.ones(1, device=xccl.get_world().device), group=g)
    return g


def _late_sum(g: Any, late: float) -> list[str]:
    """Rank 1 reaches an all_reduce of ones on ``g`` ``late`` seconds after the others: what is wrong with the sum."""
    w = xccl.get_world()
    if w.rank == 1:
        time.sleep(late)
    t = torch.ones(2, device=w.device)
    xccl.all_reduce(t, group=g)
    return [] if t.tolist() == [float(w.world_size)] * 2 else [f"all_reduce gave {t.tolist()}"]


def _slow_peer(declared: VendorRuntime, simulate: bool) -> list[str]:
    assert declared.watchdog is not None
    exec_s = declared.watchdog.exec_timeout(os.environ)
    if exec_s != 0 and exec_s <= _LATE + 0.5:
        return [f"skipped: {declared.watchdog.exec_timeout_env}={exec_s:g} s is too short to be late within it"]
    return _late_sum(_lined_up_group(timeout=_GROUP_TIMEOUT), _LATE)


def _hung_peer(declared: VendorRuntime, simulate: bool) -> list[str]:
    assert declared.watchdog is not None
    exec_s = declared.watchdog.exec_timeout(os.environ)
    if exec_s == 0 or exec_s > SHORT_EXEC:
        return [f"skipped: needs {declared.watchdog.exec_timeout_env} <= {SHORT_EXEC} s (the suite sets it in "
                "simulation; set it on the hardware)"]
    g = _lined_up_group()
    late = xccl.get_world().rank == 1
    try:
        _late_sum(g, exec_s + 1)
    except CollectiveTimeout as exc:
        name = declared.watchdog.exec_timeout_env
        return [] if late or name in str(exc) else [f"CollectiveTimeout does not name {name}: {exc}"]
    except XcclError as exc:  # the late rank may find its peers gone instead
        return [] if late else [f"{type(exc).__name__} instead of CollectiveTimeout: {exc}"]
    return ["the collective completed although a peer was later than the execution timeout"]


def _world_connected(declared: VendorRuntime, simulate: bool) -> list[str]:
    from xccl.runtime._communicators import communicators

    world = [c for c in communicators() if c.group == "0" and c.kind == "vendor"]
    if not world:
        return ["xccl.runtime.communicators() lists no vendor communicator for the world"]
    return [] if world[0].connected is not False else ["the world's communicator is not connected after xccl.init"]


def _connect_timeout(declared: VendorRuntime) -> float | None:
    lazy = declared.lazy_connect
    assert lazy is not None
    seconds = sim_wait(lazy.timeout(os.environ))  # the simulated connect's wait (SIM_CONNECT_ENV), else the vendor's
    return seconds if seconds <= SHORT_CONNECT else None


def _connected_group(declared: VendorRuntime, simulate: bool) -> list[str]:
    seconds = _connect_timeout(declared)
    if seconds is None:
        return [f"skipped: needs {declared.lazy_connect.timeout_env if declared.lazy_connect else ''} <= "
                f"{SHORT_CONNECT} s (the suite sets it in simulation; set it on the hardware)"]
    g = xccl.new_group()
    xccl.runtime.connect(g)  # what the docs recommend right after creating a group
    return _late_sum(g, seconds + 1)


def _late_rank_named(declared: VendorRuntime, simulate: bool) -> list[str]:
    seconds = _connect_timeout(declared)
    lazy = declared.lazy_connect
    if seconds is None or lazy is None:
        return [f"skipped: needs the connect timeout <= {SHORT_CONNECT} s (set by the suite in simulation)"]
    g = xccl.new_group()
    try:
        _late_sum(g, seconds + 1)
    except CollectiveTimeout as exc:
        if lazy.timeout_env not in str(exc):
            return [f"CollectiveTimeout does not name {lazy.timeout_env}: {exc}"]
        return [] if xccl.get_world().rank == 1 or "rank(s) [1]" in str(exc) else [f"the late rank 1 is not named: {exc}"]
    except XcclError as exc:
        return [f"{type(exc).__name__} instead of CollectiveTimeout: {exc}"]
    return ["the collective completed although a rank was later than the connect timeout"]


def _patched(declared: VendorRuntime, simulate: bool) -> list[str]:
    return [f"{p.target} is still torch's own ({_module(resolve(p.target))}): the SDK's replacement is not in place"
            for p in declared.patches_on_import if _module(resolve(p.target)).startswith("torch.")]


def _module(obj: Any) -> str:
    return str(getattr(obj, "__module__", "") or "")


def merged(reports: list[tuple[int, dict[str, list[str]]]]) -> dict[str, list[str]]:
    """Every rank's report of :func:`runtime_batch` as one: each check's failures, by rank (a skip once)."""
    out: dict[str, list[str]] = {}
    for rank, report in reports:
        for name, failures in report.items():
            out.setdefault(name, []).extend(
                f"rank {rank}: {f}" for f in failures if not f.startswith("skipped:") or rank == reports[0][0])
    return out


def patch_targets(patches: tuple[TorchPatch, ...]) -> Mapping[str, Any]:
    """The current object at every declared target (to compare before and after a runtime's shutdown)."""
    return {p.target: resolve(p.target) for p in patches}

