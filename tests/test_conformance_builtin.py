"""The conformance suite: run against the built-in plugins, and shown to catch plugins that break the contract.

``TestCpuConformance`` and ``TestCudaConformance`` are the suite itself, bound to the built-in plugins (cuda's
multi-rank checks skip without a GPU). The rest tests the suite: its checks on hand-made bad data, the
``pytest --xccl-plugin NAME`` command line, and a deliberately lying plugin it must fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import xccl
from xccl import CapabilityTable, Collective, Level, Mode, Plugin, ProbeResult, Support
from xccl.plugin._registry import PluginInfo, Status
from xccl.testing.conformance import (
    comm_name_problems,
    foreign_imports,
    identity_problems,
    parse_world_sizes,
    suite,
    table_problems,
)

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

TestCpuConformance = suite("cpu")
TestCudaConformance = suite("cuda")

C = Collective


# ------------------------------------------------------------------------------- the checks, on bad data


class _Named(Plugin):
    name = "named"
    vendor = "tests"


def _table(backend: str, **eager: Support) -> CapabilityTable:
    entries = {(op, m): Support(Level.UNSUPPORTED) for op in C for m in Mode}
    entries.update({(C(k), Mode.EAGER): v for k, v in eager.items()})
    return CapabilityTable(backend, entries)


@pytest.mark.parametrize(
    ("entry", "phrase"),
    [
        ({"reduce_scatter_tensor": Support(Level.EMULATED, via="magic")}, "emulated via 'magic', which xccl does not have"),
        ({"all_reduce": Support(Level.EMULATED)}, "names no emulation in `via`"),
        ({"all_reduce": Support(Level.NATIVE, reduce_ops=frozenset({"summ"}))}, "unknown reduce ops ['summ']"),
        ({"broadcast": Support(Level.NATIVE, reduce_ops=frozenset({"sum"}))}, "broadcast does not reduce"),
        ({"all_reduce": Support(Level.NATIVE, world_sizes=frozenset({0, 2}))}, "non-empty set of positive integers"),
        ({"all_reduce": Support(Level.NATIVE, dtypes=frozenset({torch.float32}), cast_to={torch.bool: torch.uint8})},
         "cast_to maps torch.bool to torch.uint8, which the kernel does not accept either"),
        ({"all_reduce": Support(Level.NATIVE, min_torch=(2,))}, "(major, minor, patch) tuple"),  # type: ignore[arg-type]
        ({"all_reduce": Support(Level.NATIVE, min_sdk=("CANN", "soon"))}, "min_sdk ('CANN', 'soon') must be"),
        ({"all_reduce": Support(Level.NATIVE, dtypes={torch.float32})}, "frozenset of torch.dtype"),  # type: ignore[arg-type]
    ],
    ids=["unknown-via", "no-via", "reduce-op-typo", "reduce-ops-on-broadcast", "world-size-0", "cast-to-unsupported",
         "min-torch", "min-sdk", "dtypes-not-frozen"],
)
def test_table_check_names_what_is_wrong(entry, phrase):
    problems = table_problems(_Named(), _table("named", **entry))
    assert any(phrase in p for p in problems), problems


def test_table_check_flags_a_foreign_backend_name_and_graph_without_eager():
    entries = {(op, m): Support(Level.UNSUPPORTED) for op in C for m in Mode}
    entries[(C.BROADCAST, Mode.GRAPH)] = Support(Level.NATIVE)
    problems = table_problems(_Named(), CapabilityTable("other", entries))
    assert any("table.backend is 'other'" in p for p in problems)
    assert any("broadcast (graph): supported in graph mode but unsupported in eager" in p for p in problems)
    assert table_problems(_Named(), {"all_reduce": "native"}) == [
        "capabilities() returned dict, not an xccl.CapabilityTable"
    ]


def test_builtin_tables_are_well_formed():
    for name in ("cpu", "cuda"):
        plugin = xccl.Registry().get(name)
        assert table_problems(plugin, plugin.capabilities()) == []


def test_identity_check():
    info = PluginInfo("other-name", Status.AVAILABLE, plugin=_Named())
    problems = identity_problems(info, _Named(), ProbeResult.unavailable("no device"))
    assert any("entry point is named 'other-name'" in p for p in problems)
    assert any("without both a reason and a fix" in p for p in problems)
    assert identity_problems(PluginInfo("named", Status.AVAILABLE), _Named(), ProbeResult.ok()) == []


def test_comm_name_check():
    good = [
        {"world": "w", "world again": "w", "every rank, group a": "a", "every rank, group b": "b",
         "every rank, group a again": "a", "half low": "l"},
        {"world": "w", "world again": "w", "every rank, group a": "a", "every rank, group b": "b",
         "every rank, group a again": "a", "half high": "h"},
    ]
    assert comm_name_problems(good) == []
    shared = [dict(r, **{"every rank, group b": "a"}) for r in good]
    assert any("two different groups share a name" in p for p in comm_name_problems(shared))
    disagree = [good[0], dict(good[1], world="w2", **{"world again": "w2"})]
    assert any("members of world disagree" in p for p in comm_name_problems(disagree))
    unstable = [dict(good[0], **{"world again": "x"}), good[1]]
    assert any("changed between calls" in p for p in comm_name_problems(unstable))


def test_discovery_check_allows_the_plugin_xccl_deps_and_stdlib_only():
    found = {"new": ["json", "numpy", "my_plugin", "torch_npu", "not_installed_anywhere"], "dist": "",
             "module": "my_plugin._plugin"}
    assert foreign_imports(found) == ["torch_npu (a vendor SDK)", "not_installed_anywhere (from no installed distribution)"]


def test_world_sizes_option_is_validated():
    assert parse_world_sizes("2, 4,8") == (2, 4, 8)
    for bad in ("", "two", "1,2"):
        with pytest.raises(pytest.UsageError):
            parse_world_sizes(bad)


# ------------------------------------------------------------------------------------ the command line


def _pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run ``pytest ARGS`` in a fresh interpreter from ``tmp_path``; returns the process and outcome per test."""
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}, check=False,
    )
    outcomes: dict[str, str] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name", "")] = kinds[0] if kinds else "passed"
    return proc, outcomes


