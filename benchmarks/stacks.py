"""DDP and FSDP2 step time on xccl's process group against the bare vendor group, and c10d's per-call overhead.

2 ranks on the cpu plugin (gloo underneath). The same model (an MLP of ``--layers`` Linear layers of ``--hidden``
features, batch ``--batch``, MSE loss, SGD) is trained four ways in one run:

* DDP on the world (xccl's process group: every gradient all_reduce goes through xccl's dispatch) and DDP with
  ``process_group=raw``, where ``raw = xccl.runtime.vendor_group()`` is a plain gloo group, no xccl;
* FSDP2 (``fully_shard`` on every layer and the root) on ``init_device_mesh("cpu", (2,))`` (xccl's group) and on
  ``DeviceMesh.from_group(raw, "cpu")``.

A third variant, the same as raw on a second plain gloo group, is the A/A control: what two communicators differ
by without xccl. The variants alternate in rounds (``--rounds`` of ``--steps`` steps each, the first of each pair alternating) so
that both see the same machine noise; we report the median step time of each and their ratio (goal: xccl/raw
<= 1.02). Then the per-call cost of a c10d ``torch.distributed.all_reduce`` (1 element, 1 MiB) on xccl's group
against the same call on the raw group, interleaved the same way (``--calls`` calls per round). A round's time
is rank 0's; the ranks are in lockstep through the collectives.

Usage: ``python benchmarks/stacks.py [--rounds 20] [--steps 10] [--calls 200] [--json benchmarks/results/stacks.json]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

WORLD = 2


def _mlp(args: argparse.Namespace) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import xccl
    from xccl.runtime import vendor_group

    xccl.init("cpu", fallback="emulate")
    raw = vendor_group()
    # The A/A control: a second plain gloo group. Two communicators differ by several percent on a loaded machine
    # by scheduling alone (docs/performance.md, "xccl against raw"); raw2 vs raw shows how much.
    raw2 = vendor_group()
    assert isinstance(dist.group.WORLD, xccl.XcclProcessGroup)
    assert not isinstance(raw, xccl.XcclProcessGroup)

    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, args.hidden, generator=gen)
    y = torch.randn(args.batch, args.hidden, generator=gen)

    def trainer(model: torch.nn.Module) -> Callable[[], None]:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        return step

    def fsdp(mesh: Any) -> torch.nn.Module:
        model = _mlp(args)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    variants: dict[str, dict[str, Callable[[], None]]] = {
        "ddp": {
            "xccl": trainer(DistributedDataParallel(_mlp(args))),
            "raw": trainer(DistributedDataParallel(_mlp(args), process_group=raw)),
            "aa": trainer(DistributedDataParallel(_mlp(args), process_group=raw2)),
        },
        "fsdp2": {
            "xccl": trainer(fsdp(init_device_mesh("cpu", (world,)))),
            "raw": trainer(fsdp(DeviceMesh.from_group(raw, "cpu"))),
            "aa": trainer(fsdp(DeviceMesh.from_group(raw2, "cpu"))),
        },
    }
    small, big = torch.ones(1), torch.ones((1 << 20) // 4)

    def all_reduce(t: torch.Tensor, group: Any) -> Callable[[], None]:
        def call() -> None:
            dist.all_reduce(t, group=group)

        return call

    variants["all_reduce_1"] = {"xccl": all_reduce(small, None), "raw": all_reduce(small, raw),
                                "aa": all_reduce(small, raw2)}
    variants["all_reduce_1MiB"] = {"xccl": all_reduce(big, None), "raw": all_reduce(big, raw),
                                   "aa": all_reduce(big, raw2)}
    repeats = {"ddp": args.steps, "fsdp2": args.steps, "all_reduce_1": args.calls, "all_reduce_1MiB": max(1, args.calls // 10)}

    def timed(fn: Callable[[], None], n: int) -> float:
        dist.barrier(group=raw)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    orders = list(itertools.permutations(("xccl", "raw", "aa")))
    out: dict[str, dict[str, list[float]]] = {}
    for name, trio in variants.items():
        for _ in range(args.warmup):
            for fn in trio.values():
                fn()
        times: dict[str, list[float]] = {k: [] for k in trio}
        for i in range(args.rounds):
            # Cycle through every order so that none always follows the barrier or another variant.
            for k in orders[i % len(orders)]:
                times[k].append(timed(trio[k], repeats[name]))
        out[name] = {"xccl_s": times["xccl"], "raw_s": times["raw"], "aa_s": times["aa"]}
    dist.barrier(group=raw)
    if rank == 0:
        queue.put(out)
    del variants
    xccl.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=10, help="training steps per round")
    p.add_argument("--calls", type=int, default=200, help="1-element all_reduce calls per round (1 MiB: a tenth)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", default="benchmarks/results/stacks.json")
    p.add_argument("--quick", action="store_true", help="1 round of 1 step on a tiny MLP: a smoke run (tests)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.steps, args.calls, args.warmup, args.layers, args.hidden, args.batch = 1, 1, 10, 1, 1, 16, 4
    from xccl.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, WORLD, port, args, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    try:
        res = queue.get(timeout=1800)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    rows = {}
    print(f"{'variant':<18}{'raw gloo group':>16}{'xccl group':>16}{'xccl/raw':>10}{'paired':>10}"
          f"{'A/A raw2/raw':>14}{'paired':>10}")
    for name, r in res.items():
        mx, mr, ma = (statistics.median(r[k]) for k in ("xccl_s", "raw_s", "aa_s"))
        paired = statistics.median(x / d for x, d in zip(r["xccl_s"], r["raw_s"], strict=True))
        paired_aa = statistics.median(a / d for a, d in zip(r["aa_s"], r["raw_s"], strict=True))
        unit, scale = ("ms", 1e3) if name in ("ddp", "fsdp2") else ("us", 1e6)
        print(f"{name:<18}{mr * scale:>13.2f} {unit}{mx * scale:>13.2f} {unit}{mx / mr:>10.3f}{paired:>10.3f}"
              f"{ma / mr:>14.3f}{paired_aa:>10.3f}")
        rows[name] = {
            "aa_ratio_of_medians": ma / mr,
            "aa_median_of_paired_ratios": paired_aa,
            "aa_s": r["aa_s"],
            "raw_median_s": mr,
            "xccl_median_s": mx,
            "ratio_of_medians": mx / mr,
            "median_of_paired_ratios": paired,
            "xccl_s": r["xccl_s"],
            "raw_s": r["raw_s"],
        }
    steps = [rows[k]["ratio_of_medians"] for k in ("ddp", "fsdp2")]
    print(f"goal: step-time ratio xccl/raw <= 1.02; got DDP {steps[0]:.3f}, FSDP2 {steps[1]:.3f} "
          f"({'met' if max(steps) <= 1.02 else 'not met'})")
    doc = {
        "world_size": WORLD,
        "plugin": "cpu",
        "model": f"MLP {args.layers} x Linear({args.hidden}, {args.hidden}), batch {args.batch}, SGD, float32",
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "calls_per_round": {"all_reduce_1": args.calls, "all_reduce_1MiB": max(1, args.calls // 10)},
        "goal_step_ratio": 1.02,
        "results": rows,
        "torch": torch.__version__,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
