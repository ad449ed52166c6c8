"""Real training stacks, unmodified, on the world ``xccl.init`` made: DDP, FSDP2, DTensor TP and FSDP2 + TP.

Every stack runs 3 SGD steps of a tiny MLP on the cpu plugin, on simulated Sophgo and on simulated Ascend, at 2
and 4 ranks, and each rank compares what it saw with a single-process reference it computes itself (same seed,
the whole global batch on one process, mean loss): the loss of every step and the final parameters, to 1e-5.
Nothing in the stacks knows about xccl; their collectives reach xccl through ``torch.distributed`` on xccl's
process group. On Sophgo, which has no reduce_scatter, FSDP2's gradient reduction must run xccl's emulation
(all_to_all + local reduction): the body counts the emulation's calls and the test asserts there were some.

Tests are listed in pool order (one configuration after the other) so that each rank pool starts once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import xccl

# The compatibility tier runs this file on every supported torch (`make test-torch`).
pytestmark = pytest.mark.compat

STEPS = 3
LR = 0.1
D_IN, HIDDEN, D_OUT = 8, 16, 4
#: Rows of the global batch (divisible by every data-parallel size used here).
BATCH = 8
TOL = 1e-5
BODY_TIMEOUT = 180.0
PLUGINS = {"cpu": {}, "sophgo": {"XCCL_SIMULATE": "sophgo"}, "ascend": {"XCCL_SIMULATE": "ascend"}}

# ---------------------------------------------------------------------------------------------------------------
# Helpers run on the ranks
# ---------------------------------------------------------------------------------------------------------------


def _model() -> nn.Sequential:
    """The same model on every rank and in the reference: an MLP from a fixed seed (children named 0, 1, 2)."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same on every rank."""
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, D_IN, generator=gen), torch.randn(BATCH, D_OUT, generator=gen)


def _shard(t: torch.Tensor, index: int, parts: int) -> torch.Tensor:
    return t.chunk(parts)[index]


