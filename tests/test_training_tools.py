"""torch's own training tools on xccl's world, round two: pipelining, DCP, object collectives and the entry points
torch's code calls, on cpu, simulated Sophgo and simulated Ascend.

Each body runs unmodified torch code on the world ``xccl.init`` made and checks, on the rank, what it saw against a
single-process reference it computes itself (same seed). Tests are listed in pool order so each pool starts once.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import xccl

PLUGINS = {"cpu": {}, "sophgo": {"XCCL_SIMULATE": "sophgo"}, "ascend": {"XCCL_SIMULATE": "ascend"}}
BODY_TIMEOUT = 180.0
TOL = 1e-5
LAYERS, WIDTH, BATCH, MICRO = 4, 8, 8, 4

# ---------------------------------------------------------------------------------------------------------------
# Pipelining
# ---------------------------------------------------------------------------------------------------------------


def _pipe_model() -> nn.Sequential:
    torch.manual_seed(7)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _pipe_batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def body_pipeline(frontend: str, schedule: str) -> list[float]:
    """One step of ``schedule`` over ``world`` stages (the model's layers split evenly; stages built by hand or by
    torch's tracer), checked against the whole model on one process: every microbatch's loss on the last stage,
    every stage's gradients."""
    from torch.distributed import pipelining as pp

    rank, n = dist.get_rank(), dist.get_world_size()
    full = _pipe_model()
    x, y = _pipe_batch()
    per = LAYERS // n
    if frontend == "manual":
        part: nn.Module = nn.Sequential(*[full[i] for i in range(rank * per, (rank + 1) * per)])
        params = {f"{rank * per + i}.{k}": p for i, layer in enumerate(part) for k, p in layer.named_parameters()}
        stage = pp.PipelineStage(part, rank, n, torch.device("cpu"))
    else:
        split = {str(i * per): pp.SplitPoint.BEGINNING for i in range(1, n)}
        pipe = pp.pipeline(full, mb_args=(x.chunk(MICRO)[0],), split_spec=split)
        stage = pipe.build_stage(rank, torch.device("cpu"))
        params = dict(stage.submod.named_parameters())
    cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=MICRO, loss_fn=_mse)
    losses: list[torch.Tensor] = []
    if rank == 0:
        sched.step(x)
    elif rank == n - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()

    ref = _pipe_model()
    ref_losses = [_mse(ref(xm), ym) for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True)]
    (sum(ref_losses) / MICRO).backward()
    assert len(params) == 2 * per, sorted(params)
    for name, p in params.items():
        want = ref.get_parameter(name).grad
        assert p.grad is not None, f"{name} has no gradient"
        torch.testing.assert_close(p.grad, want, atol=TOL, rtol=TOL, msg=name)
    if rank == n - 1:
        assert len(losses) == MICRO, losses
        for got, want_loss in zip(losses, ref_losses, strict=True):
            torch.testing.assert_close(got.detach(), want_loss.detach(), atol=TOL, rtol=TOL)
    return [float(v) for v in losses]


PIPE_CASES = [(p, ws, f, s) for ws in (2, 4) for p in PLUGINS for f in ("manual", "tracer") for s in ("gpipe", "1f1b")]


def tiered(cases: list[tuple[Any, ...]], ids: list[str]) -> list[Any]:
    """``cases`` as parameters, the simulated vendors' at 4 ranks marked ``slow`` (the second tier, ``make
    test-more``): the first tier runs every case on every plugin at 2 ranks and on cpu at 4, and the conformance
    kit runs each vendor's collectives at 4."""
    return [pytest.param(*c, id=i, marks=[pytest.mark.slow] if c[0] != "cpu" and 4 in c else [])
            for c, i in zip(cases, ids, strict=True)]


@pytest.mark.parametrize(("plugin", "world_size", "frontend", "schedule"),
                         tiered(PIPE_CASES, [f"{p}-{w}stages-{f}-{s}" for p, w, f, s in PIPE_CASES]))
def test_pipelining_matches_the_single_process_reference(rank_pools: Any, plugin: str, world_size: int,
                                                         frontend: str, schedule: str) -> None:
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    out = pool.run_ok(body_pipeline, frontend, schedule, timeout=BODY_TIMEOUT)
    assert len(out[-1]) == MICRO


# ---------------------------------------------------------------------------------------------------------------
# Object collectives
# ---------------------------------------------------------------------------------------------------------------


