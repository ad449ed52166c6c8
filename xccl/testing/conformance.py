"""The conformance suite: what every xccl plugin must do, checked by running it.

A plugin distribution runs it against itself, either from the command line::

    pytest --xccl-plugin NAME                     # on the plugin's hardware
    pytest --xccl-plugin NAME --xccl-simulate     # in xccl's CPU simulation of the vendor
    pytest --xccl-plugin NAME --xccl-world-sizes 2,4,8 --xccl-compile-backend inductor

or from a test file of its own, so that a plain ``pytest`` run includes it::

    from xccl.testing.conformance import suite

    TestMyVendorConformance = suite("myvendor", simulate=True)

It checks behaviour, not instantiation: every claim of the plugin's table against the operation's mathematical
result (:mod:`._reference`), refusals before any communication, graph mode, DDP and FSDP2 steps, communicator
names, and the vendor's run time it declares (:mod:`._runtime_bodies`). docs/plugin-guide.md, "The conformance
kit", lists each test and what to fix when it fails. The calls are batched: one :class:`~xccl.testing.RankPool`
run per world size executes every op, and the per-op tests read its report.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, final

import pytest

from xccl.plugin._capabilities import Collective, Level
from xccl.plugin._contract import Plugin
from xccl.plugin._registry import PluginInfo, Status, default_registry

from . import _bodies, _runtime_bodies, _stacks
from ._batches import Batches as _Batches
from ._checks import (
    KNOWN_SDKS,
    comm_name_problems,
    discovery_imports,
    foreign_imports,
    identity_problems,
    table_problems,
)
from ._claims import tried_dtypes

__all__ = [
    "KNOWN_SDKS",
    "Conformance",
    "Target",
    "comm_name_problems",
    "foreign_imports",
    "identity_problems",
    "parse_world_sizes",
    "suite",
    "table_problems",
]

#: World sizes the multi-rank checks run at, unless ``--xccl-world-sizes`` or the suite says otherwise.
DEFAULT_WORLD_SIZES: Final = (2, 4)
#: ``torch.compile`` backend for the graph-mode checks, unless ``--xccl-compile-backend`` says otherwise:
#: aot_eager traces and functionalises exactly as Inductor does, without compiling C++ (seconds, not minutes).
DEFAULT_COMPILE_BACKEND: Final = "aot_eager"
_COLLECTIVE_TIMEOUT: Final = 60.0


@final
@dataclass(frozen=True)
class Target:
    """The plugin under test and how to run it."""

    #: Entry-point name.
    name: str
    #: Run in xccl's CPU simulation of the vendor.
    simulate: bool
    #: What discovery reported.
    info: PluginInfo
    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
    compile_backend: str = DEFAULT_COMPILE_BACKEND
    #: Extra environment for the rank processes.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def plugin(self) -> Plugin:
        """The loaded plugin object."""
        if self.info.plugin is None:  # pragma: no cover - Target is built only for loaded plugins
            raise RuntimeError(f"plugin {self.name!r} did not load")
        return self.info.plugin

    @property
    def mode(self) -> str:
        """``"simulated"`` or ``"on hardware"``, for messages."""
        return "simulated" if self.simulate else "on hardware"

    def init_kwargs(self) -> dict[str, Any]:
        """What each rank passes to ``xccl.init``: emulations allowed silently, a collective timeout short
        enough that a hang becomes a report within a minute."""
        return {"vendor": self.name, "simulate": self.simulate, "fallback": "emulate", "timeout": _COLLECTIVE_TIMEOUT}

    def cannot_run(self, world_size: int) -> str | None:
        """Why ranks of this plugin cannot start here at ``world_size`` (a skip reason), or None."""
        if self.simulate:
            return None
        if self.info.status is not Status.AVAILABLE:
            hint = " (or test it in simulation: --xccl-simulate)" if self.plugin.simulation() is not None else ""
            return f"plugin {self.name!r} is unavailable here: {self.info.reason}{hint}"
        devices = self.info.facts.get("devices", "")
        if self.plugin.device_type != "cpu" and devices.isdigit() and int(devices) < world_size:
            return f"{world_size} ranks need {world_size} {self.plugin.device_type} devices; {devices} visible"
        return None


def _target(request: pytest.FixtureRequest) -> Target:
    cls = request.cls
    config = request.config
    name = getattr(cls, "xccl_plugin", None) or config.getoption("xccl_plugin", None)
    if not name:
        pytest.fail("no plugin to test: run pytest --xccl-plugin NAME, or bind the suite with "
                    "xccl.testing.conformance.suite(NAME)", pytrace=False)
    simulate = getattr(cls, "xccl_simulate", None)
    simulate = bool(config.getoption("xccl_simulate", False)) if simulate is None else simulate
    infos = default_registry().infos()
    info = infos.get(name)
    if info is None:
        pytest.fail(
            f"no xccl plugin named {name!r} is installed (discovered: {', '.join(infos) or 'none'}). Install its "
            "distribution in this environment (pip install -e .) and check its [project.entry-points.\"xccl.plugins\"]",
            pytrace=False,
        )
    if info.status in (Status.FAILED, Status.INCOMPATIBLE) or info.plugin is None:
        pytest.fail(f"plugin {name!r} is {info.status}: {info.reason}. Fix: {info.fix}", pytrace=False)
    if simulate and info.plugin.simulation() is None:
        pytest.fail(f"--xccl-simulate: plugin {name!r} has no CPU simulation (its simulation() returns None)",
                    pytrace=False)
    sizes = getattr(cls, "xccl_world_sizes", None) or _sizes_option(config)
    backend = getattr(cls, "xccl_compile_backend", None) or config.getoption("xccl_compile_backend", None)
    env = dict(getattr(cls, "xccl_env", None) or {})
    return Target(name, simulate, info, tuple(sizes), backend or DEFAULT_COMPILE_BACKEND, env)


def _sizes_option(config: pytest.Config) -> tuple[int, ...]:
    raw = config.getoption("xccl_world_sizes", None)
    return parse_world_sizes(raw) if raw else DEFAULT_WORLD_SIZES


def parse_world_sizes(raw: str) -> tuple[int, ...]:
    """``"2,4"`` -> ``(2, 4)``; raises ``pytest.UsageError`` for anything but integers >= 2."""
    try:
        sizes = tuple(int(p) for p in raw.split(",") if p.strip())
    except ValueError:
        raise pytest.UsageError(f"--xccl-world-sizes={raw!r}: expected integers separated by commas, e.g. 2,4") from None
    if not sizes or any(s < 2 for s in sizes):
        raise pytest.UsageError(f"--xccl-world-sizes={raw!r}: every world size must be at least 2")
    return sizes


_OPS: Final = list(Collective)


class Conformance:
    """The conformance tests. Not collected itself: :func:`suite` makes a collected subclass bound to a plugin,
    and ``pytest --xccl-plugin NAME`` collects :class:`TestConformance` from this module."""

    __test__ = False
    #: Entry-point name of the plugin under test; None reads ``--xccl-plugin``.
    xccl_plugin: ClassVar[str | None] = None
    #: Test in simulation; None reads ``--xccl-simulate``.
    xccl_simulate: ClassVar[bool | None] = None
    #: World sizes; None reads ``--xccl-world-sizes`` (default 2 and 4).
    xccl_world_sizes: ClassVar[tuple[int, ...] | None] = None
    #: torch.compile backend of the graph checks; None reads ``--xccl-compile-backend`` (default aot_eager).
    xccl_compile_backend: ClassVar[str | None] = None
    #: Extra environment for the rank processes (a rank table path, a chip map...).
    xccl_env: ClassVar[Mapping[str, str] | None] = None

    @pytest.fixture(scope="class")
    @classmethod
    def xccl_target(cls, request: pytest.FixtureRequest) -> Target:
        """The plugin under test."""
        return _target(request)

    @pytest.fixture(scope="class")
    @classmethod
    def xccl_batches(cls, xccl_target: Target) -> Iterator[_Batches]:
        """The batched rank runs of this suite, each run once; the ranks stop with the suite."""
        with tempfile.TemporaryDirectory(prefix="xccl-conformance-") as workdir, \
                contextlib.closing(_Batches(xccl_target, workdir)) as batches:
            yield batches

    # -- static

    def test_plugin_is_listed_with_a_consistent_identity(self, xccl_target: Target) -> None:
        """Listed (not failed, same plugin API), entry-point name = Plugin.name, probe with reason and fix."""
        plugin = xccl_target.plugin
        problems = identity_problems(xccl_target.info, plugin, plugin.probe())
        assert not problems, "\n".join(problems)

    def test_capability_table_is_well_formed(self, xccl_target: Target) -> None:
        """The table is valid data, stable between calls, and names only emulations xccl has."""
        plugin = xccl_target.plugin
        table = plugin.capabilities()
        problems = table_problems(plugin, table)
        if not problems and plugin.capabilities().to_dict() != table.to_dict():
            problems.append("capabilities() returns a different table on a second call")
        assert not problems, "\n".join(problems)

    def test_discovery_imports_no_vendor_sdk(self, xccl_target: Target) -> None:
        """Loading the entry point, probing and reading the table import no vendor SDK (in a fresh interpreter)."""
        found = discovery_imports(xccl_target.name)
        bad = foreign_imports(found)
        assert not bad, (
            f"discovering plugin {xccl_target.name!r} imported {', '.join(bad)}. The entry point must be a cheap "
            "probe: import the vendor SDK inside Plugin.runtime(), once the plugin is selected"
        )

    # -- behaviour on ranks

    def test_kernels_take_the_arguments_xccl_passes(self, xccl_target: Target, xccl_batches: _Batches) -> None:
        """Every kernel ``Runtime.kernels()`` returns accepts its op's ``xccl.plugin.KERNEL_SIGNATURES``."""
        problems = xccl_batches.values("kernels", xccl_target.world_sizes[0], _bodies.kernel_signature_problems,
                                       failed="checking the kernels failed")[0]
        assert not problems, f"kernels of {xccl_target.name}:\n" + "\n".join(problems)

    @pytest.mark.parametrize("op", _OPS, ids=str)
    def test_eager(self, xccl_target: Target, xccl_batches: _Batches, xccl_world_size: int, op: Collective) -> None:
        """Every call shape the table claims runs and returns the operation's mathematical result."""
        table = xccl_target.plugin.capabilities()
        rep = xccl_batches.report("eager", xccl_world_size, _bodies.eager_batch)[op.value]
        where = f"{op.value} on {xccl_target.name} ({xccl_target.mode}, {xccl_world_size} ranks)"
        assert not rep["failures"], where + ":\n" + "\n".join(rep["failures"])
        if table.entry(op).level is Level.UNSUPPORTED:
            pytest.skip("marked unsupported: test_unsupported_shapes_raise_before_communicating checks it")
        if not rep["ran"] and rep["skipped"]:
            pytest.skip("; ".join(rep["skipped"]))
        assert rep["ran"], (
            f"{op.value} is marked {table.entry(op).level.value}, but none of the call shapes tried "
            f"({', '.join(str(d).removeprefix('torch.') for d in tried_dtypes(table.entry(op), op))}) is supported at {xccl_world_size} "
            "ranks: the claim is never exercised"
        )

    def test_unsupported_shapes_raise_before_communicating(
        self, xccl_target: Target, xccl_batches: _Batches, xccl_world_size: int
    ) -> None:
        """Every call shape the table refuses raises UnsupportedCollective on a rank that calls it alone."""
        reports = xccl_batches.report("refusals", xccl_world_size, _bodies.refusal_batch)
        failures = [msg for rep in reports.values() for msg in rep["failures"]]
        assert not failures, "\n".join(failures)

    def test_graph_mode_claims_hold(self, xccl_target: Target, xccl_batches: _Batches) -> None:
        """Every graph-mode claim compiles with fullgraph=True and returns what eager returns (smallest world)."""
        if importlib.util.find_spec("xccl.graph") is None:
            pytest.skip("xccl's graph path (xccl.graph) is not part of this xccl: graph claims are not checked")
        table = xccl_target.plugin.capabilities()
        size = min(xccl_target.world_sizes)
        claimed = _bodies.graph_ops(table, size)
        if not claimed:
            pytest.skip(f"{xccl_target.name} claims no op in graph mode")
        reports = xccl_batches.report("graph", size, _bodies.graph_batch, xccl_target.compile_backend)
        failures = [msg for rep in reports.values() for msg in rep["failures"]]
        assert not failures, "\n".join(failures)
        missing = [op.value for op in claimed if not reports[op.value]["ran"]]
        assert not missing, f"graph claims not exercised: {missing}"

    def test_barrier_holds_every_rank_until_the_last_entered(
        self, xccl_target: Target, xccl_batches: _Batches, xccl_world_size: int
    ) -> None:
        """The vendor's runtime behaviour behind ``barrier`` (its ``VendorRuntime.completion``; SCCL's works are
        complete at once): code orders host-side steps with it, so no rank may leave before the last entered."""
        if not xccl_target.plugin.capabilities().supports(Collective.BARRIER, world_size=xccl_world_size):
            pytest.skip(f"{xccl_target.name} has no barrier at {xccl_world_size} ranks")
        times = xccl_batches.values("barrier", xccl_world_size, _bodies.barrier_holds, failed="barrier failed")
        last = max(t["entered"] for t in times)
        early = {r: round(last - t["left"], 3) for r, t in enumerate(times) if t["left"] < last - 0.05}
        assert not early, f"ranks left the barrier this many seconds before the last rank entered it: {early}"

    @pytest.mark.parametrize("stack", list(_stacks.needs))
    def test_training_steps_match_a_single_process(
        self, xccl_target: Target, xccl_batches: _Batches, xccl_world_size: int, stack: str
    ) -> None:
        """DDP and FSDP2 steps match one process on the whole batch. Both stacks run in one batch; each is its own
        test, so that one skipped is reported while the other passes."""
        outs = xccl_batches.values("stacks", xccl_world_size, _stacks.training_steps,
                                   failed="the training steps raised")
        failed = [f"rank {r}: {out[stack]['failed']}" for r, out in enumerate(outs) if "failed" in out[stack]]
        assert not failed, "\n".join(failed)
        if "skipped" in outs[0][stack]:
            pytest.skip(f"{stack}: {outs[0][stack]['skipped']}")

    def test_comm_names_are_unique_per_group_and_stable(
        self, xccl_target: Target, xccl_batches: _Batches, xccl_world_size: int
    ) -> None:
        """Every member gets the same name, twice; two groups (even over the same ranks) never share one."""
        names = xccl_batches.values("names", xccl_world_size, _bodies.comm_names, failed="comm_name failed")
        assert not (problems := comm_name_problems(names)), "\n".join(problems)


    # -- the vendor's run time

    def _runtime_report(self, target: Target, batches: _Batches) -> dict[str, list[str]]:
        env = _runtime_bodies.short_timeouts(target.plugin.vendor_runtime()) if target.simulate else {}
        env = {k: v for k, v in env.items() if k not in target.env}  # the suite's own settings win
        outs = batches.values("runtime", min(target.world_sizes), _runtime_bodies.runtime_batch, env=env,
                              failed="runtime checks failed on some ranks (RankDied: killed, e.g. by the "
                              "vendor's watchdog)")
        return _runtime_bodies.merged(list(enumerate(outs)))

    @pytest.mark.parametrize("behaviour", ["watchdog", "connect", "patches"])
    def test_vendor_runtime(self, xccl_target: Target, xccl_batches: _Batches, behaviour: str) -> None:
        """What the plugin declares in vendor_runtime() holds on ranks: xccl's policy on the vendor's watchdog,
        lazy connect and patches, and (in simulation) the simulated vendor's failures, typed."""
        declared = xccl_target.plugin.vendor_runtime()
        present = {"watchdog": declared.watchdog, "connect": declared.lazy_connect, "patches": declared.patches_on_import}
        if not present[behaviour]:
            pytest.skip(f"{xccl_target.name} declares no {behaviour}")
        report = self._runtime_report(xccl_target, xccl_batches)
        mine = {k: v for k, v in report.items() if k.startswith(behaviour)}
        failures = [f"{k}: {m}" for k, v in mine.items() for m in v if "skipped:" not in m]
        assert not failures, "\n".join(failures)
        ran = [k for k, v in mine.items() if not any("skipped:" in m for m in v)]
        if not ran:
            pytest.skip("; ".join(m for v in mine.values() for m in v))

    def test_simulated_patches_are_undone_at_shutdown(self, xccl_target: Target) -> None:
        """A simulated SDK applies the declared patches when the runtime loads it, and the runtime's shutdown
        puts torch's own functions back (in this process, where no world is needed)."""
        declared = xccl_target.plugin.vendor_runtime()
        applied = declared.patches_on_import
        if not xccl_target.simulate or not applied:
            pytest.skip("only a simulated SDK's patches can be undone" if applied else "no patches on import declared")
        before = _runtime_bodies.patch_targets(applied)
        runtime = xccl_target.plugin.runtime(simulate=True)
        try:
            during = _runtime_bodies.patch_targets(applied)
            kept = [t for t in before if during[t] is before[t]]
            assert not kept, f"the simulated SDK does not replace {kept}, which the plugin declares"
        finally:
            runtime.shutdown()
        after = _runtime_bodies.patch_targets(applied)
        left = [t for t in before if after[t] is not before[t]]
        assert not left, f"still replaced after the runtime's shutdown: {left}"


