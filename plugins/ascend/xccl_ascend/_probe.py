"""What an Ascend host has, found without importing torch_npu.

Importing torch_npu on a host without CANN fails, and worse: once the torch_npu wheel is installed, a bare
``import torch`` imports it too (torch's device-backend autoload, manifest gotcha 1), so a probe that imported it
would turn "CANN is missing" into a crash. Everything here reads package metadata, environment variables and the
file system instead, in this order, stopping at the first thing missing:

1. torch_npu is installed (its distribution metadata, or a ``torch_npu`` package on the path);
2. its version matches the installed torch (torch_npu pins ``torch==X.Y.*``) and torch is a CPU build;
3. CANN's ``libascendcl.so`` and ``libhccl.so`` are where the loader looks (``LD_LIBRARY_PATH``), which is what
   sourcing CANN's ``set_env.sh`` arranges;
4. NPUs exist (``/dev/davinci<N>``) and ``ASCEND_RT_VISIBLE_DEVICES`` leaves some visible;
5. ``RANK_TABLE_FILE``, when set, is a valid HCCL rank table.

Each failure says what is missing and how to fix it. The module uses the standard library only (plus xccl's
rank-table reader, itself standard-library only), so tests can run it against fake installations: a directory
holding a ``torch_npu-X.dist-info`` is a real distribution as far as :mod:`importlib.metadata` is concerned.
"""

from __future__ import annotations

import importlib.machinery
import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Final, final

__all__ = [
    "DEFAULT_TOOLKIT",
    "CannInstall",
    "HostReport",
    "find_cann",
    "parse_visible_devices",
    "physical_devices",
    "probe_host",
]

#: Where CANN's installer puts the toolkit by default (``set_env.sh`` sits one level up).
DEFAULT_TOOLKIT: Final = "/usr/local/Ascend/ascend-toolkit/latest"
#: The two CANN libraries torch_npu links against: the runtime and the collective library.
CANN_LIBS: Final = ("libascendcl.so", "libhccl.so")
#: torch_npu counts at most this many devices when ``ASCEND_RT_VISIBLE_DEVICES`` is unset.
MAX_DEVICES: Final = 64

_AUTOLOAD_HINT: Final = (
    "until then `import torch` fails, because torch auto-loads the installed torch_npu: set "
    "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to import torch meanwhile (or `pip uninstall torch_npu`); to run without an "
    "NPU, simulate Ascend on CPU with XCCL_SIMULATE=ascend"
)
_SIMULATE_HINT: Final = "or simulate Ascend on CPU with XCCL_SIMULATE=ascend"


@final
@dataclass(frozen=True, slots=True)
class HostReport:
    """The probe's verdict: available, or why not and what to do; plus what it found."""

    available: bool
    reason: str = ""
    fix: str = ""
    #: Versions, paths and device counts, for ``xccl doctor``.
    facts: Mapping[str, str] = field(default_factory=dict)


@final
@dataclass(frozen=True, slots=True)
class CannInstall:
    """Where CANN's libraries were found."""

    #: Library name -> directory it was found in, among the directories the loader searches.
    on_loader_path: Mapping[str, str]
    #: Library name -> directory it was found in under a CANN home (found or not on the loader path).
    in_home: Mapping[str, str]
    #: The CANN home that holds them (``ASCEND_HOME_PATH``, ``ASCEND_TOOLKIT_HOME`` or the default), if any.
    home: str | None
    #: The toolkit version from ``ascend_toolkit_install.info``, when readable (e.g. ``"8.0.RC2"``).
    version: str | None

    @property
    def loadable(self) -> bool:
        """Whether both libraries are where the dynamic loader looks."""
        return all(lib in self.on_loader_path for lib in CANN_LIBS)

    def set_env_script(self) -> str:
        """The script that puts this CANN on the loader path (``<toolkit>/set_env.sh``)."""
        home = Path(self.home or DEFAULT_TOOLKIT)
        for candidate in (home.parent / "set_env.sh", home / "set_env.sh", home / "bin" / "setenv.bash"):
            if candidate.is_file():
                return str(candidate)
        return str(home.parent / "set_env.sh")