def body_object_collectives() -> dict[str, Any]:
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = {"rank": rank, "name": f"r{rank}", "t": torch.full((2,), float(rank))}
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, mine)
    assert [g["rank"] for g in gathered] == list(range(n)), gathered
    assert all(torch.equal(g["t"], torch.full((2,), float(r))) for r, g in enumerate(gathered))

    objs: list[Any] = [{"from": 1, "x": [1, 2, 3]}, "two"] if rank == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [{"from": 1, "x": [1, 2, 3]}, "two"], objs

    out: list[Any] = [None]
    dist.scatter_object_list(out, [f"to-{r}" for r in range(n)] if rank == 0 else None, src=0)
    assert out == [f"to-{rank}"], out

    dst = n - 1
    got: list[Any] | None = [None] * n if rank == dst else None
    dist.gather_object(("g", rank), got, dst=dst)
    if rank == dst:
        assert got == [("g", r) for r in range(n)], got
    return {"ok": True}


OBJ_CASES = [(p, ws) for ws in (2, 4) for p in PLUGINS]


@pytest.mark.parametrize(("plugin", "world_size"), tiered(OBJ_CASES, [f"{p}-{w}ranks" for p, w in OBJ_CASES]))
def test_object_collectives(rank_pools: Any, plugin: str, world_size: int) -> None:
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    pool.run_ok(body_object_collectives, timeout=BODY_TIMEOUT)


# ---------------------------------------------------------------------------------------------------------------
# DCP with FSDP2: save, load, reshard 4 -> 2 -> 4
# ---------------------------------------------------------------------------------------------------------------


def _dcp_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _fsdp(model: nn.Module) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _dcp_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    gen = torch.Generator().manual_seed(50 + step)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)
    rank, n = dist.get_rank(), dist.get_world_size()
    loss = _mse(model(x.chunk(n)[rank]), y.chunk(n)[rank])
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def _full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in model.state_dict().items():
        out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    return out


def body_dcp_save(path: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = _fsdp(_dcp_model())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(2):
        _dcp_step(model, opt, step)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    return _full_params(model)


def body_dcp_load(path: str, saved: dict[str, torch.Tensor]) -> float:
    """Load into a fresh model (whatever the world size that saved it), check the parameters, take a step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = _fsdp(_dcp_model())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    _dcp_step(model, opt, 99)  # the optimizer has state to be overwritten
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for k, v in _full_params(model).items():
        torch.testing.assert_close(v, saved[k], atol=0, rtol=0, msg=k)
    return _dcp_step(model, opt, 2)


DCP_CASES = list(PLUGINS)


# 10-11 s a plugin (4 ranks, then 2, then 4): the simulated vendors in the second tier, as above.
@pytest.mark.parametrize("plugin", [pytest.param(p, marks=[pytest.mark.slow] if p != "cpu" else []) for p in DCP_CASES])
def test_dcp_save_load_and_reshard_with_fsdp2(rank_pools: Any, tmp_path: Path, plugin: str) -> None:
    four = rank_pools.get(4, env=PLUGINS[plugin], fallback="emulate")
    saved = four.run_ok(body_dcp_save, str(tmp_path / "at4"), timeout=BODY_TIMEOUT)[0]
    same = four.run_ok(body_dcp_load, str(tmp_path / "at4"), saved, timeout=BODY_TIMEOUT)
    two = rank_pools.get(2, env=PLUGINS[plugin], fallback="emulate")
    resharded = two.run_ok(body_dcp_load, str(tmp_path / "at4"), saved, timeout=BODY_TIMEOUT)
    assert all(abs(v) < 1e6 for v in same + resharded)
    saved2 = two.run_ok(body_dcp_save, str(tmp_path / "at2"), timeout=BODY_TIMEOUT)[0]
    four = rank_pools.get(4, env=PLUGINS[plugin], fallback="emulate")
    four.run_ok(body_dcp_load, str(tmp_path / "at2"), saved2, timeout=BODY_TIMEOUT)


# ---------------------------------------------------------------------------------------------------------------
# Entry points torch's own code calls
# ---------------------------------------------------------------------------------------------------------------


def body_monitored_barrier() -> str:
    """``monitored_barrier`` on xccl's world: xccl's function, the group's own method and torch's module function
    run it on every vendor. torch's own refuses by name every backend but gloo (``distributed_c10d.monitored_barrier``:
    ``get_backend(group) != Backend.GLOO``), xccl's cpu world (``xccl_gloo``) included, where the same script on
    plain gloo runs: xccl answers it for its groups (``xccl.runtime._torch_api``)."""
    timeout = datetime.timedelta(seconds=30)
    xccl.monitored_barrier(timeout=timeout)
    xccl.monitored_barrier(timeout=timeout, wait_all_ranks=True)
    dist.group.WORLD.monitored_barrier(timeout, wait_all_ranks=True)
    try:
        dist.monitored_barrier(timeout=timeout)
    except ValueError as exc:
        return str(exc)
    return "ran"


def body_all_gather_base_backward() -> None:
    """torch's own autograd function hands the collective an expanded (non-contiguous) gradient in backward."""
    from torch.distributed.nn.functional import _all_gather_base

    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    out = _all_gather_base(torch.empty(3 * n), x)
    out.sum().backward()
    # d(sum)/dx summed over the n ranks' gathered copies: n on every element.
    torch.testing.assert_close(x.grad, torch.full((3,), float(n)))


