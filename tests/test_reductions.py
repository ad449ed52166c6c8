"""Reductions a backend lacks, through torch.distributed on xccl's world: PREMUL_SUM and float64.

* **PREMUL_SUM** (``dist._make_nccl_premul_sum(f)``): FSDP2 reduces gradients with it whenever a gradient divide
  factor is set (torchtitan always sets one). HCCL has it natively (floats); gloo and SCCL do not, and xccl emulates
  it there (the inputs scaled locally, then SUM). The factor must reach the kernel intact through the c10d path.
* **float64** (DeepSpeed ZeRO-3 all_reduces its gradient norm in float64): SCCL has no float64 and HCCL moves it
  but does not reduce it; xccl gathers the bits and reduces them locally, in rank order, so the result is exact and
  identical on every rank.

Every check runs on the cpu plugin and on simulated Sophgo and Ascend, at 2 and 4 ranks, in real processes; each
rank compares with what it computes alone. Tests are in pool order.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import xccl

PLUGINS = {"cpu": {}, "sophgo": {"XCCL_SIMULATE": "sophgo"}, "ascend": {"XCCL_SIMULATE": "ascend"}}
CASES = [(plugin, ws) for ws in (2, 4) for plugin in PLUGINS]
IDS = [f"{p}-{w}ranks" for p, w in CASES]
TIMEOUT = 120.0


def _premul(factor: Any) -> Any:
    return dist._make_nccl_premul_sum(factor)


def _rows(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """This rank's input: small integers and halves, exact in every float dtype used here."""
    return (torch.arange(n, dtype=torch.float64) * 0.5 + rank + 1).to(dtype)


# ---------------------------------------------------------------------------------------------------- PREMUL_SUM


def body_premul() -> dict[str, Any]:
    """all_reduce and reduce_scatter_tensor with PREMUL_SUM through torch.distributed (the c10d path) and xccl."""
    rank, n = dist.get_rank(), dist.get_world_size()
    factor = 0.25
    want = factor * sum(_rows(r, 4) for r in range(n))
    got: dict[str, Any] = {}

    t = _rows(rank, 4)
    dist.all_reduce(t, op=_premul(factor))
    got["dist.all_reduce"] = torch.equal(t, want)

    t = _rows(rank, 4)
    dist.all_reduce(t, op=_premul(factor), async_op=True).wait()
    got["dist.all_reduce async"] = torch.equal(t, want)

    t = _rows(rank, 4)
    dist.all_reduce(t, op=_premul(torch.tensor([factor])))  # the factor as a tensor, as FSDP may pass it
    got["dist.all_reduce tensor factor"] = torch.equal(t, want)

    t = _rows(rank, 4)
    xccl.all_reduce(t, op=_premul(factor))
    got["xccl.all_reduce"] = torch.equal(t, want)

    inp = torch.stack([_rows(rank, 3) + 10 * j for j in range(n)])  # row j goes to rank j
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, inp, op=_premul(factor))
    got["dist.reduce_scatter_tensor"] = torch.equal(out, factor * sum(_rows(r, 3) + 10 * rank for r in range(n)))
    got["input untouched"] = torch.equal(inp, torch.stack([_rows(rank, 3) + 10 * j for j in range(n)]))
    return got


# --------------------------------------------------------------------------------- FSDP2 with a divide factor

STEPS, LR, BATCH = 3, 0.1, 8
D_IN, HIDDEN, D_OUT = 8, 16, 4


def _model() -> nn.Sequential:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, D_IN, generator=gen), torch.randn(BATCH, D_OUT, generator=gen)