def probe_host(
    env: Mapping[str, str] | None = None,
    *,
    dev_dir: str = "/dev",
    path: Sequence[str] | None = None,
) -> HostReport:
    """Check everything Ascend needs, cheaply and without importing torch_npu or torch.

    Args:
        env: the environment to read (default ``os.environ``).
        dev_dir: where device nodes live (a test seam; ``/dev`` on a real host).
        path: where to look for installed distributions and packages (default ``sys.path``).

    Returns:
        The verdict with its reason and fix, and the facts found on the way.
    """
    env = os.environ if env is None else env
    facts: dict[str, str] = {}
    npu = _distribution("torch_npu", path)
    if npu is None and importlib.machinery.PathFinder.find_spec("torch_npu", list(path) if path else None) is None:
        return HostReport(
            False,
            "torch_npu is not installed",
            "on an Ascend host with CANN, `pip install xccl-ascend[npu]` (or the torch_npu release matching your "
            f"torch); {_SIMULATE_HINT}",
            facts,
        )
    npu_version = npu.version if npu is not None else "unknown (no distribution metadata)"
    facts["torch_npu"] = npu_version
    facts["all_to_all_vc"] = all_to_all_vc_fact(path)
    torch_dist = _distribution("torch", path)
    if torch_dist is not None:
        facts["torch"] = torch_dist.version
        mismatch = _torch_mismatch(npu, torch_dist.version)
        if mismatch is not None:
            return HostReport(False, mismatch[0], mismatch[1], facts)
    facts["autoload"] = env.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "unset (torch imports torch_npu)")
    cann = find_cann(env)
    if cann.home is not None:
        facts["cann_home"] = cann.home
    if cann.version is not None:
        facts["cann_version"] = cann.version
    problem = _cann_problem(cann, npu_version)
    if problem is not None:
        return HostReport(False, problem[0], problem[1], facts)
    physical = physical_devices(dev_dir)
    visible_env = env.get("ASCEND_RT_VISIBLE_DEVICES")
    visible = parse_visible_devices(visible_env, physical)
    facts["devices"] = f"{physical} physical, {len(visible)} visible ({','.join(map(str, visible)) or 'none'})"
    truncated = _truncation(visible_env)
    if truncated:
        facts["visible_devices_note"] = truncated
    problem = _device_problem(physical, visible_env, visible, dev_dir)
    if problem is not None:
        return HostReport(False, problem[0], problem[1], facts)
    table = env.get("RANK_TABLE_FILE")
    if table:
        problem = _rank_table_problem(table)
        if problem is not None:
            return HostReport(False, problem[0], problem[1], facts)
        facts["rank_table"] = table
    return HostReport(True, facts=facts)


# ---------------------------------------------------------------------------------------------------- torch_npu


def all_to_all_vc_fact(path: Sequence[str] | None = None) -> str:
    """Whether the installed torch_npu exports ``all_to_all_vc``, read from its source without importing it.

    What ``xccl doctor`` says before any process runs; the runtime decides with ``hasattr`` on the imported
    module (``NpuSdk.has_all_to_all_vc``), and the two read the same ``torch_npu/distributed/__init__.py``.
    """
    spec = importlib.machinery.PathFinder.find_spec("torch_npu", list(path) if path else None)
    places = [] if spec is None or spec.submodule_search_locations is None else list(spec.submodule_search_locations)
    for place in places:
        try:
            text = (Path(place) / "distributed" / "__init__.py").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if re.search(r"\ball_to_all_vc\b", text):
            return "exported: all_to_all_v runs natively through it"
        return "not exported (as in torch_npu 2.13.0): all_to_all_v runs as all_to_all_single with split sizes"
    return "unknown (torch_npu/distributed/__init__.py not found): xccl.init probes it"


def _distribution(name: str, path: Sequence[str] | None) -> metadata.Distribution | None:
    """The installed distribution called ``name`` (``-``/``_`` and case insensitive), or None."""
    kwargs = {"name": name} if path is None else {"name": name, "path": list(path)}
    return next(iter(metadata.distributions(**kwargs)), None)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a PEP 440 version: ``"2.13.0+cpu"`` -> ``(2, 13, 0)``."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def _torch_pin(npu: metadata.Distribution | None) -> str | None:
    """torch_npu's requirement on torch, e.g. ``"==2.13.0.*"``, from its ``Requires-Dist``."""
    for req in (npu.requires or []) if npu is not None else []:
        match = re.match(r"\s*torch\s*\(?\s*([<>=!~][^;)]*)\)?\s*(?:;|$)", req)
        if match:
            return match.group(1).replace(" ", "")
    return None


def _pin_admits(pin: str, version: str) -> bool:
    """Whether ``version`` satisfies the ``==X.Y.Z.*``/``==X.Y.Z`` pins torch_npu uses (others: X.Y must match)."""
    have = _release(version)
    for clause in pin.split(","):
        op_match = re.match(r"(==|>=|<=|~=|!=|<|>)(.*)", clause)
        if op_match is None:
            continue
        op, want_text = op_match.groups()
        want = _release(want_text)
        if op == "==" and want_text.endswith(".*"):
            ok = have[: len(want)] == want
        elif op == "==":
            ok = have + (0,) * (len(want) - len(have)) == want + (0,) * (len(have) - len(want))
        elif op == ">=":
            ok = have >= want
        elif op == "<":
            ok = have < want
        else:  # the rest never appear in torch_npu's pins; judge by the release line instead
            ok = have[:2] == want[:2]
        if not ok:
            return False
    return True


