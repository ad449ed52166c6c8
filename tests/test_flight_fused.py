"""A fused matmul + collective op is a call like any other: one flight-recorder entry under its own name.

On simulated Ascend, at shapes and a dtype its MC2 kernel takes (bfloat16, k = 256), ``xccl.mm_reduce_scatter`` runs
the vendor's native kernel, whose communication is inside the kernel on the hardware: the record must hold one entry
for the fused op (no ``broadcast`` or ``_reduce_scatter_base`` of the simulation's internals, which the hardware
would not make), read by torch's analyzer and ``xccl trace``; and a rank that never enters the fused op leaves the
others' entry started, named by both tools as where they wait.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import xccl
from xccl.testing import RankPool

TIMEOUT = 3.0
ANALYZER = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
# On Ascend a collective is bounded by HCCL_EXEC_TIMEOUT (xccl keeps the group's timeout above it).
ENV = {"XCCL_SIMULATE": "ascend", "HCCL_EXEC_TIMEOUT": str(int(TIMEOUT)), "XCCL_TRACE_POLL": "0.2"}


def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(dist.get_rank())
    a = torch.randn(4 * dist.get_world_size(), 256, generator=gen).div(16).bfloat16()
    return a, torch.randn(256, 8, generator=torch.Generator().manual_seed(7)).div(16).bfloat16()


def body_one_entry(prefix: str) -> list[tuple[str, Any, str]]:
    """One native mm_reduce_scatter (after the world's first collective); then dump: the entries the call made."""
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    from xccl.collectives._flight import FLIGHT

    xccl.barrier()
    ring = FLIGHT.ring
    assert ring is not None
    first = max(e.record_id for e in ring.entries()) + 1
    a, b = _operands()
    xccl.mm_reduce_scatter(a, b)
    xccl.dump_trace()
    return [(e.op, e.parts, "completed" if e.completed else "started") for e in ring.entries() if e.record_id >= first]


def body_skip_the_fused_op(prefix: str, skipper: int) -> str:
    """Every rank but ``skipper`` enters mm_reduce_scatter and times out inside it; the skipper waits elsewhere
    until it dumped (asked over the store)."""
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    xccl.barrier()
    if dist.get_rank() == skipper:
        mine = Path(f"{prefix}{skipper}")
        deadline = time.monotonic() + 3 * TIMEOUT + 10
        while not mine.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return "dumped" if mine.exists() else "never dumped"
    a, b = _operands()
    try:
        xccl.mm_reduce_scatter(a, b)
    except (xccl.CollectiveTimeout, xccl.PeerFailure) as exc:
        return type(exc).__name__
    return "completed?"


def _load(directory: Path) -> dict[int, dict[str, Any]]:
    return {int(f.name[5:]): pickle.loads(f.read_bytes()) for f in directory.iterdir()
            if f.name.startswith("rank_") and not f.name.endswith(".tmp")}


def test_the_native_fused_op_is_one_entry_under_its_own_name(tmp_path):
    with RankPool(2, {"timeout": TIMEOUT}, env=ENV, start_method="forkserver", start_timeout=120) as pool:
        got = pool.run_ok(body_one_entry, str(tmp_path / "rank_"), timeout=120)
    assert got == [[("mm_reduce_scatter", None, "completed")]] * 2, got
    dumps = _load(tmp_path)
    entry = dumps[0]["entries"][-1]
    # xccl's name for it, and the communication inside it as torch's analyzer knows it: a reduce-scatter of a @ b.
    assert (entry["xccl_op"], entry["state"], entry["xccl_parts"]) == ("mm_reduce_scatter", "completed", [])
    assert entry["profiling_name"] == "xccl:_reduce_scatter_base"
    assert (entry["input_sizes"], entry["output_sizes"], entry["input_dtypes"]) == ([[8, 8]], [[4, 8]], ["BFloat16"])
    assert entry["xccl_operands"] == [[[8, 256], "BFloat16"], [[256, 8], "BFloat16"]]
    run = subprocess.run([*ANALYZER, str(tmp_path), "-p", "rank_"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    trace = subprocess.run([sys.executable, "-m", "xccl", "trace", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert trace.returncode == 0, trace.stdout + trace.stderr


def test_a_rank_that_never_enters_the_fused_op_is_named_by_both_tools(tmp_path):
    with RankPool(2, {"timeout": TIMEOUT}, env=ENV, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_skip_the_fused_op, str(tmp_path / "rank_"), 1, timeout=4 * TIMEOUT + 60)
    assert outs[0].value in ("CollectiveTimeout", "PeerFailure"), [str(o) for o in outs]
    assert outs[1].value == "dumped", [str(o) for o in outs]
    dumps = _load(tmp_path)
    assert set(dumps) == {0, 1}
    hung = dumps[0]["entries"][-1]
    assert (hung["xccl_op"], hung["state"]) == ("mm_reduce_scatter", "started"), hung
    run = subprocess.run([*ANALYZER, str(tmp_path), "-p", "rank_"], capture_output=True, text=True, timeout=60)
    text = run.stdout + run.stderr
    assert "missing ranks: {1}" in text, text
    trace = subprocess.run([sys.executable, "-m", "xccl", "trace", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert trace.returncode == 1, trace.stderr
    assert "#2 mm_reduce_scatter not completed: entered by ranks [0]" in trace.stdout, trace.stdout
    assert "rank 1 never called #2" in trace.stdout, trace.stdout
