"""The probe against real (fake-installed) distributions, CANN trees and device nodes built in a temp dir.

A directory with ``torch_npu-X.dist-info/METADATA`` is an installed distribution as far as
``importlib.metadata`` is concerned; the fake's package raises what the real one raises without CANN, and its
``[torch.backends]`` entry point makes ``import torch`` fail exactly as gotcha 1 describes, so these tests also
prove that the probe never imports torch_npu.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from xccl_ascend import find_cann, parse_visible_devices, probe_host

#: The torch_npu release paired with the installed torch (each torch_npu X.Y.Z pins torch==X.Y.Z.*), and its pin.
NPU = ".".join(torch.__version__.split("+")[0].split(".")[:3])
PIN = f"torch=={NPU}.*"
MINOR = NPU.rsplit(".", 1)[0]

TORCH_NPU_FAILS = (
    "raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n"
)


def fake_dist(site: Path, name: str, version: str, requires: tuple[str, ...] = (), autoload: bool = False) -> Path:
    """Install a distribution's metadata (and for torch_npu a package that fails like the real one) in ``site``."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")
    if autoload:
        (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    if name == "torch_npu":
        (site / "torch_npu").mkdir()
        (site / "torch_npu" / "__init__.py").write_text(TORCH_NPU_FAILS)
    return site


def cann_tree(root: Path, libs: tuple[str, ...] = ("libascendcl.so", "libhccl.so"), version: str = "8.0.RC2") -> Path:
    """A CANN toolkit layout: ``<root>/ascend-toolkit/latest/lib64/<libs>``, ``set_env.sh``, version info."""
    home = root / "ascend-toolkit" / "latest"
    (home / "lib64").mkdir(parents=True)
    for lib in libs:
        (home / "lib64" / lib).write_bytes(b"")
    (root / "ascend-toolkit" / "set_env.sh").write_text("export LD_LIBRARY_PATH=...\n")
    (home / "ascend_toolkit_install.info").write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\n")
    return home


def dev_nodes(root: Path, n: int) -> Path:
    dev = root / "dev"
    dev.mkdir()
    for i in range(n):
        (dev / f"davinci{i}").write_bytes(b"")
    (dev / "davinci_manager").write_bytes(b"")
    return dev


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return fake_dist(tmp_path / "site", "torch_npu", NPU, (PIN, "pyyaml"))


def probe(site: Path, env: dict[str, str], dev: Path | None = None, first: Path | None = None):  # type: ignore[no-untyped-def]
    path = [str(p) for p in (first, site) if p is not None] + sys.path
    return probe_host(env, dev_dir=str(dev or site / "nodev"), path=path)


# ------------------------------------------------------------------------------------------ torch_npu and torch


def test_torch_npu_absent(tmp_path: Path) -> None:
    report = probe_host({}, dev_dir=str(tmp_path), path=[str(tmp_path), *sys.path])
    assert not report.available
    assert report.reason == "torch_npu is not installed"
    assert "xccl-ascend[npu]" in report.fix and "XCCL_SIMULATE=ascend" in report.fix


def test_present_without_cann(site: Path) -> None:
    report = probe(site, {})
    assert not report.available
    assert report.reason.startswith(f"torch_npu {NPU} is installed but CANN is not")
    assert "libascendcl.so and libhccl.so" in report.reason
    assert "set_env.sh" in report.fix and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in report.fix
    assert report.facts["torch_npu"] == NPU


def test_version_mismatch_by_pin(tmp_path: Path) -> None:
    site = fake_dist(tmp_path / "site", "torch_npu", "2.1.0.post8", ("torch==2.1.0.*",))
    report = probe(site, {})
    assert not report.available
    assert f"torch_npu 2.1.0.post8 requires torch==2.1.0.*, but torch {MINOR}" in report.reason
    assert f"torch_npu=={MINOR}.*" in report.fix


def test_version_mismatch_without_pin(tmp_path: Path) -> None:
    site = fake_dist(tmp_path / "site", "torch_npu", "2.5.1")
    report = probe(site, {})
    assert not report.available and "requires torch 2.5.*" in report.reason


def test_cuda_torch_is_refused(site: Path, tmp_path: Path) -> None:
    cuda = fake_dist(tmp_path / "cuda", "torch", f"{NPU}+cu126")
    report = probe(site, {}, first=cuda)
    assert not report.available
    assert "cu126 build" in report.reason and "Two accelerators" in report.reason


# ----------------------------------------------------------------------------------------------------- CANN


def test_cann_installed_but_not_sourced(site: Path, tmp_path: Path) -> None:
    home = cann_tree(tmp_path / "Ascend")
    report = probe(site, {"ASCEND_HOME_PATH": str(home)})
    assert not report.available
    assert "not on LD_LIBRARY_PATH" in report.reason and str(home) in report.reason
    assert f"source {home.parent / 'set_env.sh'}" in report.fix


def test_cann_without_hccl(site: Path, tmp_path: Path) -> None:
    home = cann_tree(tmp_path / "Ascend", libs=("libascendcl.so",))
    report = probe(site, {"ASCEND_TOOLKIT_HOME": str(home), "LD_LIBRARY_PATH": str(home / "lib64")})
    assert not report.available
    assert "lacks libhccl.so" in report.reason and "reinstall the full CANN toolkit" in report.fix


def test_find_cann_reads_version_and_home(tmp_path: Path) -> None:
    home = cann_tree(tmp_path / "Ascend", version="8.1.RC1")
    cann = find_cann({"LD_LIBRARY_PATH": f"/nonexistent:{home / 'lib64'}", "ASCEND_HOME_PATH": str(home)})
    assert cann.loadable and cann.home == str(home) and cann.version == "8.1.RC1"
    assert cann.set_env_script() == str(home.parent / "set_env.sh")


# -------------------------------------------------------------------------------------------------- devices


def sourced(home: Path) -> dict[str, str]:
    return {"ASCEND_HOME_PATH": str(home), "LD_LIBRARY_PATH": str(home / "lib64")}


def test_no_device_nodes(site: Path, tmp_path: Path) -> None:
    report = probe(site, sourced(cann_tree(tmp_path / "Ascend")), dev=tmp_path)
    assert not report.available and "no Ascend NPU on this host" in report.reason
    assert "/dev/davinci_manager" in report.fix


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "an empty value hides every device"),
        ("1,0", "not in strictly ascending order"),
        ("x0,1", "parsing stops at 'x'"),
        ("9", "not among the host's devices 0..7"),
    ],
    ids=["empty", "descending", "stray-char", "absent-id"],
)
def test_visible_devices_hide_everything(site: Path, tmp_path: Path, value: str, why: str) -> None:
    env = sourced(cann_tree(tmp_path / "Ascend")) | {"ASCEND_RT_VISIBLE_DEVICES": value}
    report = probe(site, env, dev=dev_nodes(tmp_path, 8))
    assert not report.available
    assert f"ASCEND_RT_VISIBLE_DEVICES={value!r} leaves none of the 8 NPUs visible" in report.reason
    assert why in report.reason