def _torch_mismatch(npu: metadata.Distribution | None, torch_version: str) -> tuple[str, str] | None:
    """Reason and fix when torch_npu cannot work with the installed torch, else None."""
    local = torch_version.partition("+")[2]
    if local.startswith(("cu", "rocm")):
        return (
            f"torch {torch_version} is a {local} build, but torch_npu needs the CPU build of torch (with a CUDA "
            "torch it raises 'Two accelerators cannot be used at the same time')",
            f"install the CPU wheel of torch {'.'.join(map(str, _release(torch_version)[:2]))} in this environment",
        )
    if npu is None:
        return None
    pin = _torch_pin(npu)
    npu_line = ".".join(map(str, _release(npu.version)[:2]))
    torch_line = ".".join(map(str, _release(torch_version)[:2]))
    ok = _pin_admits(pin, torch_version) if pin else npu_line == torch_line
    if ok:
        return None
    wanted = f"torch{pin}" if pin else f"torch {npu_line}.*"
    return (
        f"torch_npu {npu.version} requires {wanted}, but torch {torch_version} is installed "
        "(each torch_npu release is built for one torch release)",
        f"install the torch_npu release for torch {torch_line} (`pip install 'torch_npu=={torch_line}.*'`), "
        f"or the torch it was built for (`pip install '{wanted}'`)",
    )


# --------------------------------------------------------------------------------------------------------- CANN


def _lib_dirs(home: str) -> list[str]:
    machine = os.uname().machine if hasattr(os, "uname") else "x86_64"
    return [os.path.join(home, "lib64"), os.path.join(home, "lib"), os.path.join(home, f"{machine}-linux", "lib64")]


