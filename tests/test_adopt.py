"""Adoption of a torch.distributed world created outside xccl (what Lightning, Accelerate, DeepSpeed and torchtitan
do), each case in fresh processes: RankPool always calls ``xccl.init`` first, so these spawn their own ranks.

* (a) ``dist.init_process_group("gloo")``, then ``xccl.init()``: the world is adopted (plugin ``cpu``, backend
  ``gloo``), ``xccl.*`` runs on it, and ``xccl.shutdown()`` leaves the group to its creator.
* (b) ``xccl.process_group_backend("sophgo", simulate=True)`` named to ``dist.init_process_group``: DDP and a
  ``torch.distributed.reduce_scatter_tensor`` (which SCCL lacks: emulated) work before ``xccl.init``, which then
  adopts the world as Sophgo's.
* (c) a world on a backend no plugin drives (a custom torch.distributed backend, registered here over gloo):
  ``xccl.init()`` is an ``InitError``.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import queue
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.testing import free_port

TIMEOUT = 120.0

# ---------------------------------------------------------------------------------------------------------------
# Cases, run in each fresh rank process
# ---------------------------------------------------------------------------------------------------------------


def case_gloo_world(rank: int, world_size: int) -> dict[str, Any]:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    world = xccl.init()
    t = torch.full((3,), float(rank + 1))
    xccl.all_reduce(t)
    out = {
        "adopted": world.adopted,
        "plugin": world.plugin,
        "process_group_backend": world.process_group_backend,
        "rank": (world.rank, world.world_size),
        "all_reduce": t.tolist(),
        "world_is_xccl_group": isinstance(dist.group.WORLD, xccl.XcclProcessGroup),
    }
    xccl.shutdown()
    out["initialized_after_shutdown"] = dist.is_initialized()
    dist.destroy_process_group()
    return out


def case_sophgo_backend(rank: int, world_size: int) -> dict[str, Any]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from xccl.collectives._state import GROUPS

    name = xccl.process_group_backend("sophgo", simulate=True)
    dist.init_process_group(name, rank=rank, world_size=world_size, pg_options=None)
    out: dict[str, Any] = {"backend_name": name, "dist_backend": str(dist.get_backend()),
                           "world_is_xccl_group": isinstance(dist.group.WORLD, xccl.XcclProcessGroup)}
    # DDP, before xccl.init: rank r's input is r + 1, so the averaged gradient of sum(w . x) is the mean input.
    model = nn.Linear(4, 1, bias=False)
    ddp = DistributedDataParallel(model)
    ddp(torch.full((1, 4), float(rank + 1))).sum().backward()
    out["ddp_grad"] = model.weight.grad.flatten().tolist()
    # reduce_scatter_tensor through torch.distributed: SCCL has none, so xccl emulates it (and warns once).
    GROUPS.warned.clear()
    inp = torch.arange(2 * world_size, dtype=torch.float32) + 10 * rank
    res = torch.empty(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.reduce_scatter_tensor(res, inp)
    out["reduce_scatter"] = res.tolist()
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, xccl.EmulationWarning)]
    world = xccl.init(fallback="emulate")
    out.update(adopted=world.adopted, plugin=world.plugin, process_group_backend=world.process_group_backend,
               simulate=world.simulate)
    res2 = torch.empty(2)
    xccl.reduce_scatter_tensor(res2, inp)
    out["xccl_reduce_scatter"] = res2.tolist()
    xccl.shutdown()
    out["initialized_after_shutdown"] = dist.is_initialized()
    dist.destroy_process_group()
    return out


class _ForeignBackend:
    """A torch.distributed backend no xccl plugin drives (gloo underneath, under another name)."""

    def __call__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        from torch._C._distributed_c10d import ProcessGroupGloo

        return ProcessGroupGloo(store, rank, size, timeout)


def case_foreign_backend(rank: int, world_size: int) -> dict[str, Any]:
    from xccl.collectives._state import PROCESS

    dist.Backend.register_backend("xccltestforeign", _ForeignBackend(), devices=["cpu"])
    dist.init_process_group("xccltestforeign", rank=rank, world_size=world_size)
    out: dict[str, Any] = {"dist_backend": str(dist.get_backend())}
    try:
        xccl.init()
        out["raised"] = None
    except Exception as exc:
        out["raised"] = [c.__name__ for c in type(exc).__mro__]
        out["message"] = str(exc)
    out["xccl_initialised"] = PROCESS.world is not None
    dist.destroy_process_group()
    return out


CASES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "gloo": case_gloo_world,
    "sophgo": case_sophgo_backend,
    "foreign": case_foreign_backend,
}


def _rank_main(case: str, rank: int, world_size: int, port: int, results: Any) -> None:
    for var in ("XCCL_SIMULATE", "XCCL_VENDOR", "XCCL_CHECK"):
        os.environ.pop(var, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        results.put((rank, True, CASES[case](rank, world_size)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _run(case: str, world_size: int = 2) -> list[dict[str, Any]]:
    """Run ``case`` in ``world_size`` fresh processes (forked from a server that imported torch and xccl once);
    each rank's result (raises on any failure)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(case, r, world_size, port, results), daemon=True)
             for r in range(world_size)]
    got: dict[int, tuple[bool, Any]] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + TIMEOUT
        while len(got) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.5)
                got[rank] = (ok, value)
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs) if r not in got and not p.is_alive()]
            if dead:
                raise AssertionError(f"ranks {dead} died (exit codes {[procs[r].exitcode for r in dead]})")
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks {[r for r in range(world_size) if r not in got]} did not answer in "
                                     f"{TIMEOUT:.0f}s")
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            with contextlib.suppress(Exception):
                p.join(timeout=10)
    bad = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(got.items()) if not ok]
    assert not bad, "\n".join(bad)
    return [got[r][1] for r in range(world_size)]


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------


