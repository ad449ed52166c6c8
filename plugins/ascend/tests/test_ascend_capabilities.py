"""The capability table: eager per manifest A3, graph per TorchAir's converters and seeds 000/001 with PyTorch
version gates."""

from __future__ import annotations

import pytest
import torch

import xccl
from xccl import Collective as C
from xccl import Level, Mode, UnsupportedCollective

TABLE = xccl.capabilities("ascend")


def test_plugin_is_discovered() -> None:
    info = {i.name: i for i in xccl.plugins()}["ascend"]
    assert info.plugin is not None and info.plugin.backend == "hccl" and info.plugin.device_type == "npu"
    assert info.target == "xccl_ascend._plugin:plugin"
    assert info.plugin.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"


@pytest.mark.parametrize("op", [C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER_TENSOR, C.ALL_TO_ALL, C.BROADCAST,
                                C.REDUCE, C.SCATTER, C.ALL_REDUCE_COALESCED, C.BARRIER, C.SEND, C.RECV, C.ALL_TO_ALL_SINGLE_UNEVEN,
                                C.ALL_GATHER_INTO_TENSOR_UNEVEN, C.REDUCE_SCATTER_TENSOR_UNEVEN,
                                C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE])
def test_every_op_is_native_in_eager(op: C) -> None:
    assert TABLE.entry(op).level is Level.NATIVE


@pytest.mark.parametrize(("release", "level"), [("2.13.0", Level.EMULATED), ("v2.12.0", Level.NATIVE),
                                                ("v2.7.1", Level.NATIVE), ("2.6.0", Level.EMULATED),
                                                ("2.12.0", Level.EMULATED), ("v2.8.0", Level.EMULATED)])
def test_all_to_all_v_follows_the_runtimes_probe_of_all_to_all_vc(release: str, level: Level) -> None:
    """The static table describes torch_npu 2.13.0, which has no all_to_all_vc; the runtime's probe of the
    installed release refines it, and its kernels offer all_to_all_vc only where the release has it."""
    from xccl_ascend import plugin
    from xccl_ascend._runtime import AscendRuntime
    from xccl_ascend._sdk_sim import SimSdk

    assert TABLE.entry(C.ALL_TO_ALL_V).level is Level.EMULATED and TABLE.entry(C.ALL_TO_ALL_V).via == "all_to_all_single"
    runtime = AscendRuntime(plugin, simulate=True, sdk=SimSdk({"XCCL_SIM_TORCH_NPU": release}))
    assert runtime.capabilities().entry(C.ALL_TO_ALL_V).level is level
    assert (C.ALL_TO_ALL_V in runtime.kernels()) is (level is Level.NATIVE)


@pytest.mark.parametrize(
    ("op", "dtype", "redop", "level"),
    [
        (C.ALL_REDUCE, torch.bfloat16, "sum", Level.NATIVE),
        (C.ALL_REDUCE, torch.float32, "avg", Level.NATIVE),
        (C.ALL_REDUCE, torch.float16, "premul_sum", Level.NATIVE),
        (C.ALL_REDUCE, torch.int32, "avg", Level.EMULATED),  # HCCL's in-place divide refuses integers
        (C.ALL_REDUCE, torch.int32, "premul_sum", Level.UNSUPPORTED),
        (C.ALL_REDUCE, torch.int64, "band", Level.UNSUPPORTED),
        (C.ALL_REDUCE, torch.float64, "sum", Level.EMULATED),  # moved, not reduced: gathered, reduced locally
        (C.REDUCE_SCATTER_TENSOR, torch.float64, "max", Level.EMULATED),
        (C.ALL_REDUCE, torch.float64, "bor", Level.UNSUPPORTED),
        (C.ALL_REDUCE, torch.uint16, "sum", Level.UNSUPPORTED),  # moved, but not even torch can add it
        (C.ALL_REDUCE, torch.bool, "sum", Level.NATIVE),  # cast to int32 by HCCL itself
        (C.REDUCE_SCATTER_TENSOR, torch.bool, "sum", Level.EMULATED),  # cast by xccl
        (C.REDUCE, torch.uint8, "max", Level.EMULATED),
        (C.REDUCE_SCATTER_TENSOR_UNEVEN, torch.float32, "avg", Level.EMULATED),
        (C.ALL_GATHER, torch.float64, None, Level.NATIVE),
        (C.BROADCAST, torch.bool, None, Level.NATIVE),
    ],
)
def test_dtypes_and_reduce_ops(op: C, dtype: torch.dtype, redop: str | None, level: Level) -> None:
    assert TABLE.resolve(op, dtype=dtype, reduce_op=redop).level is level