def _reference(parts: int, lr: float) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """One process on the global batch: each step's loss on each of ``parts`` shards, and the final parameters."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        with torch.no_grad():
            losses.append([nn.functional.mse_loss(model(xs), ys).item()
                           for xs, ys in zip(x.chunk(parts), y.chunk(parts), strict=True)])
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def body_fsdp2_divide_factor() -> list[float]:
    """FSDP2 with ``set_gradient_divide_factor(2 * n)`` on every FSDP module: its gradient reduce_scatter runs
    PREMUL_SUM(1 / (2n)), so each gradient is the global mean gradient halved; the reference trains at lr / 2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():  # torchtitan's way: every FSDP module gets the factor
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(2.0 * n)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.chunk(n)[rank]), y.chunk(n)[rank])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    ref_losses, ref_params = _reference(n, LR / 2)
    for step, (got, want) in enumerate(zip(losses, (s[rank] for s in ref_losses), strict=True)):
        if abs(got - want) > 1e-5:
            raise AssertionError(f"step {step}: loss {got!r}, reference {want!r}")
    for name, value in model.state_dict().items():
        full = value.detach().full_tensor()
        if not torch.allclose(full, ref_params[name], rtol=0, atol=1e-5):
            raise AssertionError(f"{name} differs from the reference by {(full - ref_params[name]).abs().max()}")
    return losses


# ------------------------------------------------------------------------------------------------------- float64


def _f64(rank: int, shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """Values whose float64 sum depends on the order of addition (so a rank-order result is checkable)."""
    gen = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-8, 9, shape, generator=gen)


def _in_rank_order(rows: list[torch.Tensor], op: str) -> torch.Tensor:
    acc = rows[0].clone()
    for row in rows[1:]:
        acc = {"sum": torch.add, "max": torch.maximum, "product": torch.mul}[op](acc, row)
    return acc