def test_adopts_a_gloo_world_and_leaves_it_to_its_creator() -> None:
    for rank, out in enumerate(_run("gloo")):
        assert out["adopted"] is True, out
        assert out["plugin"] == "cpu", out
        assert out["process_group_backend"] == "gloo", out
        assert out["rank"] == (rank, 2), out
        assert out["all_reduce"] == [3.0, 3.0, 3.0], out
        assert out["world_is_xccl_group"] is False, out  # adoption dispatches xccl.* only; the group is gloo's
        assert out["initialized_after_shutdown"] is True, out


def test_framework_creates_the_world_on_xccls_backend_then_init_adopts_it() -> None:
    n = 2
    for rank, out in enumerate(_run("sophgo", n)):
        assert out["backend_name"] == "xccl_sccl", out
        assert out["dist_backend"] == "xccl_sccl", out
        assert out["world_is_xccl_group"] is True, out
        assert out["ddp_grad"] == [1.5] * 4, out  # the mean of 1 and 2
        inputs = [torch.arange(2 * n, dtype=torch.float32) + 10 * r for r in range(n)]
        want = sum(inputs)[2 * rank : 2 * rank + 2].tolist()
        assert out["reduce_scatter"] == want, out
        assert out["xccl_reduce_scatter"] == want, out
        assert any("reduce_scatter_tensor is emulated on sophgo" in w for w in out["warnings"]), out
        assert out["adopted"] is True and out["plugin"] == "sophgo" and out["simulate"] is True, out
        assert out["process_group_backend"] == "xccl_sccl", out
        assert out["initialized_after_shutdown"] is True, out


def test_a_world_on_a_backend_no_plugin_drives_is_an_init_error() -> None:
    for out in _run("foreign", 1):
        assert out["dist_backend"] == "xccltestforeign", out
        assert out["raised"] is not None and "InitError" in out["raised"], out
        assert "no installed xccl plugin drives" in out["message"], out
        assert out["xccl_initialised"] is False, out


@pytest.fixture(autouse=True)
def _no_world_in_the_parent() -> None:
    # The cases run in child processes: the test process itself never initialises torch.distributed.
    assert not dist.is_initialized()


def test_a_gloo_world_is_adopted_by_the_builtin_plugin_whatever_else_drives_gloo() -> None:
    # A third-party CPU plugin over gloo listed before the built-in one (entry points come in install order).
    from xccl.backends.cpu import CpuPlugin
    from xccl.runtime._backend_check import plugin_for as _plugin_for

    class Aardvark(xccl.Plugin):
        name, vendor, device_type, backend, accelerator = "aardvark", "tests", "cpu", "gloo", False

    assert _plugin_for("gloo", "auto", xccl.Registry.from_plugins(Aardvark(), CpuPlugin())).name == "cpu"


def test_a_backend_name_two_vendors_share_is_adopted_by_the_one_whose_sdk_is_here() -> None:
    # Habana's Gaudi backend is also called "hccl". With both plugins installed, an hccl world is the plugin whose
    # SDK imports here; when neither (or both) does, an InitError names both and the vendor= that settles it.
    from xccl_ascend import plugin as ascend

    from xccl.runtime._backend_check import plugin_for as _plugin_for

    class Gaudi(xccl.Plugin):
        name, vendor, device_type, backend, accelerator = "gaudi", "Intel Habana", "hpu", "hccl", True
        present = True

        def probe(self) -> xccl.ProbeResult:
            if self.present:
                return xccl.ProbeResult.ok(devices="8")
            return xccl.ProbeResult.unavailable("importing habana_frameworks.torch failed",
                                                "install Habana's PyTorch bridge")

    gaudi = Gaudi()
    assert ascend.probe().available is False  # torch_npu is not installed here
    registry = xccl.Registry.from_plugins(ascend, gaudi)
    assert _plugin_for("hccl", "auto", registry).name == "gaudi"
    Gaudi.present = False
    with pytest.raises(xccl.InitError) as err:
        _plugin_for("hccl", "auto", xccl.Registry.from_plugins(ascend, gaudi))
    message = str(err.value)
    assert "ascend, gaudi" in message and "none of them finds its SDK" in message, message
    assert "xccl.init(vendor='ascend')" in message and "XCCL_VENDOR=<ascend|gaudi>" in message, message
    assert _plugin_for("hccl", "gaudi", xccl.Registry.from_plugins(ascend, gaudi)).name == "gaudi"
