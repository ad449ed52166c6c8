"""``xccl doctor [--vendor NAME] [--json]``: what is wrong with this node, and how to fix it.

The first command to run on a broken node. It reports, section by section:

* **torch**: version and build (CUDA/ROCm/CPU, git commit, C++ ABI), which torch.distributed backends it has;
* **autoload**: device-backend extensions torch imports by itself (``[torch.backends]`` entry points). A bare
  ``import torch`` is tried in a child process with autoload on, because torch_npu installed without CANN makes
  it fail ("Failed to load the backend extension: torch_npu") and with it every script;
* **packages**: torch_npu (version, the torch it was built for, CANN variables) and torch_tpu (Sophgo's, or
  Google's TorchTPU from PyPI, told apart by package metadata), read from metadata without importing them;
* **plugins**: every xccl plugin found, available or not, with its probe's reason, fix and facts;
* **selected**: the plugin ``xccl.init`` would pick (``--vendor``, ``XCCL_VENDOR``/``XCCL_SIMULATE``, or auto);
* **devices**: the visible-devices variables (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``,
  ``TPU_VISIBLE_DEVICES``, ``CHIP_MAP``, and any a plugin declares), checked against their vendors' rules;
* **rank table**: ``RANK_TABLE_FILE`` found and valid (parsed by xccl, either format);
* **rendezvous**: the launcher's variables (torchrun, Open MPI) and xccl's own, as ``xccl.init`` reads them.

Exit status: 0 when the selected plugin can work here; 1 when it cannot, or when a check found something that
makes ``xccl.init`` fail (a bad variable, an invalid rank table, ``import torch`` failing). Warnings do not change
the status. Doctor never imports a vendor SDK: vendor knowledge comes from the plugins' probes and package metadata.

If ``xccl doctor`` itself dies in ``import torch`` with "Failed to load the backend extension", run it as
``TORCH_DEVICE_BACKEND_AUTOLOAD=0 xccl doctor``: it then says why and how to fix it for good.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Final, Literal, final

__all__ = ["Finding", "Report", "add_parser", "collect", "run"]

Status = Literal["ok", "info", "warn", "fail"]
_MARK: Final = {"ok": "ok  ", "info": "--  ", "warn": "WARN", "fail": "FAIL"}
_AUTOLOAD_ENV: Final = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_CANN_ENV: Final = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH")
_CANN_FIX: Final = (
    "source CANN's environment script (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`) in the shell "
    "that runs python; without an Ascend device and CANN, uninstall torch_npu; to import torch regardless, "
    f"`export {_AUTOLOAD_ENV}=0` (then `import torch_npu` explicitly where it is needed)"
)
_LAUNCHER_ENV: Final = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
)


@final
@dataclass(frozen=True, slots=True)
class Finding:
    """One check's result."""

    #: Section heading (``torch``, ``plugins``, ...).
    section: str
    #: What was checked (a package, a plugin, a variable).
    name: str
    #: ``ok``, ``info`` (nothing to judge), ``warn`` (works, but probably not as meant) or ``fail``.
    status: Status
    #: One sentence: what was found.
    summary: str
    #: What to do about it (empty when nothing is to be done).
    fix: str = ""
    #: Details (versions, paths, values).
    facts: Mapping[str, str] = field(default_factory=dict)


@final
@dataclass(frozen=True, slots=True)
class Report:
    """Every finding, and the plugin ``xccl.init`` would select (None when it cannot select one)."""

    findings: tuple[Finding, ...]
    selected: str | None

    @property
    def ok(self) -> bool:
        """Whether nothing failed (the exit status is 0)."""
        return not any(f.status == "fail" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "selected": self.selected,
            "findings": [{**asdict(f), "facts": dict(f.facts)} for f in self.findings],
        }


