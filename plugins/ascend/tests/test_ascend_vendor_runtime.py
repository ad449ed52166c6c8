"""The simulated torch_npu and HCCL against upstream, after the second runtime audit
(``shared/vendor-api/RUNTIME-AUDIT-2.md``; each test names its row).

Every behaviour is first made to behave as upstream does (Ascend/pytorch@462f4e1 and CANN's pages, cited in
``xccl_ascend._vendor``), then checked here:

* #3: CleanUpOnly (watchdog mode 2) only logs in torch_npu 2.13, so failure detection is bounded by
  HCCL_EXEC_TIMEOUT;
* #8: HCCL_CONNECT_TIMEOUT is taken within CANN's [120, 7200], with a warning;
* #9: a batch of point-to-point calls connects the whole group, a plain send/recv does not;
* #10: a communicator takes twice HCCL_BUFFSIZE, or twice its group's ``hccl_buffer_size``; HCCL_BUFFSIZE <= 0 is
  refused when the communicator is created;
* #12: only the development branches v2.7.1 and v2.9.0-v2.12.0 export all_to_all_vc;
* #15: ``dist.batch_isend_irecv`` takes torch_npu's branch for the simulated CANN and chip: by default torch's
  coalescing manager over xccl's send/recv;
* section 4, item 2: all_gather_into_tensor / reduce_scatter_tensor on 3, 5, 6 or 7 ranks warn once per group.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.plugin import Collective, VendorRuntime
from xccl.testing import RankPool

ROOT = Path(__file__).resolve().parents[3]
SIM = {"XCCL_SIMULATE": "ascend"}
#: A connect timeout CANN takes, with the simulated connect shortened for the test (it waits 2 s, not 120).
CONNECT = {**SIM, "HCCL_CONNECT_TIMEOUT": "120", "XCCL_SIM_CONNECT_TIMEOUT": "2", "HCCL_EXEC_TIMEOUT": "8"}


def _planned(group: Any, op: Collective) -> bool:
    """Whether xccl's dispatch planned ``op`` on ``group`` (it does on the first call it sees)."""
    from xccl.collectives._groups import state_of

    return any(key[0] is op for key in state_of(group).plans)


def _connected(group: Any) -> bool | None:
    return {c.group: c for c in xccl.runtime.communicators()}[str(group.group_name)].connected