def suite(
    plugin: str,
    *,
    simulate: bool = False,
    world_sizes: tuple[int, ...] | None = None,
    compile_backend: str | None = None,
    env: Mapping[str, str] | None = None,
) -> type[Conformance]:
    """The conformance suite bound to ``plugin``, as a test class to assign in a test module.

    Args:
        plugin: the entry-point name.
        simulate: run the ranks in xccl's CPU simulation of the vendor.
        world_sizes: world sizes of the multi-rank checks (default: ``--xccl-world-sizes``, else 2 and 4).
        compile_backend: ``torch.compile`` backend of the graph checks (default: ``aot_eager``).
        env: extra environment for the rank processes.

    Example::

        # tests/test_myvendor_conformance.py
        from xccl.testing.conformance import suite

        TestMyVendorConformance = suite("myvendor", simulate=True)
    """
    attrs = {
        "__test__": True,
        "xccl_plugin": plugin,
        "xccl_simulate": simulate,
        "xccl_world_sizes": tuple(world_sizes) if world_sizes else None,
        "xccl_compile_backend": compile_backend,
        "xccl_env": dict(env or {}),
        "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
    }
    name = "Test" + "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", plugin) if p) + "Conformance"
    return type(name, (Conformance,), attrs)


class TestConformance(Conformance):
    """The suite for ``pytest --xccl-plugin NAME``: collected only when that option adds this module."""

    __test__ = True
