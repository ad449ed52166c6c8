"""``xccl new-plugin``: a vendor-shaped plugin distribution, named for the vendor, that passes the kit.

``examples/plugin-template`` is the scaffold's output for ``template`` (checked here file by file, so the two
cannot drift), and the repository's default test run runs the kit on it in simulation
(``examples/plugin-template/tests``). Here: the generated names, the generated plugin loaded without packaging
(contract, table, probe, the SDK boundary's error), and, marked slow, the guide's commands in a fresh venv.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

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
    want = render(names("template", vendor="Example Devices", rank_table=True))
    got = _files(TEMPLATE)
    fix = "regenerate it: rm -rf examples/plugin-template && xccl new-plugin template --vendor 'Example Devices' " \
          "--rank-table -o examples/plugin-template (edit xccl/tools/scaffold/ instead of the copy)"
    assert sorted(got) == sorted(want), fix
    assert [p for p in want if got[p] != want[p]] == [], fix


def test_new_plugin_names_every_file_for_the_vendor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "xccl-acme"
    assert cli(["new-plugin", *ACME, "-o", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert f"wrote 13 files to {dest}/" in out and err == ""  # acmecl: no other plugin drives it, no warning
    files = _files(dest)
    assert {"pyproject.toml", "README.md", ".gitignore", "xccl_acme/_plugin.py", "xccl_acme/_sdk.py",
            "xccl_acme/_sdk_sim.py", "xccl_acme/_simprofile.py", "tests/test_acme_conformance.py"} <= set(files)
    # No rank-table format unless asked (--rank-table): none is invented for a vendor that may have none.
    assert not [p for p in files if "ranktable" in p] and "        return ()\n" in files["xccl_acme/_plugin.py"]
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
    assert plugin.rank_table_formats() == () and runtime.sdk.current == 1  # device LOCAL_RANK made current
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


@pytest.fixture
def forget_gaudi() -> Iterator[None]:
    """Tests here generate ``xccl_gaudi`` into their own directories: each imports its own."""
    yield
    for name in [m for m in sys.modules if m == "xccl_gaudi" or m.startswith("xccl_gaudi.")]:
        del sys.modules[name]


@pytest.mark.usefixtures("forget_gaudi")
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



def test_a_backend_name_an_installed_plugin_drives_is_written_with_a_warning(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Habana's backend is "hccl", as Ascend's (installed here) is: legitimate, so written, but said.
    assert cli(["new-plugin", "gaudi", "--backend", "hccl", "-o", str(tmp_path / "xccl-gaudi")]) == 0
    out, err = capsys.readouterr()
    assert "wrote 13 files" in out
    assert ("xccl new-plugin: warning: backend 'hccl' is also driven by the installed plugin(s) ascend "
            "(xccl-ascend") in err, err
    assert "picks the plugin whose SDK is importable here" in err and "raises InitError naming them" in err, err
    assert "xccl.init(vendor=...) settles it (e.g. vendor='gaudi', or XCCL_VENDOR=<gaudi|ascend>)" in err, err


@pytest.mark.usefixtures("forget_gaudi")
def test_a_bridge_picked_device_is_taken_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Habana's bridge (habana_frameworks.torch) chooses the device; the process sees that one.
    dest = tmp_path / "xccl-gaudi"
    assert cli(["new-plugin", "gaudi", "--device-type", "hpu", "--backend", "hccl", "--sdk",
                "habana_frameworks.torch", "--bridge-picks-device", "-o", str(dest)]) == 0
    sdk = (dest / "xccl_gaudi" / "_sdk.py").read_text()
    assert "set_device" not in sdk and "self._module.current_device()" in sdk
    assert "--bridge-picks-device" in (dest / "pyproject.toml").read_text()
    monkeypatch.syspath_prepend(str(dest))
    from xccl_gaudi import plugin  # type: ignore[import-not-found]
    from xccl_gaudi._runtime import GaudiRuntime  # type: ignore[import-not-found]

    assert contract_problems(plugin, plugin.runtime(simulate=True), simulate=True) == []
    assert plugin.runtime(simulate=True).setup_device(5).type == "cpu"  # any local rank: the bridge's device

    class Bridge:  # the SDK boundary as habana_frameworks.torch answers it: no set_device to call
        device_type = "hpu"

        def device_count(self) -> int:
            return 1

        def current_device(self) -> int:
            return 3

    assert GaudiRuntime(plugin, simulate=False, sdk=Bridge()).setup_device(0) == torch.device("hpu", 3)
    monkeypatch.setenv("GAUDI_VISIBLE_DEVICES", "")
    with pytest.raises(xccl.InitError, match=r"local rank 2 sees no Gaudi device \(GAUDI_VISIBLE_DEVICES=''\)"):
        plugin.runtime(simulate=True).setup_device(2)


# -- The Gaudi-shaped plugin, end to end: dotted SDK, bridge-picked device, backend hccl beside Ascend's,
# collectives over floats only (the table and the simulation profile edited as its author would).

GAUDI = ["gaudi", "--vendor", "Intel Gaudi", "--device-type", "hpu", "--backend", "hccl", "--sdk",
         "habana_frameworks.torch", "--visible-devices-env", "HABANA_VISIBLE_MODULES", "--bridge-picks-device"]


def _gaudi(root: Path) -> tuple[Path, Path]:
    """The Gaudi plugin generated into ``root/xccl-gaudi``, made float-only, and "installed" the way the root
    conftest.py registers the test plugins: its entry point in a ``*.dist-info`` folder of ``root/site``, the
    source beside it; both go on ``sys.path`` or ``PYTHONPATH``, never into the environment. Returns both."""
    source, site = root / "xccl-gaudi", root / "site"
    assert cli(["new-plugin", *GAUDI, "-o", str(source)]) == 0
    edits = {
        "_table.py": [("DTYPES: Final = _FLOATS | _INTEGERS", "DTYPES: Final = _FLOATS"),
                      ("reduce_ops=_ARITHMETIC | _BITWISE,  ", "reduce_ops=_ARITHMETIC,")],
        "_simprofile.py": [("DTYPES: Final = _FLOATS | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}",
                            "DTYPES: Final = _FLOATS"),
                           ('"min", "max", "band", "bor", "bxor"})', '"min", "max"})')],
    }
    for module, pairs in edits.items():
        path = source / "xccl_gaudi" / module
        text = path.read_text()
        for old, new in pairs:
            assert old in text, f"the scaffold's {module} changed: update this test's edit of {old!r}"
            text = text.replace(old, new)
        path.write_text(text)
    info = site / "xccl_gaudi-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xccl-gaudi\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[xccl.plugins]\ngaudi = xccl_gaudi._plugin:plugin\n")
    return source, site


@pytest.mark.usefixtures("forget_gaudi")
def test_the_gaudi_plugin_installed_beside_ascends_adopts_an_hccl_world_when_its_sdk_alone_is_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xccl.runtime._backend_check import plugin_for

    source, site = _gaudi(tmp_path)
    # What the probe reads from disk: the SDK's top-level package (found, never imported) and the device nodes.
    sdk, dev = tmp_path / "sdk", tmp_path / "dev"
    (sdk / "habana_frameworks" / "torch").mkdir(parents=True)
    for folder in (sdk / "habana_frameworks", sdk / "habana_frameworks" / "torch"):
        (folder / "__init__.py").write_text("raise ImportError('a probe must not import the SDK')\n")
    dev.mkdir()
    for i in range(8):
        (dev / f"hpu{i}").touch()
    for path in (site, source, sdk):
        monkeypatch.syspath_prepend(str(path))
    for var in ("XCCL_VENDOR", "XCCL_SIMULATE"):
        monkeypatch.delenv(var, raising=False)
    import xccl_gaudi._probe  # type: ignore[import-not-found]

    monkeypatch.setattr(xccl_gaudi._probe, "DEVICE_NODES", str(dev / "hpu[0-9]*"))
    registry = xccl.Registry()  # discovery through the entry points: Ascend's installed, Gaudi's beside it
    infos = registry.infos()
    assert infos["gaudi"].available and infos["gaudi"].distribution == "xccl-gaudi 0.1.0", infos["gaudi"]
    assert not infos["ascend"].available  # torch_npu is not installed here
    assert plugin_for("hccl", "auto", registry).name == "gaudi"
    # Without Habana's SDK neither plugin can run: an InitError naming both and the vendor= that settles it.
    sys.path.remove(str(sdk))  # monkeypatch restores sys.path afterwards
    importlib.invalidate_caches()
    with pytest.raises(xccl.InitError, match=r"several installed plugins drive \(ascend, gaudi\).*vendor="):
        plugin_for("hccl", "auto", xccl.Registry())


def test_doctor_warns_of_the_hccl_name_the_gaudi_and_ascend_plugins_share(tmp_path: Path) -> None:
    source, site = _gaudi(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(source), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "xccl", "doctor", "--json"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    report = json.loads(proc.stdout)
    shared = [f for f in report["findings"] if f["name"] == "backend 'hccl'"]
    assert [(f["section"], f["status"], f["summary"]) for f in shared] == [
        ("plugins", "warn", "driven by 2 plugins: ascend, gaudi")], proc.stdout[-3000:]
    assert "xccl.init(vendor=...) settles it" in shared[0]["fix"]
    assert not [f for f in report["findings"] if f["name"] == "backend 'gloo'"]  # xccl's own cpu plugin adopts gloo


@pytest.mark.slow
def test_the_gaudi_plugin_passes_its_kit_with_ddp_skipped_for_its_int64_all_gather(tmp_path: Path) -> None:
    source, site = _gaudi(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    report = run / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(source), os.environ.get("PYTHONPATH", "")])}
    kit = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", f"--junitxml={report}",
         "--xccl-plugin", "gaudi", "--xccl-simulate", "--xccl-world-sizes", "2"],
        cwd=run, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert kit.returncode == 0, kit.stdout[-5000:] + kit.stderr[-3000:]
    cases = {c.get("name"): c for c in ET.parse(report).getroot().iter("testcase")}
    ddp = cases["test_training_steps_match_a_single_process[2ranks-ddp]"].find("skipped")
    assert ddp is not None and "ddp: the table refuses all_gather(int64), which DDP calls" in ddp.get("message", "")
    fsdp2 = cases["test_training_steps_match_a_single_process[2ranks-fsdp2]"]
    assert fsdp2.find("skipped") is None and fsdp2.find("failure") is None
    assert re.search(r"\d+ passed", kit.stdout) and "failed" not in kit.stdout
