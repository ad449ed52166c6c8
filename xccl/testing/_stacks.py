"""Training stacks on the plugin's backend: a DDP and an FSDP2 step, checked against a single process.

The kit's per-op checks call xccl; DDP and FSDP2 call ``torch.distributed`` from C++ (DDP's reducer, FSDP2's
all-gather and reduce-scatter streams) on xccl's process group, with the reduce ops, dtypes and async handles they
choose. Each rank trains a tiny MLP for :data:`STEPS` SGD steps on its shard of a fixed global batch and compares
every step's loss and the final parameters with what one process computes on the whole batch (same seed; the mean
of the shard losses is the global mean loss, whose gradient data parallelism averages). The body runs on a
:class:`~xccl.testing.RankPool` rank (module-level, no pytest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch
import torch.distributed as dist
from torch import nn

import xccl
from xccl.plugin._capabilities import Collective

from ._bodies import error_line, note

__all__ = ["STEPS", "needs", "training_steps"]

C = Collective
STEPS: Final = 3
_LR: Final = 0.1
_D_IN, _HIDDEN, _D_OUT = 8, 16, 4
#: Rows of the global batch (divisible by every world size the kit uses by default).
_BATCH: Final = 8
#: Float32 matmuls on an accelerator may round differently from the CPU's; the steps are few and small.
_TOL: Final = 1e-4

#: What each stack calls on the world group: (op, dtype, reduce op or None); docs/plugin-guide.md says when (DDP's
#: int64 all_gather: torch's ``_verify_params_across_processes``, from C++).
needs: Final[dict[str, tuple[tuple[Collective, torch.dtype, str | None], ...]]] = {
    "ddp": ((C.ALL_GATHER, torch.int64, None), (C.BROADCAST, torch.float32, None),
            (C.ALL_REDUCE, torch.float32, "sum")),
    "fsdp2": ((C.ALL_GATHER_INTO_TENSOR, torch.float32, None), (C.REDUCE_SCATTER_TENSOR, torch.float32, "sum")),
}


def refused(table: xccl.CapabilityTable, stack: str, world_size: int) -> list[str]:
    """What ``stack`` calls that ``table`` refuses at ``world_size``, e.g. ``["all_gather(int64)"]``."""
    return [f"{op.value}({str(dtype).removeprefix('torch.')}{', ' + ro if ro else ''})" for op, dtype, ro in needs[stack]
            if not table.supports(op, dtype=dtype, reduce_op=ro, world_size=world_size)]


def _model() -> nn.Sequential:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(_D_IN, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _D_OUT))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(_BATCH, _D_IN, generator=gen), torch.randn(_BATCH, _D_OUT, generator=gen)


def _reference(parts: int) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """One process on the global batch: per step, the loss of each of ``parts`` shards; the final parameters."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        with torch.no_grad():
            losses.append([nn.functional.mse_loss(model(xs), ys).item()
                           for xs, ys in zip(x.chunk(parts), y.chunk(parts), strict=True)])
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(model: nn.Module, shard: int, parts: int, device: torch.device) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    losses = []
    for step in range(STEPS):
        x, y = (t.chunk(parts)[shard].to(device) for t in _batch(step))
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(float(_full(loss.detach())))
    return losses


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank calls it), or the tensor itself."""
    full = getattr(t, "full_tensor", None)
    return t if full is None else full()


def _compare(what: str, losses: list[float], params: dict[str, torch.Tensor], shard: int, parts: int) -> str | None:
    ref_losses, ref_params = _reference(parts)
    want = [step[shard] for step in ref_losses]
    for step, (loss, ref) in enumerate(zip(losses, want, strict=True)):
        if abs(loss - ref) > _TOL * max(1.0, abs(ref)):
            return f"{what}: step {step} loss {loss!r}, single-process reference {ref!r} (all: {losses} vs {want})"
    for name, exp in ref_params.items():
        got = params[name].detach().cpu()
        if got.shape != exp.shape or not torch.allclose(got, exp, rtol=_TOL, atol=_TOL):
            return f"{what}: parameter {name} after {STEPS} steps differs from the single-process reference"
    return None


def _ddp(device: torch.device) -> str | None:
    from torch.nn.parallel import DistributedDataParallel

    rank, n = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(_model().to(device))
    losses = _train(ddp, rank, n, device)
    return _compare("DDP", losses, dict(ddp.module.state_dict()), rank, n)


def _fsdp2(device: torch.device) -> str | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (n,))
    model = _model().to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = _train(model, rank, n, device)
    # full_tensor() gathers: every rank calls it for every parameter, in the same order.
    params = {k: _full(v) for k, v in model.state_dict().items()}
    return _compare("FSDP2", losses, params, rank, n)


_STACKS: Final[dict[str, Callable[[torch.device], str | None]]] = {"ddp": _ddp, "fsdp2": _fsdp2}


def training_steps(progress: str | None = None) -> dict[str, dict[str, str]]:
    """Run every stack the table allows on this rank; per stack ``{"ok": ""}``, ``{"skipped": why}`` or
    ``{"failed": what}``. Every rank runs every stack the table allows (the skips depend on the table only)."""
    w = xccl.get_world()
    table = xccl.capabilities(w.plugin)
    out: dict[str, dict[str, str]] = {}
    for name, body in _STACKS.items():
        missing = refused(table, name, w.world_size)
        if missing:
            out[name] = {"skipped": f"the table refuses {', '.join(missing)}, which {name.upper()} calls"}
            continue
        note(progress, w.rank, f"{name} training steps")
        try:
            why = body(w.device)
        except Exception as exc:  # the stack's own failure is the finding
            why = f"{name.upper()}: {error_line(exc)}"
        out[name] = {"failed": why} if why else {"ok": ""}
    return out
