"""``xccl doctor``'s checks of this node, and :func:`collect`, which runs every check.

This module judges what is installed (python, torch and its autoloaded extensions, the vendor packages, the
plugins and the one ``xccl.init`` would select); ``doctor_node`` judges what the environment tells this rank
(visible devices, rank table, rendezvous). Doctor never imports a vendor SDK: vendor knowledge comes from the
plugins' probes and package metadata.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any, Final

from .doctor_model import Finding, Report, Status
from .doctor_node import devices, rank_table, rendezvous, vendor_runtime

__all__ = ["AUTOLOAD_ENV", "autoload_failure", "collect", "consequence", "tpu_flavour", "xccl_drives"]

#: torch's switch for importing device-backend extensions at ``import torch``.
AUTOLOAD_ENV: Final = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_CANN_ENV: Final = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH")
_CANN_FIX: Final = (
    "source CANN's environment script (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`) in the shell "
    "that runs python; without an Ascend device and CANN, uninstall torch_npu; to import torch regardless, "
    f"`export {AUTOLOAD_ENV}=0` (then `import torch_npu` explicitly where it is needed)"
)


# ------------------------------------------------------------------------------------------------------ collect


def collect(
    env: Mapping[str, str] | None = None,
    vendor: str | None = None,
    registry: Any = None,
    *,
    try_import: bool = True,
) -> Report:
    """Run every check.

    Args:
        env: the environment to judge (default ``os.environ``); a test seam.
        vendor: the plugin to judge (default: ``XCCL_VENDOR`` / ``XCCL_SIMULATE`` from ``env``, else auto).
        registry: the plugins (default: the installed ones).
        try_import: run ``import torch`` in a child process when a backend extension is autoloaded.
    """
    from xccl.plugin._registry import default_registry

    env = dict(os.environ if env is None else env)
    reg = registry or default_registry()
    findings: list[Finding] = [_python(), *_torch(), *_autoload(env, try_import), *_packages(env, reg)]
    findings += _plugins(reg)
    chosen, found = _selected(env, vendor, reg)
    findings.append(found)
    findings += devices(env, reg, chosen)
    findings += rank_table(env)
    findings += rendezvous(env)
    findings += vendor_runtime(env, reg, chosen)
    return Report(tuple(findings), chosen)


# ---------------------------------------------------------------------------------------------- python, torch


def _python() -> Finding:
    return Finding(
        "python", "interpreter", "info", f"{platform.python_implementation()} {platform.python_version()}",
        facts={"executable": sys.executable, "platform": platform.platform()},
    )


def _release() -> list[Finding]:
    """Where the installed torch stands in xccl's supported range, and what xccl does otherwise on it."""
    from xccl.ops._torch import FLOOR, NEWEST, TORCH

    tested = f"xccl supports torch {FLOOR[0]}.{FLOOR[1]} to {NEWEST[0]}.{NEWEST[1]}"
    newer = TORCH.release > NEWEST
    out = [Finding("torch", "supported range", "warn" if newer else "ok",
                   f"{tested}; {TORCH.version} is newer than any it was tested on" if newer else tested,
                   "report what fails at the project's issue tracker" if newer else "")]
    return out + [Finding("torch", f"before torch {c.needs}", "warn" if c.feature else "info", c.said())
                  for c in TORCH.missing()]


def _torch() -> list[Finding]:
    import torch
    import torch.distributed as dist

    from xccl.ops._torch import TORCH

    version = torch.version
    build = (
        f"CUDA {version.cuda}" if version.cuda else f"ROCm {version.hip}" if getattr(version, "hip", None) else "CPU"
    )
    facts = {
        "git": str(getattr(version, "git_version", "?"))[:12],
        "debug": str(getattr(version, "debug", "?")),
        "cxx11_abi": str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "?")),
        "path": os.path.dirname(torch.__file__),
    }
    out = [Finding("torch", "torch", "ok", f"{TORCH.version} ({build} build)", facts=facts), *_release()]
    if not dist.is_available():
        out.append(Finding(
            "torch", "torch.distributed", "fail", "this torch build has no torch.distributed",
            "install a torch wheel built with distributed support (the official wheels are)",
        ))
        return out
    backends = {
        "gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available(),
    }
    have = [name for name, ok in backends.items() if ok]
    status: Status = "ok" if backends["gloo"] else "warn"
    out.append(Finding(
        "torch", "torch.distributed", status, f"backends built in: {', '.join(have) or 'none'}",
        "" if backends["gloo"] else "gloo is missing: xccl's cpu plugin and host-side emulations need it",
    ))
    return out