def test_bitwise_ops_name_hccl_message() -> None:
    with pytest.raises(UnsupportedCollective) as err:
        TABLE.require(C.ALL_REDUCE, dtype=torch.int32, reduce_op="bor")
    assert "'bor' is not supported" in str(err.value)
    assert "Cannot use ReduceOp.BAND with HCCL" in TABLE.entry(C.ALL_REDUCE).note


def test_gather_quirk_is_recorded() -> None:
    # torch_npu's torch.distributed.gather is an all_gather (gotcha 12): xccl gathers that way too, on purpose.
    entry = TABLE.entry(C.GATHER)
    assert (entry.level, entry.via) == (Level.EMULATED, "all_gather")
    assert "torch_npu replaces torch.distributed.gather with an all_gather" in entry.note


def test_what_hccl_lacks_is_emulated_or_refused() -> None:
    assert (TABLE.entry(C.ALL_GATHER_COALESCED).level, TABLE.entry(C.ALL_GATHER_COALESCED).via) == (
        Level.EMULATED, "all_gather")
    assert TABLE.resolve(C.RECV_ANY_SOURCE).level is Level.UNSUPPORTED
    assert "ProcessGroupHCCL does not support recv" in TABLE.resolve(C.RECV_ANY_SOURCE).reason


@pytest.mark.parametrize(
    ("op", "since"),
    [
        # _c10d_functional converters: TorchAir registers them from torch 2.3.1 (c10d_functional.py:73).
        (C.ALL_REDUCE, (2, 3, 1)), (C.ALL_GATHER, (2, 3, 1)), (C.ALL_GATHER_INTO_TENSOR, (2, 3, 1)),
        (C.ALL_TO_ALL, (2, 3, 1)), (C.ALL_TO_ALL_SINGLE, (2, 3, 1)), (C.BROADCAST, (2, 3, 1)),
        (C.REDUCE_SCATTER_TENSOR, (2, 6)), (C.ALL_GATHER_INTO_TENSOR_UNEVEN, (2, 6)),
        (C.REDUCE_SCATTER_TENSOR_UNEVEN, (2, 6)), (C.SEND, (2, 6)), (C.RECV, (2, 6)),
        (C.MM_REDUCE_SCATTER, (2, 1)),
    ],
)
def test_graph_mode_version_gates(op: C, since: tuple[int, ...]) -> None:
    entry = TABLE.entry(op, Mode.GRAPH)
    assert entry.level is Level.NATIVE and entry.min_torch == since
    assert entry.note.startswith("graph: ") and "Ascend/torchair@" in entry.note  # the form and its converter


@pytest.mark.parametrize("op", [C.REDUCE, C.GATHER, C.SCATTER, C.BARRIER, C.RECV_ANY_SOURCE])
def test_graph_mode_outside_torchair_list(op: C) -> None:
    assert TABLE.entry(op, Mode.GRAPH).level is Level.UNSUPPORTED


def test_table_renders_as_data() -> None:
    data = TABLE.to_dict()
    assert data["send"]["graph"]["min_torch"] == "2.6"  # type: ignore[index]
    assert "float64" not in data["all_reduce"]["eager"]["dtypes"]  # type: ignore[index]
    assert any("collective on Ascend" in n for n in TABLE.notes)


def test_fused_constraints_are_rendered() -> None:
    """The fused entries show their constraints (from _constraints.RULES), not "dtypes: all / reduce ops: all"."""
    from xccl.tools._render import render_markdown, render_text

    md = render_markdown({"ascend": TABLE}, (Mode.EAGER,))
    row = next(ln for ln in md.splitlines() if ln.startswith("| `mm_reduce_scatter` | eager"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[3:5] == ["per call (notes)", "per call (notes)"]
    assert "world size: A2: 2, 4, 8; A3: 2, 4, 8, 16, 32" in cells[6] and "reduce_op: 'sum'" in cells[6]
    assert "dtype: x1 float16 or bfloat16" in TABLE.entry(C.ALL_GATHER_MM).note
    assert "product line: Atlas A2 only" in render_text({"ascend": TABLE}, (Mode.EAGER,))
    ag = next(ln for ln in md.splitlines() if ln.startswith("| `all_gather` | eager"))
    assert "all + float8_e4m3fn, float8_e5m2, int16, uint16, uint32, uint64" in ag
