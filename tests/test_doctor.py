"""``xccl doctor``: each check against the environment it judges, and the command's output and exit status.

Most checks run in-process through ``collect(env=...)``, with the environment as a parameter; package findings
read distribution metadata from a temporary directory put on ``sys.path`` (metadata files only, no modules).
Three tests run the real command in a child process, one of them with a backend extension whose autoload fails
the way torch_npu's does without CANN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import xccl
from xccl import Plugin, ProbeResult, Registry
from xccl.backends.cpu import CpuPlugin
from xccl.tools.cli.doctor import Finding, autoload_failure, collect, render

DATA = Path(__file__).parent / "data" / "ranktables"
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "XCCL_VENDOR", "XCCL_SIMULATE",
           "RANK_TABLE_FILE", "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "TPU_VISIBLE_DEVICES", "CHIP_MAP")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH}
    env.update(extra)
    return env


class FakeNpu(Plugin):
    """An available accelerator plugin that reads ASCEND_RT_VISIBLE_DEVICES (a registry test seam)."""

    name = "fakenpu"
    vendor = "Test"
    device_type = "npu"
    backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def probe(self) -> ProbeResult:
        return ProbeResult.ok(devices="8")


def find(report: Any, section: str, name: str) -> Finding:
    hits = [f for f in report.findings if f.section == section and f.name == name]
    assert len(hits) == 1, [f"{f.section}/{f.name}" for f in report.findings]
    return hits[0]


# ------------------------------------------------------------------------------------------------ in-process


def test_healthy_cpu_node_reports_torch_and_every_plugin():
    report = collect(env=clean_env())
    assert report.ok and report.selected == "cpu"
    assert torch.__version__ in find(report, "torch", "torch").summary
    plugins = {f.name: f for f in report.findings if f.section == "plugins"}
    for info in xccl.plugins():
        assert info.name in plugins
        assert plugins[info.name].summary.startswith(str(info.status))
        assert plugins[info.name].fix == info.fix
    assert find(report, "selected", "cpu").status == "ok"
    text = render(report)
    assert "xccl can run here with plugin 'cpu'" in text


@pytest.mark.parametrize(
    ("vendor", "phrase"),
    [("cuda", "CPU-only build"), ("nope", "no xccl plugin named 'nope'")],
    ids=["unavailable", "unknown"],
)
def test_selected_vendor_that_cannot_work_fails(vendor, phrase):
    report = collect(env=clean_env(), vendor=vendor)
    assert not report.ok and report.selected is None
    finding = find(report, "selected", vendor)
    assert finding.status == "fail" and phrase in finding.summary


def test_a_backend_name_two_plugins_drive_is_a_warning_naming_both():
    # Habana's Gaudi plugin drives "hccl" as Ascend's does: adoption of an hccl world picks by SDK, vendor= settles.
    class Gaudi(Plugin):
        name, vendor, device_type, backend = "gaudi", "Intel Gaudi", "hpu", "hccl"

    class Aardvark(Plugin):  # a third-party plugin over gloo: xccl's cpu plugin adopts gloo worlds, no warning
        name, vendor, device_type, backend, accelerator = "aardvark", "Test", "cpu", "gloo", False

    plugins = Registry.from_plugins(CpuPlugin(), FakeNpu(), Gaudi(), Aardvark())
    report = collect(env=clean_env(), vendor="cpu", registry=plugins)
    shared = find(report, "plugins", "backend 'hccl'")
    assert (shared.status, shared.summary) == ("warn", "driven by 2 plugins: fakenpu, gaudi")
    assert "picks the plugin whose SDK is importable here" in shared.fix
    assert "xccl.init(vendor=...) settles it (e.g. vendor='fakenpu', or XCCL_VENDOR=<fakenpu|gaudi>)" in shared.fix
    assert not [f for f in report.findings if f.name == "backend 'gloo'"]
    assert report.ok  # a warning: the exit status stays 0
    assert "WARN  backend 'hccl': driven by 2 plugins: fakenpu, gaudi" in render(report)


def test_simulation_needs_a_plugin_with_a_simulation():
    report = collect(env=clean_env(XCCL_SIMULATE="cpu"), registry=Registry.from_plugins(CpuPlugin()))
    assert find(report, "selected", "cpu").status == "fail"


@pytest.mark.parametrize(
    ("value", "status", "phrase"),
    [
        ("0,1,2,3", "ok", "4 NPU(s) visible"),
        ("3,1", "fail", "not strictly ascending"),
        ("", "fail", "0 devices"),
        ("0,1;2", "warn", "parsing stops at ';2'"),
    ],
    ids=["ascending", "unsorted", "empty", "stray-char"],
)
def test_ascend_visible_devices_follow_torch_npu_parser(value, status, phrase):
    reg = Registry.from_plugins(CpuPlugin(), FakeNpu())
    report = collect(env=clean_env(ASCEND_RT_VISIBLE_DEVICES=value), vendor="fakenpu", registry=reg)
    finding = find(report, "devices", "ASCEND_RT_VISIBLE_DEVICES")
    assert finding.status == status and phrase in finding.summary
    # The same value only warns when another vendor is selected.
    other = collect(env=clean_env(ASCEND_RT_VISIBLE_DEVICES=value), vendor="cpu", registry=reg)
    assert find(other, "devices", "ASCEND_RT_VISIBLE_DEVICES").status in ("ok", "warn")


@pytest.mark.parametrize(
    ("var", "value", "status"),
    [
        ("CUDA_VISIBLE_DEVICES", "", "warn"),
        ("CUDA_VISIBLE_DEVICES", "0,1", "ok"),
        ("TPU_VISIBLE_DEVICES", "0", "warn"),
        ("CHIP_MAP", "0,2,6,7", "ok"),
        ("CHIP_MAP", "0,1,1", "warn"),
        ("CHIP_MAP", "a,b", "warn"),
    ],
)
def test_visible_device_variables(var, value, status):
    assert find(collect(env=clean_env(**{var: value})), "devices", var).status == status


def test_rank_table_found_and_valid(tmp_path):
    good = collect(env=clean_env(RANK_TABLE_FILE=str(DATA / "hccl_v1.0.json")))
    finding = find(good, "rank table", "RANK_TABLE_FILE")
    assert finding.status == "ok" and finding.facts["format"] == "hccl"
    bad_json = tmp_path / "table.json"
    bad_json.write_text("{not json")
    bad = find(collect(env=clean_env(RANK_TABLE_FILE=str(bad_json))), "rank table", "RANK_TABLE_FILE")
    assert bad.status == "fail" and "rank-table" in bad.fix
    missing = find(collect(env=clean_env(RANK_TABLE_FILE=str(tmp_path / "no.json"))), "rank table", "RANK_TABLE_FILE")
    assert missing.status == "fail"
    size = int(finding.facts["world_size"])
    env = clean_env(RANK_TABLE_FILE=str(DATA / "hccl_v1.0.json"), RANK="0", WORLD_SIZE=str(size + 1),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    assert "WORLD_SIZE" in find(collect(env=env), "rank table", "RANK_TABLE_FILE").summary


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "ranks"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "ranks"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR/PORT"),
        ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500"}, "MASTER_ADDR"),
        ({"XCCL_TIMEOUT": "soon"}, "XCCL_TIMEOUT"),
    ],
    ids=["rank-not-int", "rank-out-of-range", "no-master", "bad-port", "unresolvable", "bad-timeout"],
)
def test_rendezvous_variables_that_would_break_init_fail(env, name):
    report = collect(env=clean_env(**env))
    assert find(report, "rendezvous", name).status == "fail"
    assert not report.ok


def _dist_info(root: Path, name: str, version: str, *lines: str) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *lines]))


class _Acme(Plugin):
    """A third-party plugin that names its SDK's distributions for doctor."""

    name = "acme"
    vendor = "Acme"
    device_type = "acme"
    backend = "acmecl"
    sdk_packages = ("torch-acme", "acme-driver-tools")


