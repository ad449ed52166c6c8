"""Test plugins over gloo.

``gloo-emulated`` marks every op that has an emulation as emulated (and withholds AVG and bool from the native
reductions), so the emulation layer can be compared with gloo's native ops in the same run.
``gloo-emulated-ar`` does the same but emulates reduce_scatter through all_reduce + slice.
``fake-accel-a`` / ``fake-accel-b`` are accelerator plugins running on CPU/gloo whose probe reports them available
only when ``XCCL_TEST_FAKE_ACCEL`` names them (``a``, ``b`` or ``ab``): auto-detection tests.
``old-api`` targets another plugin API version.
"""

from __future__ import annotations

import functools
import os

import torch

from xccl.plugin import PORTABLE, CapabilityTable, Collective, Level, Plugin, ProbeResult, Support, table_from

C = Collective
_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64}
)
_REDUCING = Support(
    Level.NATIVE,
    dtypes=_DTYPES - {torch.float64},
    reduce_ops=frozenset({"sum", "product", "min", "max"}),
    cast_to={torch.bool: torch.uint8},
    dtype_via={torch.float64: "all_gather"},
    note="avg withheld (emulated as sum then divide); bool cast to uint8; float64 moved but reduced by xccl (as on "
    "SCCL and HCCL)",
)
_MOVING = Support(Level.NATIVE, dtypes=_DTYPES, cast_to={torch.bool: torch.uint8}, note="bool carried as uint8")


def _emulating_table(name: str, rs_via: str) -> CapabilityTable:
    eager = {op: _MOVING for op in C} | {
        C.ALL_REDUCE: _REDUCING,
        C.ALL_REDUCE_COALESCED: Support(Level.EMULATED, via="all_reduce"),
        C.ALL_GATHER_COALESCED: Support(Level.EMULATED, via="all_gather"),
        C.GATHER: Support(Level.EMULATED, via="all_gather"),
        C.RECV_ANY_SOURCE: Support(Level.EMULATED, via="host_gloo"),
        C.REDUCE: _REDUCING,
        C.REDUCE_SCATTER: Support(Level.EMULATED, via="reduce_scatter_tensor"),
        C.REDUCE_SCATTER_TENSOR: Support(Level.EMULATED, via=rs_via),
        C.ALL_TO_ALL: Support(Level.EMULATED, via="all_to_all_single"),
        C.ALL_TO_ALL_SINGLE_UNEVEN: Support(Level.EMULATED, via="padding"),
        C.SEND: Support(Level.EMULATED, via="host_gloo"),
        C.RECV: Support(Level.EMULATED, via="host_gloo"),
        C.BARRIER: Support(Level.NATIVE),
        **PORTABLE,
    }
    return table_from(name, eager)


class GlooEmulated(Plugin):
    """gloo with as much as possible emulated."""

    name = "gloo-emulated"
    vendor = "xccl tests"
    device_type = "cpu"
    backend = "gloo"
    accelerator = False

    def __init__(self, name: str = "gloo-emulated", rs_via: str = "all_to_all") -> None:
        self.name = name  # type: ignore[misc]
        self._rs_via = rs_via

    @functools.cache  # noqa: B019
    def capabilities(self) -> CapabilityTable:
        return _emulating_table(self.name, self._rs_via)


class FakeAccel(Plugin):
    """An accelerator plugin that runs on CPU, available only when XCCL_TEST_FAKE_ACCEL names it."""

    vendor = "xccl tests"
    device_type = "cpu"
    backend = "gloo"
    accelerator = True

    def __init__(self, letter: str) -> None:
        self.name = f"fake-accel-{letter}"  # type: ignore[misc]
        self._letter = letter

    def probe(self) -> ProbeResult:
        if self._letter in os.environ.get("XCCL_TEST_FAKE_ACCEL", ""):
            return ProbeResult.ok(devices="1")
        return ProbeResult.unavailable("no fake device", f"set XCCL_TEST_FAKE_ACCEL={self._letter}")

    @functools.cache  # noqa: B019
    def capabilities(self) -> CapabilityTable:
        from xccl import capabilities

        return capabilities("cpu")


class OldApi(Plugin):
    """Written for a plugin API that no longer exists."""

    name = "old-api"
    api_version = 0


gloo_emulated = GlooEmulated()
gloo_emulated_ar = GlooEmulated("gloo-emulated-ar", "all_reduce")
fake_accel_a = FakeAccel("a")
fake_accel_b = FakeAccel("b")
old_api = OldApi()
NOT_A_PLUGIN = 42