def test_cli_option_collects_only_the_suite_and_runs_it(tmp_path):
    (tmp_path / "test_unrelated.py").write_text("def test_unrelated():\n    raise AssertionError('must not run')\n")
    proc, outcomes = _pytest(tmp_path, "--xccl-plugin", "cpu", "-k", "identity or well_formed")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outcomes == {
        "test_plugin_is_listed_with_a_consistent_identity": "passed",
        "test_capability_table_is_well_formed": "passed",
    }


def test_cli_reports_an_incompatible_or_missing_plugin_clearly(tmp_path):
    proc, _ = _pytest(tmp_path, "--xccl-plugin", "old-api", "-k", "identity")
    assert proc.returncode == 1
    assert (f"plugin 'old-api' is incompatible: written for plugin API 0, this xccl speaks {xccl.PLUGIN_API_VERSION}"
            in proc.stdout)
    proc, _ = _pytest(tmp_path, "--xccl-plugin", "no-such-plugin", "-k", "identity")
    assert proc.returncode == 1 and "no xccl plugin named 'no-such-plugin' is installed" in proc.stdout
    proc, _ = _pytest(tmp_path, "--xccl-plugin", "cpu", "--xccl-world-sizes", "1")
    assert proc.returncode != 0 and "every world size must be at least 2" in proc.stderr


# A plugin that breaks the contract four ways: its discovery imports an "SDK", its table claims gloo runs every
# reduce op on every dtype, its native uneven all_gather kernel returns zeros, and every group has the same name.
# (A kernel taking other arguments than xccl passes is refused by xccl.init itself: tests/test_plugin_contract.py.)
_LYING_PLUGIN = '''
import torch
import torch.distributed as dist
import lying_vendor_sdk  # noqa: F401  - the SDK, imported at discovery: the mistake the suite must catch
from xccl.plugin import CapabilityTable, Collective, Level, Mode, Plugin, Runtime, Support

EVERYTHING = Support(Level.NATIVE)   # no dtype or reduce-op limits: a lie on gloo (band on floats raises)


def zeros_kernel(ctx, output, input, sizes, async_op):
    output.zero_()                   # "native" uneven all_gather that computes nothing


class LyingRuntime(Runtime):
    def kernels(self):
        return {Collective.ALL_GATHER_INTO_TENSOR_UNEVEN: zeros_kernel}

    def comm_name(self, group):
        return "the-only-communicator"


class LyingPlugin(Plugin):
    name = "lying"
    vendor = "tests"
    device_type = "cpu"
    backend = "gloo"
    accelerator = False

    def capabilities(self):
        entries = {(op, m): Support(Level.UNSUPPORTED) for op in Collective for m in Mode}
        for op in Collective:
            entries[(op, Mode.EAGER)] = EVERYTHING
        for op in (Collective.MM_REDUCE_SCATTER, Collective.ALL_GATHER_MM, Collective.MM_ALL_REDUCE):
            entries[(op, Mode.EAGER)] = Support(Level.UNSUPPORTED)
        return CapabilityTable("lying", entries)

    def runtime(self, *, simulate):
        return LyingRuntime(self, simulate=simulate)


plugin = LyingPlugin()
'''


def _install_lying_plugin(root: Path) -> None:
    """An importable plugin distribution without pip: a module and a .dist-info directory on PYTHONPATH."""
    (root / "lying_plugin.py").write_text(_LYING_PLUGIN)
    (root / "lying_vendor_sdk.py").write_text("LOADED = True\n")
    info = root / "xccl_lying-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xccl-lying\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[xccl.plugins]\nlying = lying_plugin:plugin\n")


def test_suite_fails_a_plugin_that_breaks_the_contract(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install_lying_plugin(site)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    proc, outcomes = _pytest(
        tmp_path, "--xccl-plugin", "lying", "--xccl-world-sizes", "2", "-k", "not graph", env={"PYTHONPATH": path}
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    expected = {
        "test_plugin_is_listed_with_a_consistent_identity": "passed",
        "test_capability_table_is_well_formed": "passed",
        "test_discovery_imports_no_vendor_sdk": "failure",
        "test_kernels_take_the_arguments_xccl_passes": "passed",
        "test_eager[2ranks-all_reduce]": "failure",          # band on float32 raised in gloo
        "test_eager[2ranks-all_gather_into_tensor_uneven]": "failure",  # zeros
        "test_eager[2ranks-broadcast]": "passed",
        "test_eager[2ranks-mm_all_reduce]": "skipped",
        "test_unsupported_shapes_raise_before_communicating[2ranks]": "passed",
        "test_comm_names_are_unique_per_group_and_stable[2ranks]": "failure",
    }
    assert {k: outcomes.get(k) for k in expected} == expected, out[-5000:]
    assert "imported lying_vendor_sdk (from no installed distribution)" in out
    # gloo refuses band on floats; torch 2.7's refuses avg too, which the kit may report first there.
    assert re.search(r"all_reduce float32 (band|avg) \(native\)", out), out[-5000:]
    # One line for the calls that failed alike (sync and async), then what the first one returned.
    assert re.search(r"all_gather_into_tensor_uneven float32 \(native\)[^:]*: output 0: values", out), out[-5000:]
    assert "two different groups share a name" in out

