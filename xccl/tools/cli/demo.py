"""``xccl demo``: train a small tensor-parallel MLP on N local ranks through xccl collectives (docs/cli.md).

Megatron-style: the first linear layer is split by output columns, the second by input rows, and one all_reduce
joins the partial outputs. Every rank starts from the same seed, so the sharded model is the single-device model
that rank 0 trains alongside.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(name, help="train a small tensor-parallel MLP on local CPU ranks through xccl")
    p.add_argument("-n", "--nproc", type=int, default=2, help="number of local ranks (default 2)")
    p.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    p.add_argument("--hidden", type=int, default=256, help="hidden width, split across ranks (default 256)")
    p.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--vendor", default="cpu", help="plugin to use (default cpu)")
    p.add_argument("--simulate", action="store_true", help="run a vendor plugin in CPU simulation")
    p.add_argument("--compile", action="store_true", help="compile the training step with torch.compile")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Launch the ranks and wait for them."""
    import torch.multiprocessing as mp

    from ...testing._pool import free_port

    if args.nproc < 1:
        print("xccl demo: --nproc must be >= 1")
        return 2
    if args.hidden % args.nproc:
        print(f"xccl demo: --hidden {args.hidden} must be divisible by --nproc {args.nproc}")
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    mp.start_processes(  # type: ignore[no-untyped-call]
        _rank_main, args=(args,), nprocs=args.nproc, join=True, start_method="spawn")
    return 0


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank))

    # torch here, not at the top: the parser is built for every `xccl` command, --help included.
    import torch

    import xccl

    torch.set_num_threads(args.threads)
    world = xccl.init(args.vendor, simulate=args.simulate or None, fallback="emulate")
    try:
        _train(world, args)
    finally:
        xccl.shutdown()


def _train(world: Any, args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    import xccl

    n, rank, d, h = world.world_size, world.rank, 32, args.hidden
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(d, h, generator=gen) / d**0.5
    w2 = torch.randn(h, d, generator=gen) / h**0.5
    x = torch.randn(args.batch, d, generator=gen)
    target = torch.sin(x)
    shard = slice(rank * h // n, (rank + 1) * h // n)
    w1s = w1[:, shard].clone().requires_grad_()
    w2s = w2[shard, :].clone().requires_grad_()
    opt = torch.optim.SGD([w1s, w2s], lr=0.1)

    def forward(w1s: Any, w2s: Any) -> Any:
        # xccl.functional.all_reduce is differentiable with the adjoint collective as its backward (an all_reduce
        # of the gradients), which treats the n identical per-rank losses as one summed loss: step() scales by
        # 1/n so the gradients are the single-device ones.
        y = xccl.functional.all_reduce(F.gelu(x @ w1s) @ w2s)
        return F.mse_loss(y, target)

    if args.compile:
        # Forward and backward (through AOT autograd) are compiled; the optimizer step stays eager.
        forward = xccl.compile(forward, fullgraph=True)

    def step() -> Any:
        opt.zero_grad()
        loss = forward(w1s, w2s)
        (loss / n).backward()
        opt.step()
        return loss.detach()

    all_same = True
    if rank == 0:
        ref_w = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
        ref_opt = torch.optim.SGD(ref_w, lr=0.1)
        print(f"xccl demo: {n} ranks, plugin {world.plugin} ({world.backend}{', simulated' if world.simulate else ''}), "
              f"TP MLP {d}->{h}->{d}, batch {args.batch}{', compiled' if args.compile else ''}")
        print(f"{'step':>4}  {'loss':>12}  {'same on all ranks':>17}  {'vs 1-device':>11}  {'ms/step':>8}")
    for i in range(args.steps):
        xccl.barrier()
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        losses = [torch.empty(1) for _ in range(n)]
        xccl.all_gather(losses, loss.reshape(1))
        same = all(torch.equal(losses[0], v) for v in losses)
        all_same = all_same and same
        times = [torch.empty(1, dtype=torch.float64) for _ in range(n)]
        xccl.all_gather(times, torch.tensor([dt], dtype=torch.float64))
        if rank == 0:
            ref_opt.zero_grad()
            ref = F.mse_loss(F.gelu(x @ ref_w[0]) @ ref_w[1], target)
            ref.backward()  # type: ignore[no-untyped-call]
            ref_opt.step()
            diff = abs(float(ref.detach()) - float(loss))
            slowest = max(float(t) for t in times) * 1e3
            print(f"{i:>4}  {float(loss):>12.6f}  {'yes' if same else 'NO':>17}  {diff:>11.2e}  {slowest:>8.2f}")
    if rank == 0:
        print("done: loss identical on every rank at every step" if all_same else "loss differs between ranks!")