def body_float64() -> dict[str, torch.Tensor]:
    """Every reduction over float64 (DeepSpeed ZeRO-3 all_reduces its gradient norm in it), through
    torch.distributed on xccl's world; each result, for the parent to compare across ranks and with the
    rank-order reference."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, torch.Tensor] = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("product", dist.ReduceOp.PRODUCT),
                     ("avg", dist.ReduceOp.AVG), ("premul", _premul(0.5))):
        t = _f64(rank, (5,))
        dist.all_reduce(t, op=op)
        out[f"all_reduce {name}"] = t
    t = _f64(rank, ())  # a 0-d norm, as ZeRO-3's
    dist.all_reduce(t)
    out["all_reduce 0-d"] = t
    t = _f64(rank, (3,))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    out["all_reduce async"] = t
    t = _f64(rank, (2, 3))
    dist.reduce(t, dst=n - 1)
    out["reduce"] = t if rank == n - 1 else torch.zeros(0, dtype=torch.float64)
    inp = torch.cat([_f64(rank, (2,), salt=j) for j in range(n)])
    o = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(o, inp)
    out["reduce_scatter_tensor"] = o
    o = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter(o, [_f64(rank, (2,), salt=j) for j in range(n)])
    out["reduce_scatter"] = o
    ts = [_f64(rank, (2,), salt=7), _f64(rank, (3,), salt=8)]
    xccl.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = torch.cat(ts)
    return out


def _float64_reference(n: int) -> dict[str, list[torch.Tensor]]:
    """What each rank must hold: the reductions of the inputs every rank made, in rank order."""
    ref: dict[str, list[torch.Tensor]] = {}
    for name in ("sum", "max", "product"):
        ref[f"all_reduce {name}"] = [_in_rank_order([_f64(r, (5,)) for r in range(n)], name)] * n
    ref["all_reduce avg"] = [_in_rank_order([_f64(r, (5,)) for r in range(n)], "sum") / n] * n
    ref["all_reduce premul"] = [_in_rank_order([_f64(r, (5,)) for r in range(n)], "sum") * 0.5] * n
    ref["all_reduce 0-d"] = [_in_rank_order([_f64(r, ()) for r in range(n)], "sum")] * n
    ref["all_reduce async"] = [_in_rank_order([_f64(r, (3,)) for r in range(n)], "sum")] * n
    ref["reduce"] = [torch.zeros(0, dtype=torch.float64)] * (n - 1) + [_in_rank_order([_f64(r, (2, 3)) for r in range(n)], "sum")]
    scattered = [_in_rank_order([_f64(r, (2,), salt=j) for r in range(n)], "sum") for j in range(n)]
    ref["reduce_scatter_tensor"] = scattered
    ref["reduce_scatter"] = scattered
    ref["all_reduce_coalesced"] = [torch.cat([_in_rank_order([_f64(r, (2,), salt=7) for r in range(n)], "sum"),
                                              _in_rank_order([_f64(r, (3,), salt=8) for r in range(n)], "sum")])] * n
    return ref


def check_float64(outs: list[dict[str, torch.Tensor]], plugin: str) -> None:
    n = len(outs)
    ref = _float64_reference(n)
    for name, want in ref.items():
        got = [o[name] for o in outs]
        assert all(g.dtype == torch.float64 for g in got), (name, [g.dtype for g in got])
        if plugin == "cpu":  # gloo reduces float64 itself, in its own order: equal up to rounding
            assert all(torch.allclose(g, w, rtol=1e-12, atol=0) for g, w in zip(got, want, strict=True)), name
        else:  # xccl's emulation: exactly the rank-order result
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (name, got, want)


# ------------------------------------------------------------------------------------ futures of composed ops


def body_futures() -> dict[str, Any]:
    """``get_future()`` of asynchronous reductions, emulated on at least one of them on every plugin (premul_sum
    on gloo and SCCL, float64 on SCCL and HCCL, AVG on SCCL): returned at once, completed with the output tensors,
    ``.then()`` chains on it. Rank 0 asks for the future while rank 1 is still 1 s away from the collective."""
    import time

    rank, n = dist.get_rank(), dist.get_world_size()
    got: dict[str, Any] = {}
    calls = {
        "all_reduce avg": (lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True), torch.float32,
                           lambda rows: sum(rows) / n),
        "all_reduce premul": (lambda t: dist.all_reduce(t, op=_premul(0.5), async_op=True), torch.float32,
                              lambda rows: sum(rows) * 0.5),
        "all_reduce float64": (lambda t: dist.all_reduce(t, async_op=True), torch.float64, sum),
    }
    for name, (call, dtype, reduced) in calls.items():
        t = _rows(rank, 4, dtype)
        if rank == 1:
            time.sleep(1.0)
        started = time.monotonic()
        fut = call(t).get_future()
        got[f"{name}: future at once"] = rank != 0 or time.monotonic() - started < 0.5
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        want = reduced([_rows(r, 4, dtype) for r in range(n)])
        got[f"{name}: value()[0]"] = torch.equal(fut.value()[0], want) and fut.value()[0].data_ptr() == t.data_ptr()
        got[f"{name}: then"] = torch.equal(doubled, 2 * want)
    table = xccl.capabilities()
    for name, op, dtype, scale in (("reduce_scatter_tensor premul", _premul(0.5), torch.float32, 0.5),
                                   ("reduce_scatter_tensor float64", dist.ReduceOp.SUM, torch.float64, 1.0)):
        res = table.resolve("reduce_scatter_tensor", dtype=dtype, reduce_op="premul_sum" if scale != 1.0 else "sum",
                            world_size=n, nbytes=3 * n * dtype.itemsize)
        if res.level is not xccl.Level.EMULATED and res.prefer is None:
            continue  # the backend's own work: gloo's reduce_scatter has no future at all (torch's, not xccl's)
        inp = torch.stack([_rows(rank, 3, dtype) + 10 * j for j in range(n)])
        out = torch.empty(3, dtype=dtype)
        fut = dist.reduce_scatter_tensor(out, inp, op=op, async_op=True).get_future()
        value = fut.then(lambda f: f.value()[0]).wait()
        want = scale * sum(_rows(r, 3, dtype) + 10 * rank for r in range(n))
        got[f"{name}: then"] = torch.equal(value, want) and value.data_ptr() == out.data_ptr()
    return got


def _avg_hook(state: Any, bucket: Any) -> Any:
    """A DDP communication hook: the bucket averaged by an asynchronous AVG all_reduce (emulated on SCCL)."""
    return dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


# DDP checks a hook's annotations as objects (this module's are strings: ``from __future__ import annotations``).
_avg_hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                             "return": torch.futures.Future[torch.Tensor]}


def body_ddp_hooks() -> dict[str, float]:
    """DDP with an AVG communication hook (float32), and DDP's own hook on a float64 model (whose all_reduce is
    emulated on SCCL and HCCL): 3 steps each, against the single-process reference."""
    from torch.nn.parallel import DistributedDataParallel

    rank, n = dist.get_rank(), dist.get_world_size()
    worst: dict[str, float] = {}
    for name, dtype in (("avg hook", torch.float32), ("float64", torch.float64)):
        ddp = DistributedDataParallel(_model().to(dtype))
        if name == "avg hook":
            ddp.register_comm_hook(None, _avg_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        ref_losses, ref_params = _reference(n, LR)
        worst[name] = 0.0
        for step in range(STEPS):
            x, y = (v.to(dtype) for v in _batch(step))
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x.chunk(n)[rank]), y.chunk(n)[rank])
            loss.backward()
            opt.step()
            worst[name] = max(worst[name], abs(loss.item() - ref_losses[step][rank]))
        for k, v in ddp.module.state_dict().items():
            worst[name] = max(worst[name], (v.double() - ref_params[k].double()).abs().max().item())
    return worst


# --------------------------------------------------------------------------------------------------- the tests

CHECKS = ("premul", "float64", "futures", "ddp_hooks", "fsdp2_divide_factor")
ORDERED = [(plugin, ws, check) for plugin, ws in CASES for check in CHECKS]  # pool order: one config after the other


# The simulated vendors at 4 ranks are the second tier (about 30 s of the file's 60): the first checks every
# reduction on every plugin at 2 ranks and on cpu at 4, and the conformance kit runs each vendor's reductions at 4.
@pytest.mark.parametrize(("plugin", "world_size", "check"), [
    pytest.param(p, w, c, id=f"{p}-{w}ranks-{c}", marks=[pytest.mark.slow] if w == 4 and p != "cpu" else [])
    for p, w, c in ORDERED
])
def test_reduction_through_torch_distributed_matches_the_local_reference(
    rank_pools: Any, plugin: str, world_size: int, check: str
) -> None:
    pool = rank_pools.get(world_size, env=PLUGINS[plugin], fallback="emulate")
    if check == "premul":
        # The factor reaches the kernel intact through the c10d path (dropped before: a raw pybind TypeError on
        # HCCL, UnsupportedCollective on gloo and SCCL, which lack PREMUL_SUM and now emulate it).
        for rank, got in enumerate(pool.run_ok(body_premul, timeout=TIMEOUT)):
            assert all(got.values()), f"rank {rank}: {got}"
    elif check == "float64":
        check_float64(pool.run_ok(body_float64, timeout=TIMEOUT), plugin)
    elif check == "futures":
        # A composed op's future held [] before, and get_future() waited for the collective.
        for rank, got in enumerate(pool.run_ok(body_futures, timeout=TIMEOUT)):
            assert all(got.values()), f"rank {rank}: {[k for k, v in got.items() if not v]}"
    elif check == "ddp_hooks":
        for rank, worst in enumerate(pool.run_ok(body_ddp_hooks, timeout=TIMEOUT)):
            assert all(w < 1e-5 for w in worst.values()), f"rank {rank}: largest differences {worst}"
    else:
        losses = pool.run_ok(body_fsdp2_divide_factor, timeout=TIMEOUT)
        assert all(len(ls) == STEPS for ls in losses), losses