def _words(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------ #3: CleanUpOnly


def test_clean_up_only_is_declared_as_torch_npu_2_13_does_it() -> None:
    """#3: mode 2 neither aborts the communicators nor raises at the next wait() in torch_npu 2.13
    (ProcessGroupHCCL.hpp:244, .cpp:965-981, 1083-1094): the declaration and the Ascend page say so."""
    from xccl.plugin import ErrorHandling

    lines = inspect.getsource(ErrorHandling).splitlines()
    end = next(i for i, line in enumerate(lines) if "CLEAN_UP_ONLY = 2" in line)
    start = max(i for i in range(end) if not lines[i].strip().startswith("#:")) + 1
    declared = _words(" ".join(line.strip().removeprefix("#:") for line in lines[start:end]))
    assert "raised to Python" not in declared and "abort the communicators;" not in declared, declared
    assert "neither aborts the communicators nor raises" in declared, declared
    page = _words((ROOT / "docs/vendors/ascend.md").read_text(encoding="utf-8"))
    assert "Failure detection is bounded by `HCCL_EXEC_TIMEOUT` alone" in page


# ------------------------------------------------------------------------------- #8: HCCL_CONNECT_TIMEOUT


def test_connect_timeout_outside_canns_range_is_taken_as_the_nearest_bound() -> None:
    """#8: CANN takes HCCL_CONNECT_TIMEOUT in [120, 7200] only (envref_07_0077 / _0149): 2 is 120, 9000 is 7200."""
    from xccl_ascend._vendor import ascend_runtime

    lazy = ascend_runtime().lazy_connect
    assert lazy is not None
    assert [lazy.timeout({"HCCL_CONNECT_TIMEOUT": v}) for v in ("2", "600", "9000", "0", "x")] == [
        120, 600, 7200, 120, 120]
    assert lazy.timeout({}) == 120 and lazy.out_of_range({"HCCL_CONNECT_TIMEOUT": "600"}) is None
    message = lazy.out_of_range({"HCCL_CONNECT_TIMEOUT": "2"})
    assert message is not None and "[120, 7200]" in message and "taken as 120 s" in message, message


def test_the_simulated_connect_warns_and_gives_the_clamped_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """#8: a simulated group warns at creation, and its connect fails with the timeout HCCL would have taken
    (EI0006 with 120 s), after the shortened wait of the test."""
    from xccl_ascend._vendor import ascend_runtime

    from xccl.plugin._sim_runtime import GroupRuntime

    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "17")  # a value no other test uses: the warning is once per value
    monkeypatch.setenv("XCCL_SIM_CONNECT_TIMEOUT", "0.2")
    opts = SimpleNamespace(timeout=_dt.timedelta(seconds=60), group_rank=0, group_size=2, store=dist.HashStore())
    with pytest.warns(UserWarning, match=r"HCCL_CONNECT_TIMEOUT=17 is outside \[120, 7200\]"):
        runtime = GroupRuntime(VendorRuntime(lazy_connect=ascend_runtime().lazy_connect), opts, "ProcessGroupHCCL")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"EI0006.*timeout\[120 s\]"):
        runtime.before("allreduce")  # rank 1 never arrives
    assert time.monotonic() - started < 30


def test_the_first_hour_runtime_check_uses_a_connect_timeout_cann_takes() -> None:
    """#8: the first-hour command of the runtime checks must not set HCCL_CONNECT_TIMEOUT outside [120, 7200]."""
    from xccl_ascend._fidelity import HARDWARE

    commands = [command for _, command in HARDWARE if "test_vendor_runtime" in command]
    assert commands
    for command in commands:
        for value in re.findall(r"HCCL_CONNECT_TIMEOUT=(\d+)", command):
            assert 120 <= int(value) <= 7200, command


# --------------------------------------------------------------------------------------- #9, #15: batches


def body_point_to_point(cann: str, soc: str) -> dict[str, Any]:
    """A plain send/recv and a dist.batch_isend_irecv, each on a new group, with the simulated CANN and chip."""
    with mock.patch.dict(os.environ, {"XCCL_SIM_CANN_VERSION": cann, "XCCL_SIM_ASCEND_SOC": soc}):
        w = xccl.get_world()
        peer = 1 - w.rank
        plain, batch = dist.new_group(), dist.new_group()
        t, r = torch.full((2,), float(w.rank)), torch.empty(2)
        if w.rank == 0:
            dist.send(t, peer, plain)
            dist.recv(r, peer, plain)
        else:
            dist.recv(r, peer, plain)
            dist.send(t, peer, plain)
        plain_recv = r.tolist()
        r = torch.empty(2)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer, batch), dist.P2POp(dist.irecv, r, peer, batch)])
        for work in works:
            work.wait()
        return {"plain": (plain_recv, _connected(plain)), "batch": (r.tolist(), _connected(batch), len(works)),
                "through xccl": _planned(batch, Collective.SEND) and _planned(batch, Collective.RECV)}