# ---------------------------------------------------------------------------------------------------- autoload


_AUTOLOAD_FAILED: Final = re.compile(r"Failed to load the backend extension: (\S+?)[.\s]")
_RAISED: Final = re.compile(r"(?m)^(?:[\w.]+\.)?\w*(?:Error|Exception)\b.*$")


def _autoload(env: Mapping[str, str], try_import: bool) -> list[Finding]:
    """Backend extensions torch imports at ``import torch``, and whether that import works with autoload on."""
    eps = list(metadata.entry_points(group="torch.backends"))
    names = {ep.name: ep.value for ep in eps}
    if not eps:
        return [Finding("autoload", "import torch", "ok", "no device-backend extension is registered for autoload")]
    shim = env.get("XCCL_DOCTOR_AUTOLOAD_SET_BY_SHIM") == "1"  # set by the `xccl` console script, not the user
    facts = {**names, AUTOLOAD_ENV: "(unset: on)" if shim else env.get(AUTOLOAD_ENV, "(unset: on)")}
    if not try_import:
        return [Finding("autoload", "import torch", "info", f"autoloaded extensions: {', '.join(names)}", facts=facts)]
    child = {k: v for k, v in env.items() if k not in (AUTOLOAD_ENV, "XCCL_DOCTOR_AUTOLOAD_SET_BY_SHIM")}
    ok, error = _import_torch(child)
    if ok:
        return [Finding(
            "autoload", "import torch", "ok", f"works with autoload on; it also imports {', '.join(names)}",
            facts=facts,
        )]
    return [autoload_failure(error, facts)]


def autoload_failure(stderr: str, facts: Mapping[str, str] | None = None) -> Finding:
    """The finding for an ``import torch`` that failed with autoload on, from the child's stderr.

    Failing with autoload on is a failure even when this shell turned it off (which is how doctor itself got
    this far): every script that does not set the variable dies in its first line.
    """
    match = _AUTOLOAD_FAILED.search(stderr)
    culprit = match.group(1) if match else ""
    info = dict(facts or {})
    raised = _RAISED.findall(stderr)
    info["error"] = raised[-1][:300] if raised else (stderr.strip().splitlines() or ["?"])[-1][:300]
    if len(raised) > 1:
        info["cause"] = raised[0][:300]  # the first exception of the chain: what the extension itself hit
    if culprit == "torch_npu":
        summary, fix = (
            "fails: torch_npu is installed but cannot load (CANN missing or not sourced); every `import torch` in "
            "this environment fails the same way",
            _CANN_FIX,
        )
    elif culprit:
        summary, fix = (
            f"fails: the backend extension {culprit} cannot load; every `import torch` in this environment fails",
            f"fix or uninstall the distribution that provides {culprit!r}, or `export {AUTOLOAD_ENV}=0`",
        )
    else:
        summary, fix = "fails (see error)", "run `python -c 'import torch'` and fix what it reports"
    return Finding("autoload", "import torch", "fail", summary, fix, info)