def _reference(parts: int) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """Single-process training on the global batch: per step, the loss on each of ``parts`` equal data shards
    (at the step's starting parameters); and the final parameters.

    The mean of the shard losses is the global mean loss, whose gradient is what data parallelism averages.
    """
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        with torch.no_grad():
            losses.append([nn.functional.mse_loss(model(_shard(x, i, parts)), _shard(y, i, parts)).item()
                           for i in range(parts)])
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(model: nn.Module, shard: int, parts: int) -> list[float]:
    """3 SGD steps of ``model`` on data shard ``shard`` of ``parts``; the loss of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(_shard(x, shard, parts)), _shard(y, shard, parts))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.item()))
    return losses


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter as a plain tensor (a DTensor's full value: a collective, so every rank must call it)."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _check(losses: list[float], params: dict[str, torch.Tensor], shard: int, parts: int, what: str) -> None:
    ref_losses, ref_params = _reference(parts)
    want = [step[shard] for step in ref_losses]
    for step, (got, exp) in enumerate(zip(losses, want, strict=True)):
        if abs(got - exp) > TOL:
            raise AssertionError(f"{what}: step {step} loss {got!r}, reference {exp!r} (all steps: {losses} vs {want})")
    for name, exp in ref_params.items():
        got = params[name]
        if got.shape != exp.shape or not torch.allclose(got, exp, rtol=0, atol=TOL):
            raise AssertionError(f"{what}: parameter {name} differs from the reference by "
                                 f"{(got - exp).abs().max().item() if got.shape == exp.shape else 'shape'}")


@contextmanager
def _counting_reduce_scatter_emulation(calls: list[int]) -> Iterator[None]:
    """Count the calls of xccl's reduce_scatter_tensor emulation (all_to_all + local reduction).

    Compositions are looked up by their record (``xccl.ops._emulations``) when a call shape is first planned, so
    the cached plans of reduce_scatter_tensor are dropped before (to plan the counting kernel) and after (to forget
    it).
    """
    from xccl.collectives._state import GROUPS
    from xccl.ops._emulations import BY_KEY, implements

    key = (xccl.Collective.REDUCE_SCATTER_TENSOR, "all_to_all")
    real = BY_KEY[key].fn

    def counting(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    def forget() -> None:
        for st in {id(s): s for s in [*GROUPS.groups.values(), GROUPS.default] if s is not None}.values():
            for key in [k for k in st.plans if k[0] is xccl.Collective.REDUCE_SCATTER_TENSOR]:
                del st.plans[key]

    implements(*key)(counting)
    forget()
    try:
        yield
    finally:
        implements(*key)(real)
        forget()


# ---------------------------------------------------------------------------------------------------------------
# Bodies: one per stack
# ---------------------------------------------------------------------------------------------------------------


def _world_is_xccl() -> None:
    world = xccl.get_world()
    group = dist.group.WORLD
    if not isinstance(group, xccl.XcclProcessGroup) or world.adopted:
        raise AssertionError(f"the world group is {group!r} (adopted={world.adopted}), not xccl's")
    if dist.get_backend() != f"xccl_{world.backend}":
        raise AssertionError(f"dist.get_backend() is {dist.get_backend()!r}")


def body_ddp() -> list[float]:
    from torch.nn.parallel import DistributedDataParallel

    _world_is_xccl()
    rank, n = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(_model())
    losses = _train(ddp, rank, n)
    _check(losses, {k: v.detach() for k, v in ddp.module.state_dict().items()}, rank, n, "DDP")
    return losses


def body_fsdp2(count_emulated_reduce_scatter: bool) -> tuple[list[float], int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _world_is_xccl()
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    calls = [0]
    if count_emulated_reduce_scatter:
        with _counting_reduce_scatter_emulation(calls):
            losses = _train(model, rank, n)
    else:
        losses = _train(model, rank, n)
    params = {k: _full(v) for k, v in model.state_dict().items()}
    _check(losses, params, rank, n, "FSDP2")
    return losses, calls[0]


def _tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def body_tp() -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    _world_is_xccl()
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    model = parallelize_module(_model(), mesh, _tp_plan())
    losses = _train(model, 0, 1)  # the same (whole) batch on every rank
    params = {k: _full(v) for k, v in model.state_dict().items()}
    _check(losses, params, 0, 1, "TP")
    return losses


def body_fsdp2_tp() -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    _world_is_xccl()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        group = mesh.get_group(dim)
        if not isinstance(group, xccl.XcclProcessGroup):
            raise AssertionError(f"mesh[{dim!r}]'s group is {group!r}, not an XcclProcessGroup")
    model = parallelize_module(_model(), mesh["tp"], _tp_plan())
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    dp = mesh.get_local_rank("dp")
    losses = _train(model, dp, 2)
    params = {k: _full(v) for k, v in model.state_dict().items()}
    _check(losses, params, dp, 2, "FSDP2+TP")
    return losses


# ---------------------------------------------------------------------------------------------------------------
# Tests (in pool order: every stack of one configuration, then the next configuration)
# ---------------------------------------------------------------------------------------------------------------

STACKS: dict[str, Callable[..., Any]] = {"ddp": body_ddp, "fsdp2": body_fsdp2, "tp": body_tp, "fsdp2_tp": body_fsdp2_tp}
CASES = [
    (plugin, ws, stack)
    for ws in (2, 4)
    for plugin in PLUGINS
    for stack in STACKS
    if stack != "fsdp2_tp" or ws == 4
]


# The simulated vendors at 4 ranks are the second tier: the first runs every stack on every plugin at 2 ranks and
# on cpu at 4 (fsdp2_tp needs 4), and the conformance kit runs each vendor's collectives at 4.
@pytest.mark.parametrize(("plugin", "world_size", "stack"), [
    pytest.param(p, w, s, id=f"{p}-{w}ranks-{s}", marks=[pytest.mark.slow] if w == 4 and p != "cpu" else [])
    for p, w, s in CASES
])
def test_stack_matches_single_process_reference(rank_pools: Any, plugin: str, world_size: int, stack: str) -> None:
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    args = (plugin == "sophgo",) if stack == "fsdp2" else ()
    out = pool.run_ok(STACKS[stack], *args, timeout=BODY_TIMEOUT)
    if stack == "fsdp2":
        losses = [o[0] for o in out]
        calls = [o[1] for o in out]
        if plugin == "sophgo":
            # SCCL has no reduce_scatter: every rank's gradient reduction ran xccl's emulation.
            assert all(c > 0 for c in calls), f"emulated reduce_scatter calls per rank: {calls}"
    else:
        losses = out
    # Every rank's losses were checked against the reference on the rank; they are finite numbers here.
    assert all(len(ls) == STEPS and all(math.isfinite(v) for v in ls) for ls in losses), losses
