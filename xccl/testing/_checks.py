"""The conformance suite's checks on data: a plugin's identity, its capability table, what its discovery
imports, the communicator names its ranks report. Plain functions returning lists of problems (empty: conformant),
so that they are testable on hand-made bad input and their messages say what to fix.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Final

import torch

from xccl.plugin._capabilities import ALL_REDUCE_OPS, CapabilityTable, Collective, Level, Mode, Support
from xccl.plugin._contract import PLUGIN_API_VERSION, Plugin, ProbeResult
from xccl.plugin._registry import PluginInfo
from xccl.plugin._versions import version_key

from ._claims import FUSED, claim_problems

__all__ = [
    "KNOWN_SDKS",
    "comm_name_problems",
    "discovery_imports",
    "foreign_imports",
    "identity_problems",
    "table_problems",
]

#: Vendor SDK modules no plugin may import while being discovered, whoever depends on them.
KNOWN_SDKS: Final = frozenset({
    "torch_npu", "torchair", "acl", "torch_tpu", "sophon", "torch_xla", "habana_frameworks",
    "intel_extension_for_pytorch", "oneccl_bindings_for_pytorch",
})


def table_problems(plugin: Plugin, table: object) -> list[str]:
    """Everything wrong with a plugin's capability table as data (empty when it is well-formed)."""
    from xccl.ops._emulations import EMULATIONS

    if not isinstance(table, CapabilityTable):
        return [f"capabilities() returned {type(table).__name__}, not an xccl.CapabilityTable"]
    problems = []
    if table.backend != plugin.name:
        problems.append(f"table.backend is {table.backend!r}, not the plugin's name {plugin.name!r}: errors would "
                        "name another backend (build it with table_from(plugin.name, ...))")
    for (op, mode), sup in table.items():
        where = f"{op.value} ({mode.value})"
        if not isinstance(sup, Support) or not isinstance(sup.level, Level):
            problems.append(f"{where}: entry is {sup!r}, not a Support with a Level")
            continue
        vias = {e.via for e in EMULATIONS if e.op is op}
        problems += [f"{where}: {p}" for p in _entry_problems(op, mode, sup, vias) + claim_problems(op, mode, sup)]
        if mode is Mode.GRAPH and sup.level is not Level.UNSUPPORTED and table.entry(op).level is Level.UNSUPPORTED:
            problems.append(f"{where}: supported in graph mode but unsupported in eager mode")
    try:
        json.dumps(table.to_dict())
    except (TypeError, ValueError) as exc:
        problems.append(f"to_dict() is not JSON-serialisable ({exc}): `xccl caps --json` and the docs need it")
    return problems


def _entry_problems(op: Collective, mode: Mode, sup: Support, vias: set[str]) -> list[str]:
    out = []
    dtypes = sup.dtypes
    if dtypes is not None and (not isinstance(dtypes, frozenset) or not all(isinstance(d, torch.dtype) for d in dtypes)):
        out.append(f"dtypes {dtypes!r} must be a frozenset of torch.dtype (or None for any)")
        dtypes = None
    for what, ops in [("reduce_ops", sup.reduce_ops), *((f"dtype_reduce_ops[{d}]", v) for d, v in sup.dtype_reduce_ops.items())]:
        if ops is None:
            continue
        unknown = set(ops) - set(ALL_REDUCE_OPS)
        if unknown:
            out.append(f"{what} has unknown reduce ops {sorted(unknown)}; known: {', '.join(ALL_REDUCE_OPS)}")
        if not op.reduces:
            out.append(f"{what} given, but {op.value} does not reduce")
    if sup.world_sizes is not None and (
        not sup.world_sizes or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in sup.world_sizes)
    ):
        out.append(f"world_sizes {sorted(sup.world_sizes, key=str)} must be a non-empty set of positive integers")
    if sup.min_torch is not None and not (
        isinstance(sup.min_torch, tuple) and len(sup.min_torch) in (2, 3)
        and all(isinstance(v, int) for v in sup.min_torch)
    ):
        out.append(f"min_torch {sup.min_torch!r} must be a (major, minor) or (major, minor, patch) tuple of integers")
    if sup.min_sdk is not None and not (
        isinstance(sup.min_sdk, tuple) and len(sup.min_sdk) == 2 and isinstance(sup.min_sdk[0], str)
        and sup.min_sdk[0] and isinstance(sup.min_sdk[1], str) and version_key(sup.min_sdk[1]) is not None
    ):
        out.append(f"min_sdk {sup.min_sdk!r} must be (SDK name, version) with a version like '8.6.0' or '8.0.RC2'")
    for src, dst in sup.cast_to.items():
        if dtypes is not None and dst not in dtypes:
            out.append(f"cast_to maps {src} to {dst}, which the kernel does not accept either")
        if dtypes is not None and src in dtypes:
            out.append(f"cast_to maps {src}, which the kernel already accepts")
    if sup.level is Level.EMULATED and mode is Mode.EAGER and op not in FUSED:  # fused ops: the portable version
        known = sorted(vias)
        if not sup.via:
            out.append("emulated, but names no emulation in `via`" + (f" (xccl has: {', '.join(known)})" if known else ""))
        elif sup.via not in known:
            out.append(f"emulated via {sup.via!r}, which xccl does not have for this op"
                       + (f" (it has: {', '.join(known)})" if known else " (it has none: mark it unsupported)"))
    return out