@pytest.mark.parametrize(("cann", "soc", "through_xccl"), [
    ("9.0.0", "A2", True),  # the simulation's defaults: torch's coalescing manager over xccl's send/recv
    ("9.0.0", "A3", True),
    ("8.5.0", "A2", False),  # older CANN: HCCL's batch_isend_irecv, bypassing xccl
    ("9.0.0", "Ascend910ProA", False),  # not Atlas A2/A3
], ids=["cann9-a2", "cann9-a3", "cann8.5-a2", "cann9-910ProA"])
def test_batched_point_to_point_connects_the_group_and_takes_torch_npus_branch(
        rank_pools: Any, cann: str, soc: str, through_xccl: bool) -> None:
    """#9: a plain send/recv leaves the group unconnected (HCCL's pair communicator), a batch connects the group's
    communicator (batch_isend_irecv is a collective on it; coalesced sends use it). #15: torch_npu's branch follows
    the CANN and the chip (distributed_c10d.py:67,108-129), one work per batch either way."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_point_to_point, cann, soc)
    for rank, o in enumerate(outs):
        want = [float(1 - rank)] * 2
        assert o["plain"] == (want, False), o
        assert o["batch"] == (want, True, 1), o
        assert o["through xccl"] is through_xccl, o


def body_late_to_a_batch(delay: float) -> dict[str, str]:
    """Rank 1 reaches a new group's first batch ``delay`` seconds late."""
    w = xccl.get_world()
    g = dist.new_group()
    peer = 1 - w.rank
    if w.rank == 1:
        time.sleep(delay)
    try:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), peer, g),
                                        dist.P2POp(dist.irecv, torch.empty(2), peer, g)])
        for work in works:
            work.wait()
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": "", "message": "completed"}


def test_a_rank_late_to_a_groups_first_batch_is_a_connect_timeout() -> None:
    """#9: the first batch of a group connects it, so a member later than HCCL_CONNECT_TIMEOUT fails its peers
    with EI0006, typed and naming the late rank (a pipeline stage whose first batched send waits for a compile)."""
    with RankPool(2, {}, CONNECT, start_method="forkserver") as pool:
        outs = pool.run(body_late_to_a_batch, 3.0, timeout=60)
    assert all(o.ok for o in outs), "\n".join(map(str, outs))
    first, late = outs[0].value, outs[1].value
    assert first["type"] == late["type"] == "CollectiveTimeout", outs
    assert "HCCL_CONNECT_TIMEOUT" in first["message"] and "rank(s) [1]" in first["message"], first


def body_pipeline_stages(steps: int) -> list[list[float]]:
    """torch.distributed.pipelining's exchange (``_batch_p2p``: ``dist.batch_isend_irecv(ops).pop().wait()``):
    stage 0 sends activations forward and receives gradients back, stage 1 the reverse, ``steps`` times."""
    w = xccl.get_world()
    peer = 1 - w.rank
    seen = []
    for step in range(steps):
        out = torch.full((3,), float(10 * step + w.rank))
        into = torch.empty(3, requires_grad=False)
        ops = ([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)] if w.rank == 0 else
               [dist.P2POp(dist.irecv, into, peer), dist.P2POp(dist.isend, out, peer)])
        dist.batch_isend_irecv(ops).pop().wait()
        seen.append(into.tolist())
    return seen


