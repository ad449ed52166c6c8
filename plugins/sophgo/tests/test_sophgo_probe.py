"""The probe: Sophgo's torch_tpu told apart from Google's without importing either, and TPU device nodes.

Installations are laid out on disk in a temporary directory (a package whose ``__init__`` raises if imported,
plus the ``.dist-info`` metadata each product's wheel writes) and the probe is pointed at it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from xccl_sophgo import SophgoPlugin, plugin
from xccl_sophgo._probe import NO_DEVICE_ENV, Flavour, find_torch_tpu, probe
from xccl_sophgo._runtime import load_sdk

import xccl

#: METADATA of the PyPI wheel torch_tpu-0.2.0 (manifest B0): Google's TorchTPU.
GOOGLE = """Metadata-Version: 2.1
Name: torch_tpu
Version: 0.2.0
Summary: TPU/XLA support for PyTorch
Home-page: https://github.com/google-pytorch/torch_tpu
Author: torch team
Requires-Dist: libtpu>=0.0.50
Requires-Dist: torch<=2.15.0,>=2.11.0
"""
#: METADATA written by Sophgo's setup.py (author "sophgo", url github.com/sophgo/torch-tpu).
SOPHGO = """Metadata-Version: 2.1
Name: torch_tpu
Version: 2.8.0.post1
Summary: TPU bridge for PyTorch
Home-page: https://github.com/sophgo/torch-tpu
Author: sophgo
Author-email: dev@sophgo.com
"""
IMPORT_BOOBY_TRAP = "raise RuntimeError('the probe imported torch_tpu')\n"


def install(root: Path, metadata: str | None, files: tuple[str, ...] = ()) -> Path:
    """Lay out a torch_tpu package (and its dist-info when ``metadata`` is given) under ``root``."""
    pkg = root / "torch_tpu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(IMPORT_BOOBY_TRAP)
    for name in files:
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text("")
    if metadata is not None:
        version = next(ln.split(": ")[1] for ln in metadata.splitlines() if ln.startswith("Version"))
        info = root / f"torch_tpu-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(metadata)
        (info / "top_level.txt").write_text("torch_tpu\n")
        (info / "RECORD").write_text("torch_tpu/__init__.py,,\n")
    return root


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(4):
        (dev / f"bm-sophon{i}").write_text("")
    (dev / "bmdev-ctl").write_text("")
    return dev


@pytest.fixture
def no_devices(tmp_path: Path) -> Path:
    dev = tmp_path / "empty-dev"
    dev.mkdir()
    return dev


def test_entry_point_is_discovered_and_cheap() -> None:
    info = next(i for i in xccl.plugins() if i.name == "sophgo")
    assert isinstance(info.plugin, SophgoPlugin) and info.plugin is plugin
    assert info.target == "xccl_sophgo._plugin:plugin" and info.distribution.startswith("xccl-sophgo")
    assert "torch_tpu" not in sys.modules
    # Here there is no torch_tpu at all: unavailable, with the reason and the fix.
    assert not info.available
    assert "not installed" in info.reason and "Sophgo's release" in info.fix and "Google" in info.fix


def test_nothing_installed(tmp_path: Path, devices: Path) -> None:
    result = probe([str(tmp_path)], str(devices))
    assert not result.available and result.reason == "Sophgo's torch_tpu is not installed"
    assert "not `pip install torch-tpu`" in result.fix


def test_google_package_detected_by_metadata(tmp_path: Path, devices: Path) -> None:
    root = install(tmp_path / "site", GOOGLE, files=("_loader.py",))
    result = probe([str(root)], str(devices))
    assert not result.available
    assert "Google's TorchTPU, not Sophgo's" in result.reason and "torch_tpu 0.2.0" in result.reason
    assert "google-pytorch/torch_tpu" in result.reason
    assert "pip uninstall torch-tpu" in result.fix and "Sophgo's release" in result.fix
    assert result.facts["flavour"] == "google"
    assert "torch_tpu" not in sys.modules


def test_google_package_detected_by_layout_without_metadata(tmp_path: Path, devices: Path) -> None:
    root = install(tmp_path / "site", None, files=("_loader.py",))
    found = find_torch_tpu([str(root)])
    assert found is not None and found.flavour is Flavour.GOOGLE and "_loader.py" in found.evidence
    assert not probe([str(root)], str(devices)).available


def test_sophgo_package_with_devices(tmp_path: Path, devices: Path) -> None:
    root = install(tmp_path / "site", SOPHGO, files=("tpu/utils.py",))
    result = probe([str(root)], str(devices))
    assert result.available, result.reason
    assert result.facts["flavour"] == "sophgo" and result.facts["devices"] == "4"
    assert result.facts["distribution"] == "torch_tpu 2.8.0.post1"
    assert "torch_tpu" not in sys.modules


def test_sophgo_source_tree_recognised_by_layout(tmp_path: Path, devices: Path) -> None:
    # A development checkout on PYTHONPATH (Sophgo's envsetup.sh flow) has no dist-info.
    root = install(tmp_path / "src", None, files=("tpu/utils.py", "lib/libsccl.so"))
    found = find_torch_tpu([str(root)])
    assert found is not None and found.flavour is Flavour.SOPHGO and found.distribution == ""
    assert probe([str(root)], str(devices)).available


def test_sophgo_without_devices(tmp_path: Path, no_devices: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = install(tmp_path / "site", SOPHGO)
    monkeypatch.delenv(NO_DEVICE_ENV, raising=False)
    result = probe([str(root)], str(no_devices))
    assert not result.available and "no Sophgo TPU device node" in result.reason
    assert "bm-sophon" in result.fix and "XCCL_SIMULATE=sophgo" in result.fix
    monkeypatch.setenv(NO_DEVICE_ENV, "1")
    assert probe([str(root)], str(no_devices)).available


def test_real_path_without_torch_tpu_explains() -> None:
    with pytest.raises(xccl.BackendUnavailable, match="importing torch_tpu failed: ModuleNotFoundError") as info:
        load_sdk(simulate=False)
    assert "Sophgo's release" in info.value.fix


def test_selecting_it_here_says_why() -> None:
    with pytest.raises(xccl.BackendUnavailable, match="Sophgo's torch_tpu is not installed"):
        xccl.init(vendor="sophgo")
