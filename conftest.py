"""The test suite's own plugins, visible to the suite alone.

The test plugins (``tests/plugins/xccl-testplugins``: an emulating gloo plugin, fake accelerators, deliberately
broken entry points) and the plugin template (``examples/plugin-template``) are found by xccl's discovery as any
plugin is, through ``xccl.plugins`` entry points. They are not installed into the environment: ``make test`` and
``make demo`` share ``.venv``, and a user's ``xccl caps`` or ``xccl doctor`` must list the real plugins only.
Instead, before anything is collected, this file writes each one's entry points into a ``*.dist-info`` folder of a
temporary directory and puts that directory and the package's source on ``sys.path`` and ``PYTHONPATH``: the
suite's process, its xdist workers and every rank or subprocess it starts (all inherit the environment) see them;
nothing outside the test run does.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
#: Distributions of this repository that only the tests use: their source folder (holding pyproject.toml).
_TEST_ONLY = (_ROOT / "tests" / "plugins" / "xccl-testplugins", _ROOT / "examples" / "plugin-template")


def _dist_info(source: Path, into: Path) -> None:
    """Write ``source``'s name, version and entry points as an installed distribution's metadata in ``into``."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project.get("version", "0")
    info = into / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))


def _register_test_plugins() -> None:
    present = [s for s in _TEST_ONLY if (s / "pyproject.toml").is_file()]
    meta = os.environ.get("XCCL_TEST_PLUGINS_PATH")
    if not meta or not Path(meta).is_dir():  # not a process the run started (which inherits the folder)
        meta = tempfile.mkdtemp(prefix="xccl-test-plugins-")
        atexit.register(shutil.rmtree, meta, True)
        for source in present:
            _dist_info(source, Path(meta))
        os.environ["XCCL_TEST_PLUGINS_PATH"] = meta
    paths = [meta, *(str(s) for s in present)]
    # xdist's workers do not take their sys.path from PYTHONPATH: set both, in every process that loads this file.
    sys.path[:0] = [p for p in paths if p not in sys.path]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *inherited])


_register_test_plugins()
