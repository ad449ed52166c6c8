"""What Sophgo's runtime does on the first real machine, reproduced by the simulation; and xccl right under it.

Each case runs in fresh rank processes with exactly the variables its launcher sets (RankPool always sets
torchrun's and calls ``xccl.init`` first, so these fork their own ranks from a server that imported torch and xccl
once; the two-rank cases run one after the other in one pair of processes, each from a clean environment):

* the placement is chosen when the first group is created, once the launcher's variables exist: Lightning's
  launcher (``process_group_backend`` on rank 0 before ``WORLD_SIZE`` is set) and Ray Train's worker hook (no
  variable at all when the world is created);
* the placement follows ``xccl.init``'s own ``rank`` / ``world_size`` when no variable says them;
* ``torch_tpu.tpu.set_chip_map`` reads only ``LOCAL_WORLD_SIZE`` (default 1), so under mpirun xccl sets it for
  the call;
* Sophgo's torch adaptor (``import torch_tpu.accelerator`` with ``ENABLE_TORCH_ADAPTOR``) rewrites
  ``init_process_group``'s backend to ``sccl``: xccl refuses the world it did not get;
* SCCL's ``Work.wait()`` returns at once, barrier included: xccl's barrier still blocks the host.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.runtime import vendor_group
from xccl.testing import Outcome, free_port
from xccl.testing._pool import _describe

TIMEOUT = 90.0
#: Short enough that a rank left waiting by a broken peer fails the test quickly, long enough for 2 loaded cores.
INIT_TIMEOUT = datetime.timedelta(seconds=20)
#: What a launcher may set; every case starts without any of them and sets its own.
JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE", "CHIP_MAP", "RANK_TABLE_FILE", "XCCL_SIMULATE", "XCCL_VENDOR",
            "XCCL_CHECK", "ENABLE_TORCH_ADAPTOR", "DISABLE_ADAPTOR")

# ---------------------------------------------------------------------------------------------------------------
# Cases, run in fresh rank processes
# ---------------------------------------------------------------------------------------------------------------


def _facts(world: xccl.World | None = None) -> dict[str, Any]:
    """Where this rank computes and what its world's group was told, after a collective through torch and xccl
    (``xccl.init`` adopts a world a framework created)."""
    from xccl_sophgo._sdk import current_simulated_chip

    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    world = world or xccl.init()
    u = torch.full((2,), float(rank + 1))
    xccl.all_reduce(u)
    return {
        "backend": str(dist.get_backend()), "chip": current_simulated_chip(), "CHIP_MAP": os.environ.get("CHIP_MAP"),
        "chip_map": list(dist.group.WORLD.pg_options.chip_map),  # type: ignore[union-attr]
        "dist_all_reduce": t.tolist(), "xccl_all_reduce": u.tolist(), "want": [n * (n + 1) / 2] * 2,
        "world": (world.rank, world.world_size, world.local_rank, world.adopted),
    }


def case_lightning_order(rank: int, n: int, port: int) -> dict[str, Any]:
    """Lightning's subprocess launcher: rank 0 is the user's own process, which runs the script (so
    ``process_group_backend``) before the launcher sets ``WORLD_SIZE`` and starts the other ranks with it set;
    then ``_init_dist_connection`` creates the world with rank and size as arguments."""
    name = xccl.process_group_backend(vendor="sophgo", simulate=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                      NODE_RANK="0")
    dist.init_process_group(name, rank=rank, world_size=n, timeout=INIT_TIMEOUT)
    facts = _facts()
    xccl.shutdown()
    dist.destroy_process_group()
    return facts


def case_ray_order(rank: int, n: int, port: int) -> dict[str, Any]:
    """Ray Train's TorchTrainer: the worker hook runs with no launcher variable at all, the world is created with
    ``init_method``, rank and size as arguments, and Ray exports RANK, LOCAL_RANK, WORLD_SIZE... only after."""
    name = xccl.process_group_backend(vendor="sophgo", simulate=True)
    dist.init_process_group(name, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=INIT_TIMEOUT)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
    facts = _facts()
    xccl.shutdown()
    dist.destroy_process_group()
    return facts


def case_init_arguments(rank: int, n: int, port: int) -> dict[str, Any]:
    """``xccl.init`` told the job by its arguments; no launcher variable."""
    world = xccl.init(vendor="sophgo", simulate=True, rank=rank, world_size=n, init_method=f"tcp://127.0.0.1:{port}",
                      timeout=INIT_TIMEOUT)
    facts = _facts(world)
    xccl.shutdown()
    return facts


def case_mpirun(rank: int, n: int, port: int) -> dict[str, Any]:
    """Open MPI's variables only (mpirun sets no LOCAL_WORLD_SIZE); MASTER_ADDR/PORT exported by the user."""
    os.environ.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(n), OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                      OMPI_COMM_WORLD_LOCAL_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    facts = _facts(xccl.init(vendor="sophgo", simulate=True, timeout=INIT_TIMEOUT))
    facts["LOCAL_WORLD_SIZE"] = os.environ.get("LOCAL_WORLD_SIZE")  # set for set_chip_map only, then restored
    xccl.shutdown()
    return facts