def _find_libs(dirs: Iterable[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for d in dirs:
        for lib in CANN_LIBS:
            if lib not in found and d and os.path.isfile(os.path.join(d, lib)):
                found[lib] = d
    return found


def _cann_version(home: str) -> str | None:
    machine = os.uname().machine if hasattr(os, "uname") else "x86_64"
    for info in (Path(home, "ascend_toolkit_install.info"), Path(home, f"{machine}-linux", "ascend_toolkit_install.info")):
        try:
            text = info.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(r"^\s*version\s*=\s*(\S+)", text, re.MULTILINE)
        if match:
            return match.group(1)
    return None


def find_cann(env: Mapping[str, str] | None = None) -> CannInstall:
    """Look for ``libascendcl.so`` and ``libhccl.so`` where the loader looks and where CANN is installed.

    The loader's path is ``LD_LIBRARY_PATH`` (what CANN's ``set_env.sh`` extends). CANN homes are
    ``ASCEND_HOME_PATH``, ``ASCEND_TOOLKIT_HOME`` and the default ``/usr/local/Ascend/ascend-toolkit/latest``;
    each is searched in ``lib64``, ``lib`` and ``<arch>-linux/lib64``.

    Args:
        env: the environment to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
    loader_dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    on_path = _find_libs(loader_dirs)
    homes = [h for h in (env.get("ASCEND_HOME_PATH"), env.get("ASCEND_TOOLKIT_HOME"), DEFAULT_TOOLKIT) if h]
    in_home: dict[str, str] = {}
    home = None
    for candidate in dict.fromkeys(homes):  # ordered, without duplicates
        found = _find_libs(_lib_dirs(candidate))
        if found and len(found) >= len(in_home):
            in_home, home = found, candidate
        if len(found) == len(CANN_LIBS):
            break
    if home is None and on_path:
        # Libraries on the path without a home variable: by CANN's layout the home is the parent of lib64.
        home = str(Path(next(iter(on_path.values()))).parent)
    version = _cann_version(home) if home is not None else None
    return CannInstall(on_path, in_home, home, version)


def _cann_problem(cann: CannInstall, npu_version: str) -> tuple[str, str] | None:
    if cann.loadable:
        return None
    missing = [lib for lib in CANN_LIBS if lib not in cann.on_loader_path]
    install = (
        f"install the CANN toolkit that matches torch_npu {npu_version} (see Ascend's torch_npu/CANN version "
        f"table), then `source {DEFAULT_TOOLKIT.rsplit('/', 1)[0]}/set_env.sh`; {_AUTOLOAD_HINT}"
    )
    if cann.in_home and all(lib in cann.in_home for lib in missing):
        script = cann.set_env_script()
        return (
            f"torch_npu is installed and CANN is at {cann.home}, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on LD_LIBRARY_PATH: CANN's environment is not set in "
            "this shell",
            f"`source {script}` before starting Python (add it to the job script); {_AUTOLOAD_HINT}",
        )
    if cann.in_home or cann.on_loader_path:
        where = cann.home or ", ".join(sorted(set(cann.on_loader_path.values())))
        return (
            f"torch_npu is installed and CANN was found at {where}, but it lacks {' and '.join(missing)}: the "
            "installation is incomplete (the HCCL or runtime component is missing)",
            f"reinstall the full CANN toolkit; {install}",
        )
    return (
        f"torch_npu {npu_version} is installed but CANN is not: {' and '.join(CANN_LIBS)} were not found in "
        "LD_LIBRARY_PATH, ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME or " + DEFAULT_TOOLKIT,
        install,
    )


# ------------------------------------------------------------------------------------------------------ devices


def physical_devices(dev_dir: str = "/dev") -> int:
    """How many NPUs the driver exposes: the ``davinci<N>`` device nodes under ``dev_dir``."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return 0
    return sum(1 for n in names if re.fullmatch(r"davinci\d+", n))


def parse_visible_devices(value: str | None, physical: int | None = None) -> tuple[int, ...]:
    """The device IDs ``ASCEND_RT_VISIBLE_DEVICES`` leaves visible, by torch_npu's parsing rules.

    The visible devices are renumbered 0..n-1 in this order, so a process then passes the *index*, not the ID.

    * unset: every device (at most 64);
    * an empty string: none;
    * parsing stops at the first character that is neither a digit nor a comma (``"0,1 ,2"`` is ``0,1``);
    * IDs must be strictly ascending, otherwise no device is visible (``"1,0"`` is none);
    * IDs the host does not have (>= ``physical``) are dropped.

    Args:
        value: the variable's value, or None when unset.
        physical: devices the host has; None means unknown (no ID is dropped below 64).
    """
    limit = MAX_DEVICES if physical is None else min(physical, MAX_DEVICES)
    if value is None:
        return tuple(range(limit))
    prefix = re.match(r"[0-9,]*", value)
    ids = [int(p) for p in (prefix.group() if prefix else "").split(",") if p]
    if any(b <= a for a, b in itertools.pairwise(ids)):
        return ()
    return tuple(i for i in ids if i < limit)


def _device_problem(
    physical: int, value: str | None, visible: tuple[int, ...], dev_dir: str
) -> tuple[str, str] | None:
    if physical == 0:
        return (
            f"no Ascend NPU on this host: there are no {dev_dir}/davinci<N> device nodes",
            "run on an Atlas host whose NPU driver is installed (`npu-smi info` lists the NPUs); in a container, "
            "pass the /dev/davinci<N>, /dev/davinci_manager, /dev/devmm_svm and /dev/hisi_hdc devices through; "
            + _SIMULATE_HINT,
        )
    if visible:
        return None
    why = _visible_explanation(value, physical)
    return (
        f"ASCEND_RT_VISIBLE_DEVICES={value!r} leaves none of the {physical} NPUs visible: {why}",
        f"unset ASCEND_RT_VISIBLE_DEVICES, or list device IDs in ascending order with commas only, e.g. "
        f"'{','.join(map(str, range(min(physical, 2))))}'",
    )


def _visible_explanation(value: str | None, physical: int) -> str:
    text = value or ""
    if text == "":
        return "an empty value hides every device"
    prefix = re.match(r"[0-9,]*", text)
    kept = prefix.group() if prefix else ""
    if kept != text and not kept.strip(","):
        return f"parsing stops at {text[len(kept)]!r}, the first character that is not a digit or a comma"
    ids = [int(p) for p in kept.split(",") if p]
    if any(b <= a for a, b in itertools.pairwise(ids)):
        return "the IDs are not in strictly ascending order, which makes the device count 0"
    return f"the IDs {ids} are not among the host's devices 0..{physical - 1}"


def _truncation(value: str | None) -> str:
    """A warning when ``ASCEND_RT_VISIBLE_DEVICES`` has characters that silently end its parsing."""
    if not value:
        return ""
    prefix = re.match(r"[0-9,]*", value)
    kept = prefix.group() if prefix else ""
    if kept == value:
        return ""
    return f"ASCEND_RT_VISIBLE_DEVICES={value!r} is read as {kept!r}: parsing stops at {value[len(kept)]!r}"


def _rank_table_problem(path: str) -> tuple[str, str] | None:
    # Only when RANK_TABLE_FILE is set: the probe module itself stays free of xccl.plugin (and torch).
    from xccl.plugin import RankTableError

    from ._ranktable import load_hccl

    try:
        load_hccl(path)
    except RankTableError as exc:
        return (
            f"RANK_TABLE_FILE={path} is not a valid HCCL rank table: {exc.field}: {exc.problem}",
            f"fix the file (check it with `xccl rank-table validate {path}`), or unset RANK_TABLE_FILE to let "
            "HCCL exchange addresses through the store",
        )
    return None
