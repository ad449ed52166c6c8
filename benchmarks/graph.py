"""Graph mode: a tensor-parallel MLP training step (forward + backward), eager vs ``xccl.compile``.

Run under torchrun (2 ranks, gloo)::

    torchrun --standalone --nproc_per_node 2 benchmarks/graph.py [--steps 20] [--dim 512]

Rank 0 prints a table and writes ``benchmarks/results/graph.json``: step time eager and compiled (median of
``--steps`` after warm-up), compile time (first compiled call), graphs and graph breaks (goal: 1 and 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import xccl


def mlp_loss(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Megatron MLP: column-parallel w1, row-parallel w2, one differentiable all_reduce."""
    y = xccl.functional.all_reduce(torch.nn.functional.gelu(x @ w1) @ w2)
    return ((y - target) ** 2).mean() / dist.get_world_size()


def timed_steps(fn: Any, args: tuple[torch.Tensor, ...], steps: int) -> list[float]:
    w1, w2 = args[0], args[1]
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        loss = fn(*args)
        loss.backward()
        with torch.no_grad():
            w1 -= 1e-3 * w1.grad
            w2 -= 1e-3 * w2.grad
        w1.grad = w2.grad = None
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "graph.json")
    parser.add_argument("--quick", action="store_true", help="2 steps of a tiny MLP: a smoke run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.dim, args.batch = 2, 64, 8
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    world = xccl.init()
    n, d = world.world_size, args.dim
    gen = torch.Generator().manual_seed(0)
    w1 = (torch.randn(d, 4 * d // n, generator=gen) / d**0.5).requires_grad_()
    w2 = (torch.randn(4 * d // n, d, generator=gen) / d**0.5).requires_grad_()
    x = torch.randn(args.batch, d, generator=gen)
    target = torch.randn(args.batch, d, generator=gen)
    inputs = (w1, w2, x, target)

    timed_steps(mlp_loss, inputs, 3)
    eager = timed_steps(mlp_loss, inputs, args.steps)

    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(xccl.graph.XcclBackend())
    breaks0 = sum(torch._dynamo.utils.counters["graph_break"].values())
    compiled_fn = torch.compile(mlp_loss, backend=counter)
    dist.barrier()
    t0 = time.perf_counter()
    timed_steps(compiled_fn, inputs, 1)
    compile_s = time.perf_counter() - t0
    timed_steps(compiled_fn, inputs, 3)
    compiled = timed_steps(compiled_fn, inputs, args.steps)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values()) - breaks0

    result = {
        "world_size": n,
        "dim": d,
        "batch": args.batch,
        "steps": args.steps,
        "torch": torch.__version__,
        "eager_step_ms": 1e3 * statistics.median(eager),
        "compiled_step_ms": 1e3 * statistics.median(compiled),
        "compile_s": compile_s,
        "graphs": counter.frame_count,
        "graph_breaks": breaks,
    }
    if world.rank == 0:
        print(f"TP MLP step, {n} ranks, dim {d}, batch {args.batch}, gloo, median of {args.steps}")
        print(f"{'eager step':>18} {result['eager_step_ms']:9.2f} ms")
        print(f"{'compiled step':>18} {result['compiled_step_ms']:9.2f} ms")
        print(f"{'compile (1st call)':>18} {compile_s:9.2f} s")
        print(f"{'graphs / breaks':>18} {counter.frame_count} / {breaks}")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    xccl.shutdown()


if __name__ == "__main__":
    main()