def test_each_plugin_lists_its_own_sdk_packages(tmp_path, monkeypatch):
    _dist_info(tmp_path, "torch_acme", "1.2.0", "Requires-Dist: torch==1.0.*")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = collect(env=clean_env(), registry=Registry.from_plugins(CpuPlugin(), _Acme()))
    sdk = find(report, "packages", "torch-acme")
    assert sdk.status == "fail" and sdk.summary.startswith("torch-acme 1.2.0 was built for torch==1.0.*")
    tools = find(report, "packages", "acme-driver-tools")
    assert tools.status == "info" and tools.summary == "not installed (the SDK of plugin acme)"
    # No plugin here names torch_npu or torch_tpu: doctor's list is the plugins', not a fixed one.
    assert not [f for f in report.findings if f.section == "packages" and f.name in ("torch_npu", "torch_tpu")]


def test_torch_npu_built_for_another_torch(tmp_path, monkeypatch):
    _dist_info(tmp_path, "torch_npu", "2.9.0", "Requires-Dist: torch==2.9.0.*")
    monkeypatch.syspath_prepend(str(tmp_path))
    finding = find(collect(env=clean_env()), "packages", "torch_npu")
    assert finding.status == "fail" and "torch==2.9.0.*" in finding.summary
    assert finding.facts["version"] == "2.9.0"