def test_pipelining_style_batched_point_to_point_runs_on_simulated_ascend(rank_pools: Any) -> None:
    """#15: under the simulation's defaults (CANN 9.0, Atlas A2) torch_npu's batch_isend_irecv coalesces xccl's
    send/recv; pipelining's pattern (one work per batch, popped and waited) gives the right values."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_pipeline_stages, 3)
    for rank, seen in enumerate(outs):
        assert seen == [[float(10 * step + 1 - rank)] * 3 for step in range(3)], outs


# ------------------------------------------------------------------------------------------- #10: memory


def test_a_communicator_takes_twice_hccl_buffsize_or_its_groups_size() -> None:
    """#10: CANN's envref_07_0080: 2 x HCCL_BUFFSIZE per communicator; hccl_config['hccl_buffer_size'] replaces it
    for the group (ProcessGroupHCCL.cpp:3818-3824); torch_npu refuses HCCL_BUFFSIZE <= 0 (OptionsManager.cpp)."""
    from xccl_ascend._simprofile import SimHcclOptions
    from xccl_ascend._vendor import ascend_runtime

    memory = ascend_runtime().comm_memory
    assert memory is not None
    assert memory.comm_mb({}) == 400 and memory.comm_mb({"HCCL_BUFFSIZE": "50"}) == 100
    assert memory.comm_mb({}, SimHcclOptions(hccl_config={"hccl_buffer_size": 300})) == 600
    assert memory.comm_mb({}, SimHcclOptions(hccl_config={"group_name": "tp"})) == 400
    assert memory.p2p_comm_mb({}) == 40
    refusal = "HCCL_BUFFSIZE should be positive."
    assert [memory.refused({"HCCL_BUFFSIZE": v}) for v in ("0", "-1", "abc")] == [refusal] * 3
    assert memory.refused({}) is None and memory.refused({"HCCL_BUFFSIZE": "1"}) is None


def test_a_refused_hccl_buffsize_fails_the_simulated_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """#10: the simulated group refuses HCCL_BUFFSIZE=0 where torch_npu creates the communicator: at connect."""
    from xccl_ascend._vendor import ascend_runtime

    from xccl.plugin._sim_runtime import GroupRuntime

    monkeypatch.setenv("HCCL_BUFFSIZE", "0")
    declared = ascend_runtime()
    opts = SimpleNamespace(timeout=_dt.timedelta(seconds=60), group_rank=0, group_size=1, store=dist.HashStore())
    runtime = GroupRuntime(VendorRuntime(lazy_connect=declared.lazy_connect, comm_memory=declared.comm_memory), opts,
                           "ProcessGroupHCCL")
    with pytest.raises(RuntimeError, match="HCCL_BUFFSIZE should be positive"):
        runtime.before("allreduce")


def body_group_memory() -> dict[str, Any]:
    """What xccl.runtime.communicators() says of the world and of a group with its own hccl_buffer_size."""
    import xccl_ascend

    xccl_ascend.set_hccl_config({"hccl_buffer_size": 300}, ranks=[0, 1])
    try:
        g = xccl.new_group([0, 1])
    finally:
        xccl_ascend.set_hccl_config(None, ranks=[0, 1])
    held = {c.group: c for c in xccl.runtime.communicators()}
    return {"world": held["0"].memory_mb, "group": held[str(g.group_name)].memory_mb}


def test_communicators_report_each_groups_memory(rank_pools: Any) -> None:
    """#10: the world's communicator 400 MB by default, a group with hccl_buffer_size=300 600 MB."""
    outs = rank_pools.get(2, env=SIM).run_ok(body_group_memory)
    assert all(o == {"world": 400, "group": 600} for o in outs), outs


# --------------------------------------------------------------------------------------- #12: all_to_all_vc


@pytest.mark.parametrize(("release", "has"), [
    ("2.13.0", False), ("2.12.0", False), ("2.7.1", False), ("2.9.0.post8", False),  # release wheels
    ("v2.7.1", True), ("v2.9.0", True), ("v2.10.0", True), ("v2.11.0", True), ("v2.12.0", True),
    ("v2.8.0", False), ("v2.6.0", False),
    ("v2.7.1-7.2.0", False), ("v2.8.0-26.0.0", False), ("v2.12.0-26.1.0", False),
])
def test_only_the_development_branches_export_all_to_all_vc(release: str, has: bool) -> None:
    """#12: all_to_all_vc is on the development branches v2.7.1 and v2.9.0-v2.12.0 only; v2.8.0, every release
    branch (-7.x.0, -26.x.0) and the 2.13.0 tags lack it, so no release wheel has it."""
    from xccl_ascend._sdk_sim import SimSdk

    assert SimSdk({"XCCL_SIM_TORCH_NPU": release}).has_all_to_all_vc() is has


# ---------------------------------------------------------------------- section 4, item 2: world sizes


