"""Plugin discovery: the built-ins, the test-only plugin distribution, broken entry points, selection."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import xccl
from xccl import Registry, Status


def infos() -> dict[str, xccl.PluginInfo]:
    return {i.name: i for i in xccl.plugins(refresh=True)}


def test_builtins_are_discovered_through_entry_points():
    found = infos()
    assert found["cpu"].status is Status.AVAILABLE
    assert found["cpu"].target == "xccl.backends.cpu:plugin"
    assert found["cpu"].distribution.startswith("xccl ")
    assert found["cuda"].plugin is not None and found["cuda"].plugin.backend == "nccl"
    # This CPU-only torch has no CUDA: unavailable, and the reason says why.
    import torch

    if torch.version.cuda is None:
        assert found["cuda"].status is Status.UNAVAILABLE
        assert "CPU-only" in found["cuda"].reason and found["cuda"].fix


def test_test_plugin_distribution_is_discovered():
    found = infos()
    assert found["gloo-emulated"].status is Status.AVAILABLE
    assert found["gloo-emulated"].distribution.startswith("xccl-testplugins")
    assert found["fake-accel-a"].status is Status.UNAVAILABLE
    assert "XCCL_TEST_FAKE_ACCEL=a" in found["fake-accel-a"].fix


@pytest.mark.parametrize(
    ("name", "status", "phrase"),
    [
        ("broken-import", Status.FAILED, "No module named 'xccl_testplugins_missing_dependency'"),
        ("missing-attr", Status.FAILED, "does_not_exist"),
        ("not-a-plugin", Status.FAILED, "is a int, not an xccl Plugin"),
        ("old-api", Status.INCOMPATIBLE, "plugin API 0"),
    ],
    ids=["import-error", "missing-attribute", "wrong-type", "old-api"],
)
def test_broken_entry_points_are_listed_not_raised(name, status, phrase):
    found = infos()
    assert found[name].status is status
    assert phrase in found[name].reason
    assert found[name].fix
    # ...and they break nothing else.
    assert found["cpu"].available


def test_selecting_a_broken_plugin_raises_typed():
    with pytest.raises(xccl.BackendUnavailable, match="No module named"):
        xccl.Registry().get("broken-import")
    with pytest.raises(xccl.BackendNotFound, match=r"discovered: .*cpu"):
        xccl.Registry().select("no-such-vendor")
    with pytest.raises(xccl.BackendUnavailable, match=r"CPU-only|no CUDA"):
        xccl.Registry().select("cuda")


def test_registry_from_given_plugins_is_a_seam_without_entry_points():
    from xccl.backends.cpu import CpuPlugin

    reg = Registry.from_plugins(CpuPlugin())
    assert list(reg.infos()) == ["cpu"]
    assert reg.select("auto").name == "cpu"


class _Raising(xccl.Plugin):
    name = "raising-probe"

    def probe(self) -> xccl.ProbeResult:
        raise OSError("driver exploded")


def test_a_probe_that_raises_is_reported_unavailable():
    info = Registry.from_plugins(_Raising()).infos()["raising-probe"]
    assert info.status is Status.UNAVAILABLE
    assert "OSError: driver exploded" in info.reason


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_auto_detection_picks_the_available_accelerator_else_cpu():
    code = "import xccl; print(xccl.Registry().select('auto').name)"
    assert _run(code, XCCL_TEST_FAKE_ACCEL="").stdout.strip() == "cpu"
    assert _run(code, XCCL_TEST_FAKE_ACCEL="b").stdout.strip() == "fake-accel-b"
    two = _run(code, XCCL_TEST_FAKE_ACCEL="ab")
    assert two.returncode != 0
    assert "fake-accel-a, fake-accel-b" in two.stderr and "XCCL_VENDOR" in two.stderr
    # XCCL_VENDOR resolves the ambiguity.
    assert _run(code, XCCL_TEST_FAKE_ACCEL="ab", XCCL_VENDOR="fake-accel-a").stdout.strip() == "fake-accel-a"


def test_import_and_discovery_import_no_vendor_sdk():
    code = (
        "import sys, json, xccl; xccl.plugins(); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch_npu','torch_tpu','torchair'))))"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_cli_lists_plugins_via_caps_and_python_m():
    out = subprocess.run([sys.executable, "-m", "xccl", "caps", "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "all_reduce" in out.stdout and "native" in out.stdout


def test_the_test_plugins_are_the_test_runs_alone():
    # The suite sees its test-only plugins (conftest.py: entry points on PYTHONPATH for the run); the environment
    # that `make demo` shares with `make test` does not: there `xccl caps --json` lists the real plugins only.
    assert {"gloo-emulated", "template"} <= set(infos())
    meta = os.environ["XCCL_TEST_PLUGINS_PATH"]
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    own = {meta, *(p for p in parts if p.endswith(("xccl-testplugins", "plugin-template")))}
    env = {k: v for k, v in os.environ.items() if k not in ("XCCL_TEST_PLUGINS_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p and p not in own)
    out = subprocess.run([sys.executable, "-m", "xccl", "caps", "--json"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["plugins"]
    names = set(listed) if isinstance(listed, dict) else {p["name"] for p in listed}
    assert names <= {"cpu", "cuda", "ascend", "sophgo"}, names
    assert "cpu" in names
