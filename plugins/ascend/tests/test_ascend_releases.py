"""The simulated torch_npu follows the release paired with the installed torch (``xccl_ascend._releases``): what
2.7.1 and 2.8.0 do otherwise than 2.13.0, read at the tags that built their wheels (Ascend/pytorch 9ae698c, def4860),
in the table, the simulated group, the watchdog and torch_npu's patches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import torch.distributed as dist
from xccl_ascend._releases import SIM_TORCH_NPU_ENV, paired, release

import xccl

pytestmark = pytest.mark.compat


@pytest.mark.parametrize(("torch_version", "npu"), [
    ("2.7.1+cu126", "2.7.1"), ("2.8.0", "2.8.0"), ("2.12.1", "2.12.0"), ("2.13.0+cpu", "2.13.0"), ("2.14.1", "2.13.0"),
])
def test_the_release_paired_with_torch(torch_version: str, npu: str) -> None:
    assert paired(torch_version) == npu


@pytest.mark.parametrize(("version", "env", "modes", "premul", "wide", "cann"), [
    ("2.8.0", "HCCL_ASYNC_ERROR_HANDLING", {0, 1}, False, False, "8.3.RC1"),
    ("2.7.1.post2", "HCCL_ASYNC_ERROR_HANDLING", {0, 1, 2, 3}, False, False, "8.5.0"),
    ("2.8.0.post4", "HCCL_ASYNC_ERROR_HANDLING", {0, 1, 2, 3}, True, True, "9.0.0"),
    ("2.7.1.post8", "HCCL_ASYNC_ERROR_HANDLING", {0, 1, 2, 3}, True, True, "9.1.0"),
    ("2.13.0", "TORCH_HCCL_ASYNC_ERROR_HANDLING", {0, 1, 2, 3}, True, True, "9.0.0"),
])
def test_what_each_release_does(version: str, env: str, modes: set[int], premul: bool, wide: bool, cann: str) -> None:
    """Each release's facts, and the CANN Ascend pairs with it (COMPATIBILITY.en.md), which the simulated CANN
    defaults to."""
    from xccl_ascend._torchair_sim import sim_cann_version

    r = release({SIM_TORCH_NPU_ENV: version})
    assert (r.mode_env, set(r.modes), r.premul_sum, r.wide_dtypes, r.cann) == (env, modes, premul, wide, cann)
    assert sim_cann_version({SIM_TORCH_NPU_ENV: version}) == cann


def test_simulation_follows_the_installed_torch_by_default() -> None:
    assert release({}).version == paired(torch.__version__)


def body_release_facts() -> dict[str, Any]:
    from xccl.collectives._state import PROCESS

    w = xccl.get_world()
    t = torch.ones(2) * (w.rank + 1)
    xccl.all_reduce(t, dist._make_nccl_premul_sum(2.0))  # 2 * (1 + 2)
    try:
        xccl.all_gather_into_tensor(torch.empty(4, dtype=torch.uint16), torch.ones(2, dtype=torch.uint16))
        uint16 = "moved"
    except xccl.UnsupportedCollective:
        uint16 = "refused"
    table = xccl.capabilities()
    return {
        "premul": t.tolist(),
        "premul_via_sum": table.resolve("all_reduce", dtype=torch.float32, reduce_op="premul_sum").premul_via_sum,
        "uint16": uint16,
        "watchdog": None if PROCESS.watchdog is None else PROCESS.watchdog.mode.value,
        "patched_backward": any(p.target.endswith("_AllGatherBase.backward")
                                for p in {i.name: i for i in xccl.plugins()}["ascend"].plugin.vendor_runtime().patches),
    }


@pytest.mark.parametrize(("npu", "want"), [
    ("2.8.0", {"premul": [6.0, 6.0], "premul_via_sum": True, "uint16": "refused", "watchdog": 1,
               "patched_backward": False}),
    ("2.13.0", {"premul": [6.0, 6.0], "premul_via_sum": False, "uint16": "moved", "watchdog": 2,
                "patched_backward": True}),
])
def test_a_simulated_release_runs_as_that_release(rank_pools: Any, npu: str, want: dict[str, Any]) -> None:
    """torch_npu 2.8.0 has no PREMUL_SUM (xccl scales then sums, the same result), moves no uint16, and takes only
    watchdog modes 0 and 1 (xccl leaves TearDown, where it sets CleanUpOnly on 2.13.0)."""
    pool = rank_pools.get(2, env={SIM_TORCH_NPU_ENV: npu}, vendor="ascend", simulate=True)
    outs = pool.run_ok(body_release_facts, timeout=120)
    assert outs == [want, want]


def test_a_mode_the_release_refuses_is_refused_at_init_with_its_words() -> None:
    """torch_npu 2.8.0 fails every group on HCCL_ASYNC_ERROR_HANDLING=2 ("should be 0 or 1."): xccl.init says so
    before any group exists."""
    code = textwrap.dedent("""
        import xccl
        try:
            xccl.init(vendor="ascend", simulate=True)
        except ValueError as exc:
            print(exc)
    """)
    env = {**os.environ, SIM_TORCH_NPU_ENV: "2.8.0", "HCCL_ASYNC_ERROR_HANDLING": "2", "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port())}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "HCCL_ASYNC_ERROR_HANDLING should be 0 or 1 (got HCCL_ASYNC_ERROR_HANDLING='2')" in out.stdout, out.stderr


def _port() -> int:
    from xccl.testing import free_port

    return free_port()