def body_future_of_native_work() -> list[float]:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.empty(2)
    work = dist.reduce_scatter_tensor(out, torch.arange(2.0 * n) + rank, async_op=True)
    value = work.get_future().wait()
    want = (torch.arange(2.0 * n) * n + sum(range(n))).chunk(n)[rank]
    torch.testing.assert_close(value[0], want)
    torch.testing.assert_close(out, want)
    return out.tolist()


def body_uneven_list_all_to_all() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    # rank r sends (r + j + 1) elements to rank j, valued 100 r + j
    inputs = [torch.full((rank + j + 1,), 100.0 * rank + j) for j in range(n)]
    outputs = [torch.empty(r + rank + 1) for r in range(n)]
    dist.all_to_all(outputs, inputs)
    for r, o in enumerate(outputs):
        torch.testing.assert_close(o, torch.full((r + rank + 1,), 100.0 * r + rank))


ENTRY_CASES = [(p, ws) for ws in (2, 4) for p in PLUGINS]


@pytest.mark.parametrize(("plugin", "world_size"), tiered(ENTRY_CASES, [f"{p}-{w}ranks" for p, w in ENTRY_CASES]))
def test_entry_points_torch_code_calls(rank_pools: Any, plugin: str, world_size: int) -> None:
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    assert pool.run_ok(body_monitored_barrier, timeout=BODY_TIMEOUT) == ["ran"] * world_size
    if plugin == "ascend":
        # torch's own _AllGatherBase.backward takes nccl and xccl only ("Backend not supported!" on gloo as on
        # xccl's cpu world); torch_npu's replacement adds hccl, which xccl's backend name equals.
        pool.run_ok(body_all_gather_base_backward, timeout=BODY_TIMEOUT)
    pool.run_ok(body_future_of_native_work, timeout=BODY_TIMEOUT)
    pool.run_ok(body_uneven_list_all_to_all, timeout=BODY_TIMEOUT)



class _Fails(nn.Module):
    """A stage that raises in its forward (a bug, an out-of-memory error) on the second microbatch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the receiving stage failed")
        return self.lin(x)


def body_receiver_fails() -> dict[str, Any]:
    """Stage 1 fails in its forward and its process exits, as a script's does on an uncaught error; stage 0, in
    the middle of its sends, reports what it raised and when."""
    import os
    import time

    from torch.distributed import pipelining as pp

    rank = dist.get_rank()
    part: nn.Module = nn.Linear(WIDTH, WIDTH) if rank == 0 else _Fails()
    stage = pp.PipelineStage(part, rank, 2, torch.device("cpu"))
    sched = pp.ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=_mse)
    x, y = _pipe_batch()
    if rank == 1:
        try:
            sched.step(target=y, losses=[])
        finally:
            with open(os.environ["XCCL_TEST_DIED"], "w", encoding="utf-8") as f:
                f.write(repr(time.time()))
            os._exit(3)
    try:
        sched.step(x)
    except Exception as exc:
        return {"types": [c.__name__ for c in type(exc).__mro__], "at": time.time()}
    return {"types": ["no error"], "at": time.time()}


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_a_failed_receiving_stage_fails_the_sender_with_a_typed_error(tmp_path: Path, plugin: str) -> None:
    from xccl.testing import RankPool

    died = tmp_path / "died"
    env = {**PLUGINS[plugin], "XCCL_TEST_DIED": str(died)}
    with RankPool(2, {"timeout": 60, "fallback": "emulate"}, env=env, start_method="forkserver") as pool:
        outs = pool.run(body_receiver_fails, timeout=120)
    sender = outs[0]
    assert sender.ok, str(sender)
    assert "PeerFailure" in sender.value["types"], sender.value
    # Well before the 60 s collective timeout: the sender learns of the death, not of a silence.
    assert sender.value["at"] - float(died.read_text()) < 15, sender.value