def identity_problems(info: PluginInfo, plugin: Plugin, probe: object) -> list[str]:
    """What is inconsistent in a plugin's identity, contract version and probe result."""
    problems = []
    if plugin.name != info.name:
        problems.append(f"Plugin.name is {plugin.name!r} but the entry point is named {info.name!r}: xccl looks "
                        "plugins up by the entry-point name, so the two must agree")
    if plugin.api_version != PLUGIN_API_VERSION:
        problems.append(f"api_version is {plugin.api_version}; this xccl speaks plugin API {PLUGIN_API_VERSION}")
    for attr in ("vendor", "device_type", "backend"):
        value = getattr(plugin, attr)
        if not isinstance(value, str) or not value:
            problems.append(f"Plugin.{attr} must be a non-empty string, got {value!r}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", str(plugin.backend)):
        problems.append(f"Plugin.backend {plugin.backend!r} must be a lower-case identifier (torch.distributed "
                        "backend names are)")
    if not isinstance(plugin.accelerator, bool):
        problems.append(f"Plugin.accelerator must be a bool, got {plugin.accelerator!r}")
    if not isinstance(probe, ProbeResult):
        problems.append(f"probe() returned {type(probe).__name__}, not an xccl.ProbeResult")
    elif not probe.available and not (probe.reason and probe.fix):
        problems.append("probe() says unavailable without both a reason and a fix; `xccl doctor` shows them to users")
    profile = plugin.simulation()
    if profile is not None and getattr(profile, "backend", None) != plugin.backend:
        problems.append(f"simulation() profile simulates backend {getattr(profile, 'backend', None)!r}, but the "
                        f"plugin's backend is {plugin.backend!r}")
    return problems


_DISCOVERY_SCRIPT: Final = textwrap.dedent(
    """
    import json, sys
    import torch  # its device-backend autoload may import a vendor SDK: not the plugin's doing
    before = set(sys.modules)
    from importlib.metadata import entry_points
    import xccl
    (ep,) = [e for e in entry_points(group="xccl.plugins") if e.name == sys.argv[1]]
    obj = ep.load()
    plugin = obj() if callable(obj) and not isinstance(obj, xccl.Plugin) else obj
    plugin.probe()
    plugin.capabilities()
    plugin.simulation()
    new = sorted({m.split(".")[0] for m in set(sys.modules) - before})
    print(json.dumps({"new": new, "dist": ep.dist.name if ep.dist else "", "module": ep.module}))
    """
)


def discovery_imports(name: str) -> dict[str, Any]:
    """Top-level modules a fresh interpreter imports to load, probe and read the table of plugin ``name``."""
    proc = subprocess.run(
        [sys.executable, "-c", _DISCOVERY_SCRIPT, name], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"loading plugin {name!r} in a fresh interpreter failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def foreign_imports(found: Mapping[str, Any]) -> list[str]:
    """Modules in ``found["new"]`` that neither the plugin, xccl, their required dependencies nor the standard
    library provide, and every known vendor SDK: what a cheap probe must not import."""
    allowed = _requirement_closure(["xccl", found.get("dist") or ""])
    owners = metadata.packages_distributions()
    own_top = str(found.get("module", "")).split(".")[0]
    bad = []
    for mod in found["new"]:
        if mod in KNOWN_SDKS:
            bad.append(f"{mod} (a vendor SDK)")
        elif mod in sys.stdlib_module_names or mod == own_top or mod.startswith("__"):
            continue
        else:
            dists = {_norm(d) for d in owners.get(mod, [])}
            if not dists & allowed:
                bad.append(f"{mod} (from {', '.join(sorted(dists)) or 'no installed distribution'})")
    return bad


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_closure(roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = [_norm(r) for r in roots if r]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        names = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r) for r in reqs if not re.search(r"extra\s*==", r))
        todo += [_norm(m.group(1)) for m in names if m]
    return seen


def comm_name_problems(per_rank: list[dict[str, str]]) -> list[str]:
    """What is wrong with the names every rank reported (see :func:`xccl.testing._bodies.comm_names`)."""
    problems = []
    by_group: dict[str, set[str]] = {}
    for r, names in enumerate(per_rank):
        for label, name in names.items():
            if not isinstance(name, str) or not name:
                problems.append(f"rank {r}: comm_name of {label} is {name!r}, not a non-empty string")
            by_group.setdefault(label, set()).add(name)
        if names["world"] != names["world again"]:
            problems.append(f"rank {r}: the world's name changed between calls: {names['world']!r}, {names['world again']!r}")
        if names["every rank, group a"] != names["every rank, group a again"]:
            problems.append(f"rank {r}: a group's name changed between calls")
    for label, names_ in by_group.items():
        if len(names_) > 1:
            problems.append(f"members of {label} disagree on its name: {sorted(names_)}")
    distinct = {label: next(iter(v)) for label, v in by_group.items() if not label.endswith("again")}
    if len(set(distinct.values())) != len(distinct):
        problems.append(f"two different groups share a name: {distinct}")
    return problems