def test_available_with_facts(site: Path, tmp_path: Path) -> None:
    env = sourced(cann_tree(tmp_path / "Ascend")) | {"ASCEND_RT_VISIBLE_DEVICES": "0,1 ,2"}
    report = probe(site, env, dev=dev_nodes(tmp_path, 8))
    assert report.available, report.reason
    assert report.facts["devices"] == "8 physical, 2 visible (0,1)"
    assert "parsing stops at ' '" in report.facts["visible_devices_note"]
    assert report.facts["cann_version"] == "8.0.RC2"


def test_invalid_rank_table_is_reported(site: Path, tmp_path: Path) -> None:
    table = tmp_path / "rank_table.json"
    table.write_text(json.dumps({"version": "1.0", "server_list": [{"server_id": "a", "device": [{"device_id": 0}]}]}))
    env = sourced(cann_tree(tmp_path / "Ascend")) | {"RANK_TABLE_FILE": str(table)}
    report = probe(site, env, dev=dev_nodes(tmp_path, 8))
    assert not report.available
    assert "server_list[0].device[0].device_id" in report.reason and "xccl rank-table validate" in report.fix


@pytest.mark.parametrize(
    ("value", "physical", "expected"),
    [
        (None, 8, tuple(range(8))),
        (None, None, tuple(range(64))),
        ("", 8, ()),
        ("0,1,2", 8, (0, 1, 2)),
        ("2,5", 8, (2, 5)),
        ("0,1 ,2", 8, (0, 1)),
        ("0,1x,2", 8, (0, 1)),
        ("1,0", 8, ()),
        ("0,0", 8, ()),
        ("0,,3", 8, (0, 3)),
        ("6,7,8", 8, (6, 7)),
    ],
)
def test_parse_visible_devices(value: str | None, physical: int | None, expected: tuple[int, ...]) -> None:
    assert parse_visible_devices(value, physical) == expected