# --------------------------------------------------------------------------------------------------------- CLI


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="diagnose this node: torch, vendor packages, plugins, devices, rank table, rendezvous",
        description="Diagnose this node for xccl: torch and its autoloaded extensions, vendor packages, every "
        "plugin and why it is (not) available, the plugin xccl.init would select, visible-devices variables, the "
        "rank table and the rendezvous variables. Exit status 1 when the selected plugin cannot work here.",
    )
    p.add_argument("--vendor", help="the plugin to judge (default: XCCL_VENDOR / XCCL_SIMULATE, else auto)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 when the selected plugin can work, else 1."""
    report = collect(vendor=args.vendor)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    return 0 if report.ok else 1


def render(report: Report) -> str:
    """The report as text, one block per section."""
    lines: list[str] = []
    section = ""
    for f in report.findings:
        if f.section != section:
            section = f.section
            lines.append(f"\n{section}")
        lines.append(f"  {_MARK[f.status]}  {f.name}: {f.summary}")
        if f.fix:
            lines.append(f"        fix: {f.fix}")
        if f.facts:
            lines.append("        " + ", ".join(f"{k}={v}" for k, v in f.facts.items()))
    fails = [f for f in report.findings if f.status == "fail"]
    if fails:
        lines.append(f"\n{len(fails)} problem(s) stop xccl here: {', '.join(f'{f.section}/{f.name}' for f in fails)}")
    else:
        lines.append(f"\nxccl can run here with plugin {report.selected!r}")
    return "\n".join(lines).lstrip("\n")


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
    findings: list[Finding] = [_python(), *_torch(), *_autoload(env, try_import), *_packages(env)]
    findings += _plugins(reg)
    chosen, found = _selected(env, vendor, reg)
    findings.append(found)
    findings += _devices(env, reg, chosen)
    findings += _rank_table(env)
    findings += _rendezvous(env)
    return Report(tuple(findings), chosen)


# ---------------------------------------------------------------------------------------------- python, torch


def _python() -> Finding:
    return Finding(
        "python", "interpreter", "info", f"{platform.python_implementation()} {platform.python_version()}",
        facts={"executable": sys.executable, "platform": platform.platform()},
    )


def _torch() -> list[Finding]:
    import torch
    import torch.distributed as dist

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
    out = [Finding("torch", "torch", "ok", f"{torch.__version__} ({build} build)", facts=facts)]
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
    facts = {**names, _AUTOLOAD_ENV: "(unset: on)" if shim else env.get(_AUTOLOAD_ENV, "(unset: on)")}
    if not try_import:
        return [Finding("autoload", "import torch", "info", f"autoloaded extensions: {', '.join(names)}", facts=facts)]
    child = {k: v for k, v in env.items() if k not in (_AUTOLOAD_ENV, "XCCL_DOCTOR_AUTOLOAD_SET_BY_SHIM")}
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
            f"fix or uninstall the distribution that provides {culprit!r}, or `export {_AUTOLOAD_ENV}=0`",
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


def _packages(env: Mapping[str, str]) -> list[Finding]:
    return [_torch_npu(env), _torch_tpu()]


def _torch_npu(env: Mapping[str, str]) -> Finding:
    import torch

    dist = _distribution("torch_npu", "torch-npu")
    if dist is None:
        return Finding("packages", "torch_npu", "info", "not installed")
    facts = {"version": dist.version, **{k: env[k] for k in _CANN_ENV if k in env}}
    wanted = [r for r in dist.requires or () if re.match(r"torch\s*[(=<>!~]", r)]
    facts["requires"] = "; ".join(wanted) or "(no torch pin)"
    mismatch = [r for r in wanted if not _satisfies(torch.__version__, r)]
    if mismatch:
        return Finding(
            "packages", "torch_npu", "fail",
            f"torch_npu {dist.version} was built for {mismatch[0]}, but torch is {torch.__version__}",
            f"install the torch_npu release made for torch {torch.__version__.split('+')[0]}, or the torch it pins "
            "(`pip install 'torch==<that version>'`)",
            facts,
        )
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
    return out


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


# ----------------------------------------------------------------------------------------------------- devices


def _devices(env: Mapping[str, str], registry: Any, chosen: str | None) -> list[Finding]:
    owners: dict[str, list[str]] = {
        "CUDA_VISIBLE_DEVICES": [], "ASCEND_RT_VISIBLE_DEVICES": [], "TPU_VISIBLE_DEVICES": [], "CHIP_MAP": [],
    }
    for info in registry.infos().values():
        var = getattr(info.plugin, "visible_devices_env", None) if info.plugin is not None else None
        if var:
            owners.setdefault(var, []).append(info.name)
    checks: dict[str, Callable[[str], tuple[Status, str, str]]] = {
        "CUDA_VISIBLE_DEVICES": _cuda_visible,
        "ASCEND_RT_VISIBLE_DEVICES": _ascend_visible,
        "TPU_VISIBLE_DEVICES": _tpu_visible,
        "CHIP_MAP": _chip_map,
    }
    out = []
    for var, plugins in owners.items():
        raw = env.get(var)
        if raw is None:
            out.append(Finding("devices", var, "info", _UNSET.get(var, "unset (every device visible)")))
            continue
        status, summary, fix = checks.get(var, _generic_visible)(raw)
        # A bad value is fatal only for the vendor that reads it, and only when that vendor is selected.
        if status == "fail" and chosen not in plugins and not (var == "CHIP_MAP" and chosen == "sophgo"):
            status = "warn"
        out.append(Finding("devices", var, status, f"{raw!r}: {summary}", fix))
    return out


_UNSET: Final = {
    "TPU_VISIBLE_DEVICES": "unset",
    "CHIP_MAP": "unset (Sophgo: local rank i uses chip i, or the rank table's map)",
}


def _cuda_visible(raw: str) -> tuple[Status, str, str]:
    items = [s.strip() for s in raw.split(",")] if raw.strip() else []
    if not items or items[0] in ("-1", ""):
        return "fail", "no GPU is visible", "unset it, or list GPU indices (CUDA_VISIBLE_DEVICES=0,1)"
    if any(not (s.isdigit() or s.startswith(("GPU-", "MIG-"))) for s in items):
        return "warn", "CUDA stops at the first entry that is neither an index nor a GPU-/MIG- UUID", ""
    return "ok", f"{len(items)} GPU(s) visible", ""


def _ascend_visible(raw: str) -> tuple[Status, str, str]:
    # torch_npu's parser (npu/__init__.py _parse_visible_devices): stops at the first character that is not a
    # digit or a comma; IDs must be ascending, otherwise it counts 0 devices; an empty value means 0 devices.
    kept = re.match(r"[0-9,]*", raw)
    prefix = kept.group(0) if kept else ""
    ids = [int(s) for s in prefix.split(",") if s]
    fix = "list ascending device IDs separated by commas, nothing else (ASCEND_RT_VISIBLE_DEVICES=0,1,2,3)"
    if not ids:
        return "fail", "torch_npu sees 0 devices (empty)", fix
    if ids != sorted(set(ids)):
        return "fail", f"IDs {ids} are not strictly ascending: torch_npu then sees 0 devices", fix
    if prefix != raw:
        return "warn", f"parsing stops at {raw[len(prefix):]!r}: only {ids} are used", fix
    return "ok", f"{len(ids)} NPU(s) visible, renumbered 0..{len(ids) - 1}", ""


def _tpu_visible(raw: str) -> tuple[Status, str, str]:
    return (
        "warn",
        "Sophgo's runtime does not read it, and DeepSpeed's TPU adaptor fails with it set (TypeError on a map)",
        "unset it; choose Sophgo chips with CHIP_MAP (local rank -> chip) instead",
    )


def _chip_map(raw: str) -> tuple[Status, str, str]:
    fix = "comma-separated distinct chip IDs, one per local rank, in C2C ring order (e.g. CHIP_MAP=0,2,6,7,3,1,5,4)"
    try:
        chips = [int(s) for s in raw.split(",")]
    except ValueError:
        return "fail", "not a comma-separated list of integers", fix
    if len(set(chips)) != len(chips) or any(c < 0 for c in chips):
        return "fail", f"{chips} repeats a chip or has a negative one", fix
    return "ok", f"local rank i uses chip {chips}[i]", ""


def _generic_visible(raw: str) -> tuple[Status, str, str]:
    return "info", "set", ""


# -------------------------------------------------------------------------------------------------- rank table


def _rank_table(env: Mapping[str, str]) -> list[Finding]:
    from xccl.errors import RankTableError
    from xccl.plugin import load_rank_table

    from .ranktable import installed_formats

    path = env.get("RANK_TABLE_FILE")
    if not path:
        return [Finding("rank table", "RANK_TABLE_FILE", "info", "unset (rank tables are optional)")]
    formats = installed_formats()
    try:
        fmt, table = load_rank_table(path, formats)
    except RankTableError as exc:
        generators = [f"`xccl rank-table {f.name} ...`" for f in formats if f.can_generate]
        return [Finding(
            "rank table", "RANK_TABLE_FILE", "fail", f"{path} is not a valid rank table: {exc.field}: {exc.problem}",
            "fix the file (`xccl rank-table validate FILE` says what is wrong), "
            + (f"or generate one with {' or '.join(generators)}, " if generators else "")
            + "or unset RANK_TABLE_FILE",
        )]
    kind = fmt.name
    size = table.world_size()
    facts = {"format": kind, "world_size": str(size), "version": str(getattr(table, "version", "?"))}
    world = env.get("WORLD_SIZE")
    if world and world.strip().isdigit() and int(world) != size:
        return [Finding(
            "rank table", "RANK_TABLE_FILE", "fail", f"{path} has {size} ranks but WORLD_SIZE={world}",
            "generate the table for this job's ranks, or fix WORLD_SIZE", facts,
        )]
    return [Finding("rank table", "RANK_TABLE_FILE", "ok", f"{path}: a valid {kind} rank table of {size} ranks",
                    facts=facts)]


# -------------------------------------------------------------------------------------------------- rendezvous


def _rendezvous(env: Mapping[str, str]) -> list[Finding]:
    present = {k: env[k] for k in _LAUNCHER_ENV if k in env}
    out: list[Finding] = []
    if not present:
        out.append(Finding("rendezvous", "launcher", "info",
                           "no launcher variables: xccl.init() makes a world of one (run under torchrun for more)"))
    else:
        out.append(Finding("rendezvous", "launcher", "info", "variables set", facts=present))
    out += _ranks(env)
    out += _master(env)
    out += _xccl_vars(env)
    return out


def _int(env: Mapping[str, str], name: str) -> int | str | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


def _ranks(env: Mapping[str, str]) -> list[Finding]:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    bad = [f"{n}={v!r}" for n, v in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", _int(env, "LOCAL_RANK")))
           if isinstance(v, str)]
    if bad:
        return [Finding("rendezvous", "ranks", "fail", f"{', '.join(bad)}: not an integer", "fix or unset it")]
    if rank is None and size is None:
        return []
    if not isinstance(rank, int) or not isinstance(size, int):
        return [Finding("rendezvous", "ranks", "fail", f"RANK={rank} WORLD_SIZE={size}: xccl.init needs both",
                        "run under torchrun, or set both")]
    if size < 1 or not 0 <= rank < size:
        return [Finding("rendezvous", "ranks", "fail", f"RANK={rank} is not in [0, WORLD_SIZE={size})",
                        "fix RANK / WORLD_SIZE (the launcher sets them)")]
    return [Finding("rendezvous", "ranks", "ok", f"rank {rank} of {size}")]


def _master(env: Mapping[str, str]) -> list[Finding]:
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    size = _int(env, "WORLD_SIZE")
    if not addr and not port:
        if isinstance(size, int) and size > 1:
            return [Finding("rendezvous", "MASTER_ADDR/PORT", "fail", "unset, but WORLD_SIZE > 1",
                            "export MASTER_ADDR and MASTER_PORT (torchrun does), or pass init_method to xccl.init")]
        return []
    out = []
    if not port.isdigit() or not 0 < int(port) < 65536:
        out.append(Finding("rendezvous", "MASTER_PORT", "fail", f"{port!r} is not a TCP port", "use 1..65535"))
    else:
        out.append(Finding("rendezvous", "MASTER_PORT", "ok", port))
    if not addr:
        out.append(Finding("rendezvous", "MASTER_ADDR", "fail", "unset while MASTER_PORT is set",
                           "export MASTER_ADDR=<rank 0's host>"))
    else:
        resolved = _resolve(addr)
        if resolved is None:
            out.append(Finding("rendezvous", "MASTER_ADDR", "fail", f"{addr!r} does not resolve from this host",
                               "use rank 0's IP address or a name this host resolves"))
        else:
            out.append(Finding("rendezvous", "MASTER_ADDR", "ok", f"{addr} -> {resolved}"))
    return out


def _resolve(host: str, timeout: float = 3.0) -> str | None:
    """The first address ``host`` resolves to, or None (bounded: a dead resolver must not hang doctor)."""
    result: list[str | None] = [None]

    def work() -> None:
        try:
            result[0] = str(socket.getaddrinfo(host, None)[0][4][0])
        except OSError:
            result[0] = None

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0]


def _xccl_vars(env: Mapping[str, str]) -> list[Finding]:
    out = []
    raw = env.get("XCCL_TIMEOUT")
    if raw is not None:
        try:
            ok = float(raw) > 0
        except ValueError:
            ok = False
        out.append(Finding("rendezvous", "XCCL_TIMEOUT", "ok" if ok else "fail",
                           f"{raw!r}" + (" seconds" if ok else " is not a positive number of seconds"),
                           "" if ok else "set seconds, e.g. XCCL_TIMEOUT=600"))
    check = env.get("XCCL_CHECK")
    if check is not None:
        on = check.strip() not in ("", "0", "false")
        out.append(Finding("rendezvous", "XCCL_CHECK", "info",
                           "mismatch detector on (each collective pays two store round trips)" if on else "off"))
    return out
