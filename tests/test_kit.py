"""The conformance kit tests a plugin's claims, not its agreement with itself.

Every dtype x reduce op x collective a table claims is called and compared with the operation's mathematical
result, computed on CPU from every rank's inputs (``xccl.testing._reference``), so a claim the library refuses
fails the kit even where the table and the simulation profile were written from the same wrong facts; claims xccl
never runs (avg over bool) fail the table check. Here: the reference itself, on every dtype a table may claim, and
the kit failing xccl-testplugins' ``bool-liar`` with messages that name the claim and the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xccl
from xccl.plugin import ALL_DTYPES, SimProfile
from xccl.testing._claims import async_shapes, shapes, tried_dtypes
from xccl.testing._reference import make, mismatch, reduce_ref

C = xccl.Collective


def _t(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values).to(dtype)


@pytest.mark.parametrize(
    ("op", "want"),
    [("sum", [0, 1, 1, 1]), ("max", [0, 1, 1, 1]), ("bor", [0, 1, 1, 1]), ("product", [0, 0, 0, 1]),
     ("min", [0, 0, 0, 1]), ("band", [0, 0, 0, 1]), ("bxor", [0, 1, 1, 0])],
)
def test_bool_reductions_are_logical(op: str, want: list[int]) -> None:
    a, b = _t([0, 0, 1, 1], torch.bool), _t([0, 1, 0, 1], torch.bool)
    assert reduce_ref([a, b], op).tolist() == [bool(v) for v in want]


def test_undefined_reductions_have_no_reference_and_match_nothing() -> None:
    x = _t([1, 0], torch.bool)
    for dtype, op in [(torch.bool, "avg"), (torch.bool, "premul_sum"), (torch.float32, "bxor"),
                      (torch.float8_e4m3fn, "band")]:
        want = reduce_ref([x.to(dtype), x.to(dtype)], op)
        assert want.numel() == 0, (dtype, op)
        assert "has no defined result" in (mismatch(x.to(dtype), want) or ""), (dtype, op)


def test_fixed_width_integers_wrap_and_avg_truncates() -> None:
    assert reduce_ref([_t([100, -100], torch.int8)] * 2, "sum").tolist() == [-56, 56]
    assert reduce_ref([_t([200], torch.uint8)] * 2, "sum").tolist() == [144]
    assert reduce_ref([_t([3, -3], torch.int32), _t([4, -4], torch.int32)], "avg").tolist() == [3, -3]
    assert reduce_ref([_t([3], torch.uint16), _t([4], torch.uint16)], "product").to(torch.int64).tolist() == [12]


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if not d.is_complex], ids=str)
def test_every_claimable_dtype_has_exact_inputs_and_a_reference(dtype: torch.dtype) -> None:
    xs = [make(r, (3, 2), dtype, 1) for r in range(4)]
    assert xs[0].dtype == dtype and len({tuple(x.to(torch.float64).flatten().tolist()) for x in xs}) > 1
    for op in ("sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul_sum"):
        want = reduce_ref(xs, op)
        if want.numel():
            assert mismatch(want.clone(), want) is None, (dtype, op)
            wide = torch.stack([x.to(torch.float64) for x in xs])
            if op == "sum" and dtype != torch.bool:  # small integers: exact in every dtype
                assert want.to(torch.float64).tolist() == wide.sum(0).tolist()


def test_the_kit_tries_every_claimed_dtype_and_reduce_op() -> None:
    table = xccl.capabilities("template")
    entry = table.entry(C.ALL_REDUCE)
    assert set(entry.dtypes or ()) <= set(tried_dtypes(entry, C.ALL_REDUCE))
    tried = shapes(table, C.ALL_REDUCE, 4)
    assert (torch.bool, "bxor") in {(d, r) for d, r, _ in tried}
    assert (torch.uint8, "band") in {(d, r) for d, r, _ in tried}
    # async once per way the op runs (native, avg as sum then divide, premul_sum as scale then sum), not per dtype
    assert {r for _, r in async_shapes(table, C.ALL_REDUCE, 4, tried)} == {"sum", "avg", "premul_sum"}


def test_sim_profile_reduce_ops_per_dtype_are_validated() -> None:
    with pytest.raises(ValueError, match=r"unknown reduce ops \['xor'\]"):
        SimProfile("acmecl", "ProcessGroupAcme", {}, frozenset({torch.bool}), frozenset({"sum"}), True,
                   dtype_reduce_ops={torch.bool: frozenset({"xor"})})
    profile = SimProfile("acmecl", "ProcessGroupAcme", {}, frozenset({torch.bool}), frozenset({"sum", "bxor"}), True,
                         dtype_reduce_ops={torch.bool: frozenset({"sum"})})
    assert profile.reduce_ops_for(torch.bool) == {"sum"} and profile.reduce_ops_for(torch.int8) == {"sum", "bxor"}


def test_the_kit_fails_a_plugin_that_claims_bool_avg_and_bxor_natively(tmp_path: Path) -> None:
    """xccl-testplugins' bool-liar: its simulated library reduces bool with sum, product, min and max only."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--xccl-plugin", "bool-liar",
         "--xccl-simulate", "--xccl-world-sizes", "2", "-k", "well_formed or eager and all_reduce"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=dict(os.environ), check=False,
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    assert "FAILED ::TestConformance::test_capability_table_is_well_formed" in out
    assert ("claims 'avg' over torch.bool, which means nothing there (xccl refuses such a call before any kernel "
            "runs, so the claim is never tested): remove 'avg' from Support.dtype_reduce_ops[torch.bool]") in out
    assert "FAILED ::TestConformance::test_eager[2ranks-all_reduce]" in out
    assert ("all_reduce bool bxor (native): SimulatedVendorError: ProcessGroupBoolLiar: unsupported reduce op "
            "ReduceOp.BXOR over torch.bool") in out
    assert "stop claiming it: remove 'bxor' from Support.dtype_reduce_ops[torch.bool] of the all_reduce entry" in out
    # The same failure on both ranks is said once.
    assert "every rank: all_reduce bool bxor" in out and "rank 1: all_reduce bool bxor" not in out
    # Everything the library does run passed: int64 bxor, bool sum and max, float32 avg (as sum then divide).
    assert "int64 bxor" not in out and "bool sum" not in out and "float32 avg" not in out


def test_the_kit_skips_a_stack_whose_calls_the_table_refuses_and_says_which() -> None:
    # DDP's constructor all-gathers every parameter's shape as int64 (from C++); a table that refuses that is a
    # skip with the reason, not a failed DDP check (a float-only vendor, as Habana's Gaudi reduces).
    from xccl.plugin import Collective as C
    from xccl.plugin import Level, Support
    from xccl.testing._stacks import refused

    cpu = xccl.capabilities("cpu")
    assert refused(cpu, "ddp", 2) == [] and refused(cpu, "fsdp2", 2) == []
    floats = frozenset({torch.float32, torch.float16, torch.bfloat16})
    float_only = cpu.with_entries({(C.ALL_GATHER, xccl.Mode.EAGER): Support(Level.NATIVE, dtypes=floats)})
    assert refused(float_only, "ddp", 2) == ["all_gather(int64)"]
    assert refused(float_only, "fsdp2", 2) == []