def _import_torch(env: Mapping[str, str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch"], env=dict(env), capture_output=True, text=True, timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"could not run {sys.executable}: {exc}"
    return proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------------- packages


def _distribution(*names: str) -> metadata.Distribution | None:
    for name in names:
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _field(dist: metadata.Distribution, key: str) -> str:
    values = dist.metadata.get_all(key)
    return str(values[0]) if values else ""


def _packages(env: Mapping[str, str], registry: Any) -> list[Finding]:
    """One finding per vendor SDK package an installed plugin names (``Plugin.sdk_packages``)."""
    wanted: dict[str, list[str]] = {}
    for info in registry.infos().values():
        packages = getattr(info.plugin, "sdk_packages", ())
        for package in packages if isinstance(packages, tuple) else ():
            wanted.setdefault(str(package), []).append(info.name)
    # Two doctor knows more about: torch_npu (CANN's variables), torch_tpu (whose).
    known = {"torch_npu": lambda: _torch_npu(env), "torch_tpu": _torch_tpu}
    return [known[key]() if (key := package.replace("-", "_")) in known else _package(package, plugins)
            for package, plugins in wanted.items()]


def _package(name: str, plugins: list[str]) -> Finding:
    """A vendor SDK package by its metadata: its version, and whether it was built for this torch."""
    dist = _distribution(name, name.replace("-", "_"), name.replace("_", "-"))
    users = f"the SDK of plugin {', '.join(plugins)}"
    if dist is None:
        return Finding("packages", name, "info", f"not installed ({users})")
    facts = {"version": dist.version, "plugins": ", ".join(plugins)}
    pin = _torch_pin(name, dist, facts)
    return pin or Finding("packages", name, "ok", f"{name} {dist.version} ({users})", facts=facts)


def _torch_pin(name: str, dist: metadata.Distribution, facts: dict[str, str]) -> Finding | None:
    """A failing finding when ``dist`` requires another torch than this one (recorded in ``facts``), else None."""
    from xccl.ops._torch import TORCH

    wanted = [r for r in dist.requires or () if re.match(r"torch\s*[(=<>!~]", r)]
    facts["requires"] = "; ".join(wanted) or "(no torch pin)"
    mismatch = [r for r in wanted if not _satisfies(TORCH.version, r)]
    if not mismatch:
        return None
    return Finding(
        "packages", name, "fail",
        f"{name} {dist.version} was built for {mismatch[0]}, but torch is {TORCH.version}",
        f"install the {name} release made for torch {TORCH.version.split('+')[0]}, or the torch it pins "
        "(`pip install 'torch==<that version>'`)",
        facts,
    )


def _torch_npu(env: Mapping[str, str]) -> Finding:
    import torch

    dist = _distribution("torch_npu", "torch-npu")
    if dist is None:
        return Finding("packages", "torch_npu", "info", "not installed")
    facts = {"version": dist.version, **{k: env[k] for k in _CANN_ENV if k in env}}
    pin = _torch_pin("torch_npu", dist, facts)
    if pin is not None:
        return pin
    if torch.version.cuda or getattr(torch.version, "hip", None):
        return Finding(
            "packages", "torch_npu", "fail",
            "torch_npu is installed next to a CUDA/ROCm build of torch; it refuses to run there ('Two accelerators "
            "cannot be used at the same time')",
            "use a CPU build of torch with torch_npu (`pip install torch --index-url https://download.pytorch.org/whl/cpu`)",
            facts,
        )
    cann = [k for k in _CANN_ENV if k in env]
    if not cann:
        return Finding(
            "packages", "torch_npu", "warn",
            f"torch_npu {dist.version} is installed but no CANN variable is set ({', '.join(_CANN_ENV[:2])})",
            _CANN_FIX, facts,
        )
    return Finding("packages", "torch_npu", "ok", f"torch_npu {dist.version}, CANN variables set", facts=facts)


def _satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` meets ``requirement`` (a ``torch==2.13.0.*`` style line); unknown forms pass."""
    base = version.split("+", 1)[0]
    try:
        from packaging.requirements import Requirement

        return Requirement(requirement).specifier.contains(base, prereleases=True)
    except ImportError:  # packaging is not a dependency; handle the pins vendors use
        match = re.search(r"==\s*([0-9][0-9.]*?)(\.\*)?\s*(?:[;,)]|$)", requirement)
        if not match:
            return True
        pin = match.group(1)
        return base == pin or (match.group(2) is not None and base.startswith(pin + "."))
    except Exception:  # an unparsable pin is reported as satisfied rather than crashing doctor
        return True


def tpu_flavour(dist: metadata.Distribution) -> tuple[str, str]:
    """``("sophgo" | "google" | "unknown", evidence)`` for an installed torch_tpu distribution, from metadata."""
    keys = ("Author", "Author-email", "Home-page", "Summary", "Maintainer", "Maintainer-email")
    text = " ".join(_field(dist, k) for k in keys) + " " + " ".join(dist.metadata.get_all("Project-URL") or [])
    low = text.lower()
    if "sophgo" in low:
        return "sophgo", "its metadata names Sophgo"
    requires = [r.split(";")[0].strip().lower() for r in dist.requires or ()]
    if "google" in low or any(r.startswith("libtpu") for r in requires):
        return "google", f"its metadata points to Google ({_field(dist, 'Home-page') or 'requires libtpu'})"
    return "unknown", "its metadata names neither Sophgo nor Google"


def _torch_tpu() -> Finding:
    dist = _distribution("torch_tpu", "torch-tpu")
    if dist is None:
        return Finding("packages", "torch_tpu", "info", "not installed")
    flavour, evidence = tpu_flavour(dist)
    facts = {"version": dist.version, "evidence": evidence}
    if flavour == "google":
        return Finding(
            "packages", "torch_tpu", "warn",
            f"torch_tpu {dist.version} is Google's TorchTPU (the PyPI package), not Sophgo's; the sophgo plugin "
            "cannot use it, and it autoloads into torch and takes the 'tpu' device",
            "for Sophgo TPUs: `pip uninstall torch-tpu`, then install Sophgo's torch-tpu wheel from Sophgo's "
            "release (github.com/sophgo/torch-tpu or its SDK image)",
            facts,
        )
    if flavour == "unknown":
        return Finding("packages", "torch_tpu", "warn", f"torch_tpu {dist.version}: cannot tell whose ({evidence})",
                       "the sophgo plugin checks after import (ProcessGroupSCCLOptions)", facts)
    return Finding("packages", "torch_tpu", "ok", f"Sophgo's torch_tpu {dist.version}", facts=facts)


# ----------------------------------------------------------------------------------------------------- plugins


def _plugins(registry: Any) -> list[Finding]:
    out = []
    for info in registry.infos().values():
        status: Status = "ok" if info.available else "info" if str(info.status) == "unavailable" else "warn"
        summary = str(info.status) + (f": {info.reason}" if info.reason else "")
        facts = {**info.facts, "target": info.target}
        if info.distribution:
            facts["distribution"] = info.distribution
        out.append(Finding("plugins", info.name, status, summary, info.fix, facts))
    if not out:
        out.append(Finding("plugins", "(none)", "fail", "no xccl plugin was found, not even cpu",
                           "reinstall xccl (`pip install --force-reinstall xccl`): its entry points are missing"))
    return out + _shared(registry)


def _shared(registry: Any) -> list[Finding]:
    """A warning per backend name two or more loaded plugins drive (Ascend's and Habana's ``hccl``), saying what
    that means (:func:`consequence`); not for a name one of xccl's own plugins drives (:func:`xccl_drives`)."""
    by_backend: dict[str, list[Any]] = {}
    for info in registry.infos().values():
        if info.plugin is not None:
            by_backend.setdefault(info.plugin.backend, []).append(info)
    out = []
    for backend, infos in sorted(by_backend.items()):
        if len(infos) < 2 or xccl_drives(infos):
            continue
        names = [i.name for i in infos]
        out.append(Finding(
            "plugins", f"backend {backend!r}", "warn", f"driven by {len(names)} plugins: {', '.join(names)}",
            consequence(backend, names) + "; or uninstall the plugins of vendors this machine does not have",
            {i.name: i.distribution or "?" for i in infos},
        ))
    return out


def xccl_drives(infos: Iterable[Any]) -> bool:
    """Whether one of ``infos`` (``PluginInfo`` objects) is xccl's own plugin, which adopts its backend's worlds
    whatever else drives the name (the rule of ``plugin_for``)."""
    from xccl.runtime._backend_check import is_builtin

    return any(is_builtin(i) for i in infos)


def consequence(backend: str, names: Sequence[str]) -> str:
    """What sharing ``backend`` among the plugins ``names`` means, and what settles it: one sentence (``xccl doctor``
    and ``xccl new-plugin`` warn with it)."""
    return (
        f"adopting a world created on {backend!r} (dist.init_process_group({backend!r}) then xccl.init()) picks the "
        "plugin whose SDK is importable here, and raises InitError naming them when none or several are; "
        f"xccl.init(vendor=...) settles it (e.g. vendor={names[0]!r}, or XCCL_VENDOR=<{'|'.join(names)}>)"
    )


def _selected(env: Mapping[str, str], vendor: str | None, registry: Any) -> tuple[str | None, Finding]:
    from xccl.errors import BackendUnavailable, XcclError

    sim = env.get("XCCL_SIMULATE", "").strip()
    name = vendor or env.get("XCCL_VENDOR", "").strip() or (sim if sim not in ("", "0", "false") else "") or "auto"
    try:
        if sim not in ("", "0", "false") and name in (sim, "auto"):
            plugin = registry.get(sim)
            if plugin.simulation() is None:
                raise BackendUnavailable(sim, "this plugin has no CPU simulation (XCCL_SIMULATE)", "unset XCCL_SIMULATE")
            return plugin.name, Finding("selected", plugin.name, "ok", f"simulated on CPU over gloo (XCCL_SIMULATE={sim})")
        plugin = registry.select(name)
    except XcclError as exc:
        fix = getattr(exc, "fix", "") or "see the plugins section above"
        reason = getattr(exc, "reason", "") or str(exc)  # BackendUnavailable's message repeats its fix
        return None, Finding("selected", name, "fail", f"xccl.init(vendor={name!r}) would fail: {reason}", fix)
    how = "named" if name != "auto" else "auto-selected"
    summary = f"{how}: {plugin.name} ({plugin.vendor}), backend {plugin.backend}, device {plugin.device_type}"
    return plugin.name, Finding("selected", plugin.name, "ok", summary)

