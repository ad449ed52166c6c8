"""``xccl new-plugin``: a vendor-shaped plugin distribution, named for the vendor, that passes the kit.

``examples/plugin-template`` is the scaffold's output for ``template`` (checked here file by file, so the two
cannot drift), and the repository's default test run runs the kit on it in simulation
(``examples/plugin-template/tests``). Here: the generated names, the generated plugin loaded without packaging
(contract, table, probe, the SDK boundary's error), and, marked slow, the guide's commands in a fresh venv.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import xccl
from xccl.plugin._verify import contract_problems
from xccl.testing._checks import identity_problems, table_problems
from xccl.tools._scaffold import names, render
from xccl.tools.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "plugin-template"
#: What `pip install -e`, the tests and the linters leave in a plugin's directory.
_BUILD = re.compile(r"(^|/)([^/]+\.egg-info|build|__pycache__|\.\w+_cache)(/|$)")
ACME = ["acme", "--vendor", "Acme Corp", "--device-type", "acme", "--backend", "acmecl", "--sdk", "torch_acme"]


def _files(root: Path) -> dict[str, str]:
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not _BUILD.search(rel):
            out[rel] = path.read_text(encoding="utf-8")
    return out


def test_the_template_is_the_scaffold_output() -> None:
    want = render(names("template", vendor="Example Devices"))
    got = _files(TEMPLATE)
    fix = "regenerate it: rm -rf examples/plugin-template && xccl new-plugin template --vendor 'Example Devices' " \
          "-o examples/plugin-template (edit xccl/tools/scaffold/ instead of the copy)"
    assert sorted(got) == sorted(want), fix
    assert [p for p in want if got[p] != want[p]] == [], fix


def test_new_plugin_names_every_file_for_the_vendor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "xccl-acme"
    assert cli(["new-plugin", *ACME, "-o", str(dest)]) == 0
    assert f"wrote 15 files to {dest}/" in capsys.readouterr().out
    files = _files(dest)
    assert {"pyproject.toml", "README.md", ".gitignore", "xccl_acme/_plugin.py", "xccl_acme/_sdk.py",
            "xccl_acme/_sdk_sim.py", "xccl_acme/_simprofile.py", "tests/test_acme_conformance.py"} <= set(files)
    assert not [p for p in dest.rglob("*") if p.name.endswith(".egg-info")]
    assert 'acme = "xccl_acme._plugin:plugin"' in files["pyproject.toml"]
    assert 'device = ["torch-acme"]' in files["pyproject.toml"]
    leftovers = {p: m.group(0) for p, text in files.items() for m in [re.search(r"(?i)template|\{\{\w+\}\}", text)] if m}
    assert leftovers == {}, "spellings the generator did not replace"
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")
    # Never overwrites: a second run into the same directory is refused.
    assert cli(["new-plugin", "acme", "-o", str(dest)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "phrase"),
    [(["Acme"], "use lower-case letters and digits"), (["acme", "--backend", "nccl"], "is torch's own"),
     (["acme", "--sdk", "torch-acme"], "--sdk 'torch-acme': must be a Python module path")],
    ids=["capitals", "torch-backend", "sdk-not-importable"],
)
def test_bad_names_are_refused_with_what_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 args: list[str], phrase: str) -> None:
    assert cli(["new-plugin", *args, "-o", str(tmp_path / "out")]) == 2
    assert phrase in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_generated_plugin_keeps_the_contract_without_packaging(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli(["new-plugin", *ACME, "-o", str(tmp_path / "xccl-acme")]) == 0
    monkeypatch.syspath_prepend(str(tmp_path / "xccl-acme"))
    from xccl_acme import plugin  # type: ignore[import-not-found]

    assert (plugin.name, plugin.backend, plugin.device_type, plugin.sdk_packages) == ("acme", "acmecl", "acme",
                                                                                     ("torch-acme",))
    probe = plugin.probe()
    assert not probe.available and probe.reason == "torch_acme is not installed" and "XCCL_SIMULATE=acme" in probe.fix
    info = xccl.Registry.from_plugins(plugin).infos()["acme"]
    assert identity_problems(info, plugin, probe) == []
    assert table_problems(plugin, plugin.capabilities()) == []
    runtime = plugin.runtime(simulate=True)
    assert contract_problems(plugin, runtime, simulate=True) == []
    assert plugin.simulation().backend == "acmecl" and runtime.setup_device(1).type == "cpu"
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0")
    with pytest.raises(xccl.InitError, match=r"local rank 1 needs device 1, but 1 Acme Corp device\(s\) are visible"):
        runtime.setup_device(1)
    # On the hardware the SDK boundary imports torch_acme, and says what is missing and how to fix it.
    with pytest.raises(xccl.BackendUnavailable, match=r"torch_acme cannot be imported .*pip install 'xccl-acme\[device\]'"):
        plugin.runtime(simulate=False)


@pytest.mark.slow
def test_the_guides_commands_pass_the_kit_in_a_fresh_venv(tmp_path: Path) -> None:
    """`xccl new-plugin acme`, `pip install -e .`, `pytest`: the kit in simulation, at 2 and 4 ranks.

    The venv is fresh (its own site-packages, where the plugin is installed) and reuses this one's torch, xccl and
    pytest through a .pth file: the machine has no network and torch is large. pip runs without dependencies and
    build isolation for the same reason.
    """
    assert cli(["new-plugin", *ACME, "-o", str(tmp_path / "xccl-acme")]) == 0
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(site, "_reuse_test_venv.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCCL_", "PYTHON"))}
    run = {"cwd": tmp_path / "xccl-acme", "env": env, "capture_output": True, "text": True, "timeout": 900}
    pip = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-e", ".[test]"],
                         **run)  # type: ignore[call-overload]
    assert pip.returncode == 0, pip.stdout + pip.stderr
    kit = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], **run)  # type: ignore[call-overload]
    assert kit.returncode == 0, kit.stdout[-5000:] + kit.stderr[-3000:]
    assert re.search(r"\d+ passed", kit.stdout) and "failed" not in kit.stdout
    doctor = subprocess.run([venv / "bin" / "python", "-m", "xccl", "doctor"], **run)  # type: ignore[call-overload]
    assert "torch-acme" in doctor.stdout and "acme" in doctor.stdout


def test_a_dotted_sdk_is_a_module_path_and_its_distribution_the_top_level_one(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Habana's SDK is imported as habana_frameworks.torch: a normal module path, refused before.
    dest = tmp_path / "xccl-gaudi"
    assert cli(["new-plugin", "gaudi", "--backend", "hccl", "--sdk", "habana_frameworks.torch", "-o", str(dest)]) == 0
    assert 'device = ["habana-frameworks"]' in (dest / "pyproject.toml").read_text()
    monkeypatch.syspath_prepend(str(dest))
    from xccl_gaudi import plugin  # type: ignore[import-not-found]

    probe = plugin.probe()  # finds the top-level package's spec only: nothing of the SDK is imported
    assert not probe.available and probe.reason == "habana_frameworks.torch is not installed", probe
    assert "import habana_frameworks.torch" in (dest / "xccl_gaudi" / "_sdk.py").read_text()