def case_torch_adaptor(rank: int, n: int, port: int) -> dict[str, Any]:
    """``import torch_tpu.accelerator`` with the torch adaptor on (simulated by ``ENABLE_TORCH_ADAPTOR=1``)."""
    os.environ.update(ENABLE_TORCH_ADAPTOR="1", RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        world = xccl.init(vendor="sophgo", simulate=True, timeout=INIT_TIMEOUT)
    except xccl.InitError as exc:
        return {"raised": str(exc), "initialized": dist.is_initialized(),
                "init_process_group": dist.init_process_group.__module__}
    out = {"raised": None, "backend": str(dist.get_backend()), "process_group_backend": world.process_group_backend}
    xccl.shutdown()
    return out


def case_torch_adaptor_framework(rank: int, n: int, port: int) -> dict[str, Any]:
    """The same under a framework given xccl's backend name: the world it creates is the vendor's."""
    os.environ.update(ENABLE_TORCH_ADAPTOR="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    name = xccl.process_group_backend(vendor="sophgo", simulate=True)
    dist.init_process_group(name, rank=rank, world_size=n, timeout=INIT_TIMEOUT)
    dist.all_reduce(torch.ones(1))  # every rank's group is connected before any rank destroys its own
    out: dict[str, Any] = {"backend": str(dist.get_backend())}
    try:
        xccl.init()
        out["raised"] = None
        xccl.shutdown()
    except xccl.InitError as exc:
        out["raised"] = str(exc)
    out["initialized"] = dist.is_initialized()  # the framework's world: left to the framework
    dist.destroy_process_group()
    return out


CASES: Mapping[str, Callable[[int, int, int], dict[str, Any]]] = {
    "lightning": case_lightning_order,
    "ray": case_ray_order,
    "init-arguments": case_init_arguments,
    "mpirun": case_mpirun,
    "torch-adaptor": case_torch_adaptor,
    "torch-adaptor-framework": case_torch_adaptor_framework,
}


def _start_env(case: str, rank: int) -> dict[str, str]:
    """What the launcher set before the rank's script started: Lightning's launcher starts the other ranks with
    WORLD_SIZE and LOCAL_RANK set, but not rank 0 (the user's own process); the other cases set their own."""
    return {"WORLD_SIZE": "2", "LOCAL_RANK": str(rank)} if case == "lightning" and rank > 0 else {}


def _rank_main(cases: list[str], rank: int, n: int, ports: list[int], results: Any) -> None:
    """Run ``cases`` one after the other, each from a clean environment and leaving no world behind."""
    from xccl_sophgo import _adaptor_sim

    torch.set_num_threads(1)
    for case, port in zip(cases, ports, strict=True):
        for var in JOB_VARS:
            os.environ.pop(var, None)
        os.environ.update(_start_env(case, rank))
        started = time.monotonic()
        try:
            out = Outcome(rank, True, CASES[case](rank, n, port), elapsed=time.monotonic() - started)
        except BaseException as exc:  # every failure goes back to the test
            out = _describe(rank, exc, time.monotonic() - started)
        with contextlib.suppress(Exception):  # a failed case must not leave its world to the next
            xccl.shutdown()
            if dist.is_initialized():
                dist.destroy_process_group()
            _adaptor_sim.remove()
        results.put((case, out))


def _run(cases: list[str], n: int) -> dict[str, list[Outcome]]:
    """Run ``cases`` on ``n`` fresh ranks (one process each, forked from a server that imported torch and xccl);
    every case's outcome on every rank."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    results = ctx.Queue()
    ports = [free_port() for _ in cases]
    procs = [ctx.Process(target=_rank_main, args=(cases, r, n, ports, results), daemon=True)  # type: ignore[attr-defined]
             for r in range(n)]
    got: dict[str, dict[int, Outcome]] = {case: {} for case in cases}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + TIMEOUT * len(cases)
        while any(len(outs) < n for outs in got.values()):
            with contextlib.suppress(queue.Empty):
                case, out = results.get(timeout=0.5)
                got[case][out.rank] = out
                continue
            for r, p in enumerate(procs):
                if not p.is_alive():
                    for outs in got.values():
                        outs.setdefault(r, Outcome(r, False, error_types=("RankDied",),
                                                   message=f"exit code {p.exitcode}"))
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer in {TIMEOUT * len(cases):.0f}s: {got}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return {case: [outs[r] for r in range(n)] for case, outs in got.items()}


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[Outcome]]:
    """The two-rank cases, in one pair of fresh processes (a fork per case would cost more than the case)."""
    return _run(["lightning", "ray", "init-arguments", "torch-adaptor", "torch-adaptor-framework"], 2)


def _values(outs: list[Outcome]) -> list[dict[str, Any]]:
    bad = [str(o) for o in outs if not o.ok]
    assert not bad, "\n".join(bad)
    return [o.value for o in outs]


# ---------------------------------------------------------------------------------------------------------------
# The placement: chosen when the first group is created, from what xccl knows of the job
# ---------------------------------------------------------------------------------------------------------------


def _placed_on_the_ring(facts: list[dict[str, Any]]) -> None:
    ring = [0, 1]  # set_chip_map's map for one or two ranks
    for rank, f in enumerate(facts):
        assert f["dist_all_reduce"] == f["want"] and f["xccl_all_reduce"] == f["want"], f
        assert (f["chip"], f["CHIP_MAP"], f["chip_map"]) == (ring[rank], "0,1", ring), f


def test_lightning_launcher_order(two_ranks: dict[str, list[Outcome]]) -> None:
    """Rank 0 prepares the backend before its launcher sets WORLD_SIZE; rank 1 starts with it set."""
    facts = _values(two_ranks["lightning"])
    _placed_on_the_ring(facts)
    assert [f["world"] for f in facts] == [(0, 2, 0, True), (1, 2, 1, True)]
    assert all(f["backend"] == "xccl_sccl" for f in facts), facts


def test_ray_worker_hook_order(two_ranks: dict[str, list[Outcome]]) -> None:
    """No launcher variable exists when the world is created: the world's rank and size place the ranks."""
    facts = _values(two_ranks["ray"])
    _placed_on_the_ring(facts)
    assert [f["world"] for f in facts] == [(0, 2, 0, True), (1, 2, 1, True)]
    assert all(f["backend"] == "xccl_sccl" for f in facts), facts


def test_init_arguments_place_the_ranks(two_ranks: dict[str, list[Outcome]]) -> None:
    facts = _values(two_ranks["init-arguments"])
    _placed_on_the_ring(facts)
    assert [f["world"] for f in facts] == [(0, 2, 0, False), (1, 2, 1, False)]


def test_mpirun_sets_local_world_size_for_set_chip_map() -> None:
    """set_chip_map reads LOCAL_WORLD_SIZE only (default 1: [0, 1] for any number of ranks); xccl knows the node's
    size from Open MPI's variables and sets LOCAL_WORLD_SIZE for the call, then restores it."""
    facts = _values(_run(["mpirun"], 4)["mpirun"])
    ring = [0, 1, 3, 2]
    for rank, f in enumerate(facts):
        assert f["dist_all_reduce"] == f["want"], f
        assert (f["chip"], f["CHIP_MAP"], f["chip_map"]) == (ring[rank], "0,1,3,2", ring), f
        assert f["LOCAL_WORLD_SIZE"] is None, f


# ---------------------------------------------------------------------------------------------------------------
# Sophgo's torch adaptor
# ---------------------------------------------------------------------------------------------------------------


def test_torch_adaptor_backend_rewrite_is_an_init_error(two_ranks: dict[str, list[Outcome]]) -> None:
    for out in _values(two_ranks["torch-adaptor"]):
        assert out["raised"] is not None, f"the world silently ran on {out}"
        assert "'sccl', not on xccl's backend 'xccl_sccl'" in out["raised"], out
        assert "ENABLE_TORCH_ADAPTOR=0" in out["raised"], out
        assert out["initialized"] is False, out  # xccl destroyed the world it did not want


def test_torch_adaptor_under_a_framework_is_an_init_error_at_adoption(two_ranks: dict[str, list[Outcome]]) -> None:
    for out in _values(two_ranks["torch-adaptor-framework"]):
        assert out["backend"] == "sccl", out
        assert out["raised"] is not None, f"xccl adopted the adaptor's world as its own: {out}"
        assert "'sccl', not on xccl's backend 'xccl_sccl'" in out["raised"], out
        assert "ENABLE_TORCH_ADAPTOR=0" in out["raised"], out
        assert out["initialized"] is True, out


# ---------------------------------------------------------------------------------------------------------------
# SCCL's works complete at once (bodies run in the shared 2-rank pool of simulated Sophgo)
# ---------------------------------------------------------------------------------------------------------------

SIM = {"XCCL_SIMULATE": "sophgo"}
#: The vendor's own group of each pool process, made once (every rank makes it at its first call).
_RAW: dict[str, Any] = {}


def _await(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def sccl_barrier_returns_at_once(tmp: str, case: str) -> dict[str, Any]:
    """On SCCL's own group: rank 1 passes the barrier and says so; only then does rank 0 enter it. A barrier that
    blocks until the peers arrived keeps rank 1 in it, and rank 0 enters after waiting 10 s in vain."""
    if "sccl" not in _RAW:
        _RAW["sccl"] = vendor_group()
    raw, rank = _RAW["sccl"], dist.get_rank()
    passed = Path(tmp) / f"{case}.rank1-passed"
    out: dict[str, Any] = {}
    if rank == 0:
        out["peer_passed_first"] = _await(passed, 10.0)
        dist.barrier(group=raw)
    else:
        work = dist.barrier(group=raw, async_op=True)
        out["is_completed"] = work.is_completed()
        work.wait()
        passed.touch()
    # Data collectives: right values (the device's stream orders them), reported complete at once as SCCL does.
    t = torch.full((3,), float(rank + 1))
    work = dist.all_reduce(t, group=raw, async_op=True)
    out["all_reduce_completed"] = work.is_completed()
    work.wait()
    out["all_reduce"] = t.tolist()
    return out


def barrier_orders_host_steps(tmp: str, case: str) -> bool:
    """Rank 0 writes a file after a while, then enters the barrier; rank 1 reads it after the barrier."""
    flag = Path(tmp) / case
    if "sub" not in _RAW:  # created first: creating a group synchronises the ranks
        _RAW["sub"], _RAW["sccl"] = xccl.new_group([0, 1]), _RAW.get("sccl") or vendor_group()
    sub, raw = _RAW["sub"], _RAW["sccl"]
    if dist.get_rank() == 0:
        time.sleep(0.5)
        flag.write_text("written")
    barrier: Callable[[], Any] = {
        "xccl.barrier": lambda: xccl.barrier(),
        "xccl.barrier-async": lambda: xccl.barrier(async_op=True).wait(),
        "dist.barrier": lambda: dist.barrier(),
        "xccl-sub-group": lambda: xccl.barrier(group=sub),
        "dist-sub-group": lambda: dist.barrier(group=sub),
        # SCCL's own group, made outside xccl: no host-side group, so an all_reduce read back on the host.
        "xccl-on-vendor-group": lambda: xccl.barrier(group=raw),
    }[case]
    barrier()
    return flag.exists()


def test_simulated_sccl_completes_at_once(rank_pools: Any, tmp_path: Path) -> None:
    """The stand-in itself (ProcessGroupSCCL.cpp:183-191): a barrier's wait returns before the peers arrived."""
    outs = rank_pools.get(2, env=SIM).run_ok(sccl_barrier_returns_at_once, str(tmp_path), "raw", timeout=60)
    assert outs[0]["peer_passed_first"] is True, outs
    assert outs[1]["is_completed"] is True, outs
    assert all(o["all_reduce_completed"] is True and o["all_reduce"] == [3.0] * 3 for o in outs), outs


@pytest.mark.parametrize("case", ["xccl.barrier", "xccl.barrier-async", "dist.barrier", "xccl-sub-group",
                                  "dist-sub-group", "xccl-on-vendor-group"])
def test_barrier_orders_host_steps(rank_pools: Any, tmp_path: Path, case: str) -> None:
    """xccl's barrier (and torch's on xccl's groups) blocks the host until every rank arrived, on SCCL too."""
    seen = rank_pools.get(2, env=SIM).run_ok(barrier_orders_host_steps, str(tmp_path), case, timeout=60)
    assert seen == [True, True], f"rank 1 passed the barrier before rank 0 reached it: {seen}"


@pytest.fixture(autouse=True)
def _no_world_in_the_parent() -> None:
    assert not dist.is_initialized()