# ------------------------------------------------------------------------------ through the entry point, for real


def run_python(code: str, site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("XCCL_", "ASCEND_", "TORCH_DEVICE_BACKEND"))}
    full.update(PYTHONPATH=os.pathsep.join([str(site), full.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_entry_point_probe_and_doctor_without_cann(tmp_path: Path) -> None:
    """torch_npu installed, no CANN: `import torch` fails as gotcha 1 says; with autoload off (as doctor's own
    docstring advises) xccl lists the plugin with the right reason, and `xccl doctor` names the cause and the fix,
    all without importing torch_npu."""
    pytest.importorskip("xccl.tools.cli.doctor", reason="this xccl has no `xccl doctor`")
    site = fake_dist(tmp_path / "site", "torch_npu", NPU, (PIN,), autoload=True)
    code = (
        "import json, sys, xccl\n"
        "from xccl.tools.cli import main\n"
        "status = main(['doctor'])\n"
        "info = {i.name: i for i in xccl.plugins()}['ascend']\n"
        "print(json.dumps([status, info.status.value, info.reason, info.fix, 'torch_npu' in sys.modules]))\n"
    )
    proc = run_python(code, site, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0, proc.stderr
    *doctor, last = proc.stdout.strip().splitlines()
    status, plugin_status, reason, fix, imported = json.loads(last)
    assert plugin_status == "unavailable" and not imported
    assert reason.startswith(f"torch_npu {NPU} is installed but CANN is not")
    assert "set_env.sh" in fix and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in fix
    report = "\n".join(doctor)
    assert status == 1, report
    assert re.search(r"FAIL\s+import torch: .*torch_npu", report), report  # gotcha 1, reproduced
    assert f"ascend: unavailable: {reason}" in report and f"fix: {fix}" in report


def test_simulation_refused_while_torch_npu_is_loaded(tmp_path: Path) -> None:
    """A working torch_npu, auto-loaded by torch, owns 'hccl': simulating then says how to avoid the clash."""
    site = fake_dist(tmp_path / "site", "torch_npu", NPU, (PIN,), autoload=True)
    (site / "torch_npu" / "__init__.py").write_text("def _autoload():\n    pass\n")  # loads, registers nothing
    code = (
        "import sys, xccl\n"
        "try:\n"
        "    xccl.init(vendor='ascend', simulate=True)\n"
        "except xccl.BackendUnavailable as exc:\n"
        "    print('torch_npu' in sys.modules, exc)\n"
    )
    proc = run_python(code, site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("True xccl plugin 'ascend' is unavailable: torch_npu is already imported")
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in proc.stdout


@pytest.mark.parametrize(("init", "said"), [
    ("from .distributed_c10d import _all_to_all_vc as all_to_all_vc\n", "exported"),  # v2.7.1-v2.12.0
    ("__all__ = ['is_hccl_available', 'reinit_process_group']\n", "not exported"),  # the 2.13.0 tags
    (None, "unknown"),
])
def test_the_probe_reads_all_to_all_vc_from_torch_npus_source(site: Path, init: str | None, said: str) -> None:
    """What doctor says about all_to_all_v before any process runs, without importing torch_npu."""
    if init is not None:
        (site / "torch_npu" / "distributed").mkdir()
        (site / "torch_npu" / "distributed" / "__init__.py").write_text(init)
    assert probe(site, {}).facts["all_to_all_vc"].startswith(said)
