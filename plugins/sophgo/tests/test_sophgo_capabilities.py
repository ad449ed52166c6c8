"""The capability table: the seed's support table and the manifest, consistent with the simulation, in the docs."""

from __future__ import annotations

import pytest
import torch
from xccl_sophgo._simulation import NATIVE_OPS, sccl_profile
from xccl_sophgo._table import SCCL_DTYPES, sophgo_table

import xccl
from xccl import Collective, Level, Mode

C = Collective

#: Collective -> the c10d Backend method ProcessGroupSCCL would run it with.
C10D = {
    C.ALL_REDUCE: "allreduce", C.REDUCE: "reduce", C.BROADCAST: "broadcast", C.ALL_GATHER: "allgather",
    C.ALL_GATHER_INTO_TENSOR: "_allgather_base", C.GATHER: "gather", C.SCATTER: "scatter",
    C.ALL_TO_ALL_SINGLE: "alltoall_base", C.BARRIER: "barrier", C.REDUCE_SCATTER: "reduce_scatter",
    C.REDUCE_SCATTER_TENSOR: "_reduce_scatter_base", C.ALL_TO_ALL: "alltoall",
}


def test_same_table_through_the_public_api() -> None:
    assert xccl.capabilities("sophgo") is sophgo_table()


@pytest.mark.parametrize("op", list(C10D), ids=[op.value for op in C10D])
def test_native_exactly_where_the_simulated_sccl_has_the_method(op: Collective) -> None:
    native = sophgo_table().entry(op).level is Level.NATIVE
    assert native == (sccl_profile().refusal(C10D[op]) is None)


def test_seed_support_table() -> None:
    table = sophgo_table()
    # ✓ in the seed and implemented in the source.
    for op in (C.BROADCAST, C.ALL_REDUCE, C.REDUCE, C.ALL_GATHER, C.GATHER, C.SCATTER, C.BARRIER):
        assert table.entry(op).level is Level.NATIVE, op
    # ✖ in the seed: emulated.
    rs = table.entry(C.REDUCE_SCATTER_TENSOR)
    assert (rs.level, rs.via) == (Level.EMULATED, "all_to_all")
    assert table.entry(C.REDUCE_SCATTER).via == "reduce_scatter_tensor"
    # all_to_all ✓ in the seed, but only all_to_all_single exists in the source.
    assert table.entry(C.ALL_TO_ALL).via == "all_to_all_single"
    assert table.entry(C.ALL_TO_ALL_SINGLE_UNEVEN).via == "padding"


def test_send_recv_follow_the_documentation_and_say_so() -> None:
    for op in (C.SEND, C.RECV):
        entry = sophgo_table().entry(op)
        assert (entry.level, entry.via) == (Level.EMULATED, "host_gloo")
        assert "doc ✖" in entry.note and "scclSend/scclRecv" in entry.note
    assert NATIVE_OPS["send"] is None and NATIVE_OPS["recv"] is None  # what the source has


def test_dtypes_and_reduce_ops() -> None:
    table = sophgo_table()
    assert table.entry(C.ALL_REDUCE).dtypes == SCCL_DTYPES == sccl_profile().dtypes
    assert table.resolve(C.ALL_REDUCE, dtype=torch.bfloat16, reduce_op="max").level is Level.NATIVE
    avg = table.resolve(C.ALL_REDUCE, dtype=torch.float32, reduce_op="avg")
    assert avg.level is Level.EMULATED and avg.avg_via_sum
    for bad in ("band", "premul_sum"):
        assert table.resolve(C.ALL_REDUCE, dtype=torch.int32, reduce_op=bad).level is Level.UNSUPPORTED
    # float64: moved exactly as int64, never reduced through float32: its bits gathered, reduced locally.
    moved = table.resolve(C.BROADCAST, dtype=torch.float64)
    assert (moved.level, moved.cast) == (Level.EMULATED, torch.int64)
    for op in (C.ALL_REDUCE, C.REDUCE):
        f64 = table.resolve(op, dtype=torch.float64, reduce_op="sum")
        assert (f64.level, f64.via, f64.cast) == (Level.EMULATED, "all_gather", None)
    assert table.resolve(C.REDUCE_SCATTER_TENSOR, dtype=torch.float64, reduce_op="sum").level is Level.EMULATED
    assert table.resolve(C.ALL_REDUCE, dtype=torch.float64, reduce_op="band").level is Level.UNSUPPORTED
    # PREMUL_SUM, which SCCL refuses: a local scale then SUM, over floats only.
    premul = table.resolve(C.ALL_REDUCE, dtype=torch.bfloat16, reduce_op="premul_sum")
    assert (premul.level, premul.premul_via_sum) == (Level.EMULATED, True)
    # Complex tensors travel as views of their real parts (as torch.distributed does); MAX means nothing for them.
    cplx = table.resolve(C.ALL_GATHER, dtype=torch.complex64)
    assert (cplx.level, cplx.complex_view) == (Level.NATIVE, True)
    assert table.resolve(C.ALL_REDUCE, dtype=torch.complex64, reduce_op="max").level is Level.UNSUPPORTED
    c128 = table.resolve(C.ALL_REDUCE, dtype=torch.complex128, reduce_op="sum")  # as float64: gathered, reduced
    assert (c128.level, c128.via, c128.complex_view) == (Level.EMULATED, "all_gather", True)


def test_fallback_error_refuses_emulations() -> None:
    with pytest.raises(xccl.UnsupportedCollective, match="fallback policy is 'error'"):
        sophgo_table().require(C.REDUCE_SCATTER_TENSOR, dtype=torch.float32, reduce_op="sum", allow_emulated=False)
    sophgo_table().require(C.ALL_REDUCE, dtype=torch.float32, reduce_op="sum", allow_emulated=False)


def test_graph_mode_is_honest() -> None:
    # Nothing has been verified to compile through xccl's graph path on Sophgo yet.
    for op in C:
        entry = sophgo_table().entry(op, Mode.GRAPH)
        assert entry.level is Level.UNSUPPORTED and "not verified" in entry.note