def body_documented_world_sizes() -> dict[str, Any]:
    """all_gather_into_tensor and reduce_scatter_tensor on a new group of every rank and on a group of 2, twice
    each (new groups: the pool's world may have warned in an earlier test)."""
    w = xccl.get_world()
    every, pair = xccl.new_group(), xccl.new_group([0, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.empty(2 * w.world_size)
        for _ in range(2):
            dist.all_gather_into_tensor(out, torch.full((2,), float(w.rank)), group=every)
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * w.world_size), group=every)
        if w.rank in (0, 1):
            dist.all_gather_into_tensor(torch.empty(4), torch.ones(2), group=pair)
    said = [str(c.message) for c in caught if "world sizes 3, 5, 6 and 7" in str(c.message)]
    return {"said": said, "gathered": out.tolist()}


def body_documented_dtypes() -> list[str]:
    """all_to_all_single in bfloat16 twice, in float32, and reduce_scatter_tensor in int64, on a new group."""
    w = xccl.get_world()
    g = xccl.new_group()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dt in (torch.bfloat16, torch.bfloat16, torch.float32):
            dist.all_to_all_single(torch.empty(2 * w.world_size, dtype=dt), torch.ones(2 * w.world_size, dtype=dt),
                                   group=g)
        dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.int64), torch.ones(2 * w.world_size, dtype=torch.int64),
                                   group=g)
    return [str(c.message) for c in caught if "documentation lists" in str(c.message)]


def test_documented_dtypes_warn_once_per_group_and_dtype(rank_pools: Any) -> None:
    """torch_npu 2.13's documentation lists float32 only for all_to_all(_single) and five dtypes for
    reduce_scatter(_tensor) (torch-distributed.md:319,339,359,379): one warning per group, op and dtype outside
    them, citing it; nothing refused, float32 says nothing."""
    for said in rank_pools.get(2, env=SIM).run_ok(body_documented_dtypes):
        assert [m.split(":")[1].split(" on ")[0].strip() for m in said] == [
            "all_to_all_single of torch.bfloat16", "reduce_scatter_tensor of torch.int64"], said
        assert all("torch-distributed.md:319,339,359,379" in m for m in said), said


def body_shrink_to_three() -> list[str]:
    """Every rank all-gathers (as FSDP2 does every step); ranks 0-2 then shrink the world of 4 to 3, rank 3 leaves."""
    w = xccl.get_world()
    dist.all_gather_into_tensor(torch.empty(2 * w.world_size), torch.ones(2))
    if w.rank == 3:
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.shrink_group([3])
    return [str(c.message) for c in caught if "shrinking to a world of 3" in str(c.message)]


def test_a_shrink_onto_a_documented_unsupported_size_warns(tmp_path: Any) -> None:
    """FSDP2's recovery 4 -> 3 lands on a size torch_npu documents as unsupported for all_gather_into_tensor and
    reduce_scatter_tensor (RUNTIME-AUDIT-3 L9): a job that used them is told so when it shrinks there."""
    with RankPool(4, {"timeout": 30}, SIM, start_method="forkserver", start_timeout=60) as pool:
        outs = pool.run_ok(body_shrink_to_three, timeout=120)
    for said in outs[:3]:
        assert len(said) == 1 and "all_gather_into_tensor do not support" in said[0], said
        assert "restart on a supported size instead (docs/elastic.md)" in said[0], said


def test_documented_world_sizes_warn_once_per_group(rank_pools: Any) -> None:
    """torch_npu 2.13's documentation excludes 3, 5, 6, 7 ranks for these ops (torch-distributed.md:300-301,
    339-341): one warning per such group, citing it, nothing refused; a group of 2 says nothing."""
    outs = rank_pools.get(3, env=SIM).run_ok(body_documented_world_sizes)
    for o in outs:
        assert len(o["said"]) == 1 and "torch-distributed.md:300-301,339-341" in o["said"][0], o
        assert o["gathered"] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0], o