def test_torch_npu_for_this_torch_without_cann(tmp_path, monkeypatch):
    base = torch.__version__.split("+")[0]
    _dist_info(tmp_path, "torch_npu", base, f"Requires-Dist: torch=={base}.*")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {k: v for k, v in clean_env().items() if not k.startswith("ASCEND_")}
    finding = find(collect(env=env), "packages", "torch_npu")
    assert finding.status == "warn" and "set_env.sh" in finding.fix
    with_cann = find(collect(env={**env, "ASCEND_HOME_PATH": "/usr/local/Ascend"}), "packages", "torch_npu")
    assert with_cann.status == "ok"


def test_google_torch_tpu_is_told_apart_from_sophgo(tmp_path, monkeypatch):
    # Google's wheel metadata, as the manifest (B0) records it.
    _dist_info(tmp_path / "g", "torch_tpu", "0.2.0", "Author: torch team",
               "Home-page: https://github.com/google-pytorch/torch_tpu", "Requires-Dist: libtpu>=0.0.50")
    monkeypatch.syspath_prepend(str(tmp_path / "g"))
    google = find(collect(env=clean_env()), "packages", "torch_tpu")
    assert google.status == "warn" and "Google's TorchTPU" in google.summary and "pip uninstall" in google.fix
    monkeypatch.syspath_prepend(str(tmp_path / "s"))
    _dist_info(tmp_path / "s", "torch_tpu", "2.8.0.post1", "Author: sophgo",
               "Home-page: https://github.com/sophgo/torch-tpu")
    sophgo = find(collect(env=clean_env()), "packages", "torch_tpu")
    assert sophgo.status == "ok" and "Sophgo" in sophgo.summary


def test_torch_npu_autoload_failure_is_explained():
    # stderr of `python -c "import torch"` with torch_npu installed and CANN missing (manifest, gotcha 1).
    stderr = textwrap.dedent("""\
        Traceback (most recent call last):
          File "<string>", line 1, in <module>
        RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading with \
        TORCH_DEVICE_BACKEND_AUTOLOAD=0.
    """)
    finding = autoload_failure(stderr)
    assert finding.status == "fail" and "torch_npu" in finding.summary and "CANN" in finding.summary
    assert "set_env.sh" in finding.fix and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in finding.fix


# ------------------------------------------------------------------------------------------------ the command


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xccl", "doctor", *args], env=env or clean_env(),
                          capture_output=True, text=True, timeout=300)


def test_command_json_and_exit_status():
    out = _doctor("--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True and report["selected"] == "cpu"
    sections = {f["section"] for f in report["findings"]}
    assert {"torch", "autoload", "packages", "plugins", "selected", "devices", "rank table", "rendezvous"} <= sections
    bad = _doctor("--vendor", "cuda")
    assert bad.returncode == 1
    assert "FAIL  cuda: xccl.init(vendor='cuda') would fail" in bad.stdout


def test_command_finds_a_backend_extension_that_breaks_import_torch(tmp_path):
    # A distribution whose [torch.backends] entry point fails to load, as torch_npu's does without CANN.
    (tmp_path / "brokenaccel_mod.py").write_text(
        "def autoload():\n    raise OSError('libbroken.so: cannot open shared object file')\n"
    )
    info = tmp_path / "brokenaccel-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenaccel\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nbroken_accel = brokenaccel_mod:autoload\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    # Doctor itself must run with autoload off (its own `import torch` would fail too); it tries it with autoload on.
    out = _doctor("--json", env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.returncode == 1, out.stderr
    finding = next(f for f in json.loads(out.stdout)["findings"] if f["section"] == "autoload")
    assert finding["status"] == "fail" and "broken_accel" in finding["summary"]
    assert "Failed to load the backend extension" in finding["facts"]["error"]
    assert finding["facts"]["cause"] == "OSError: libbroken.so: cannot open shared object file"
