"""Soak: thousands of randomized collectives on 4 ranks, each result checked against a reference; then the same
with one rank SIGKILLed part-way, checking that every survivor raises a typed error within the timeout.

Every rank draws the same sequence from ``--seed``: op, element count, dtype, group (the world or a pair), and
whether the call is asynchronous (handles are then waited for in batches of up to four). Each member's input is
a pure function of (seed, step, group rank) with small integer values, so every rank computes the exact expected
result locally, in every dtype, and compares with ``torch.equal``. Recorded per rank: collectives run, results
that differed (must be 0), throughput, and resident memory (VmRSS) after warm-up and at the end.

Kill phase: rank ``--victim`` SIGKILLs itself at step ``--kill-at``; each survivor records which typed error it
raised and how long after the death (the bound is ``--timeout`` + 5 s).

Not part of the test run. Usage::

    python benchmarks/soak.py [--steps 4000] [--world 4] [--timeout 10] [--check] [--phase both|clean|kill]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8,
          torch.uint8)
SIZES = (1, 7, 64, 1000, 16_384)
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all_single", "all_to_all_single_uneven", "all_to_all", "gather", "scatter",
       "barrier", "all_gather_into_tensor_uneven", "reduce_scatter_tensor_uneven", "all_to_all_v", "sendrecv")
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_uneven")


@dataclass(frozen=True)
class Step:
    """One randomized call, identical on every rank."""

    index: int
    op: str
    size: int
    dtype: torch.dtype
    group: str
    async_op: bool
    reduce_op: str


def plan(seed: int, steps: int, groups: dict[str, list[int]]) -> list[Step]:
    """The whole sequence, drawn from ``seed`` (the same on every rank)."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        op = rng.choice(OPS)
        dtype = rng.choice(DTYPES)
        group = rng.choice(list(groups))
        if op == "sendrecv" and len(groups[group]) != 2:
            group = next(g for g, r in groups.items() if len(r) == 2)
        redop = "sum"
        if op in REDUCING:
            choices = ["sum", "max", "min", "product"] + (["avg"] if dtype.is_floating_point else [])
            if dtype == torch.uint8:
                choices = ["max", "min"]  # sums and products of small values fit, but keep uint8 clear of wrap
            redop = rng.choice(choices)
        out.append(Step(i, op, rng.choice(SIZES), dtype, group, rng.random() < 0.3, redop))
    return out


def value(seed: int, step: int, r: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``r``'s input at ``step``: small integers, exact in every dtype and after every reduction."""
    g = torch.Generator().manual_seed(hash((seed, step, r)) & 0x7FFF_FFFF)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (n,), generator=g).to(dtype)


def reduce_ref(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in ("sum", "avg"):
            acc = acc + t
        elif op == "product":
            acc = acc * t
        elif op == "max":
            acc = torch.maximum(acc, t)
        else:
            acc = torch.minimum(acc, t)
    if op == "avg":
        acc = acc / len(tensors)
    return acc.to(tensors[0].dtype)


# ------------------------------------------------------------------------------------------------ rank process


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _run_step(s: Step, seed: int, members: list[int], group: Any, me: int) -> tuple[Any, Callable[[], bool]]:
    """Issue one call; returns (work or None, check) where check() compares the result with the reference."""
    import xccl

    n = len(members)
    gr = members.index(me)
    R = xccl.ReduceOp
    redop = {"sum": R.SUM, "max": R.MAX, "min": R.MIN, "product": R.PRODUCT, "avg": R.AVG}[s.reduce_op]
    size, dt, a = s.size, s.dtype, s.async_op

    def val(r: int, k: int = size) -> torch.Tensor:
        return value(seed, s.index, r, k, dt)

    if s.op == "all_reduce":
        t = val(gr)
        w = xccl.all_reduce(t, redop, group, a)
        return w, lambda: torch.equal(t, reduce_ref([val(r) for r in range(n)], s.reduce_op))
    if s.op == "broadcast":
        root = members[s.index % n]
        t = val(members.index(root)) if me == root else torch.zeros(size, dtype=dt)
        w = xccl.broadcast(t, root, group, a)
        return w, lambda: torch.equal(t, val(members.index(root)))
    if s.op == "reduce":
        root = members[s.index % n]
        t = val(gr)
        w = xccl.reduce(t, root, redop, group, a)
        return w, lambda: me != root or torch.equal(t, reduce_ref([val(r) for r in range(n)], s.reduce_op))
    if s.op == "all_gather":
        outs = [torch.empty(size, dtype=dt) for _ in range(n)]
        w = xccl.all_gather(outs, val(gr), group, a)
        return w, lambda: all(torch.equal(outs[r], val(r)) for r in range(n))
    if s.op == "all_gather_into_tensor":
        out = torch.empty(size * n, dtype=dt)
        w = xccl.all_gather_into_tensor(out, val(gr), group, a)
        return w, lambda: torch.equal(out, torch.cat([val(r) for r in range(n)]))
    if s.op == "reduce_scatter":
        out = torch.empty(size, dtype=dt)
        ins = [val(gr, size * n)[j * size:(j + 1) * size].clone() for j in range(n)]
        w = xccl.reduce_scatter(out, ins, redop, group, a)
        ref = lambda: reduce_ref([val(r, size * n)[gr * size:(gr + 1) * size] for r in range(n)], s.reduce_op)  # noqa: E731
        return w, lambda: torch.equal(out, ref())
    if s.op == "reduce_scatter_tensor":
        out = torch.empty(size, dtype=dt)
        w = xccl.reduce_scatter_tensor(out, val(gr, size * n), redop, group, a)
        ref = lambda: reduce_ref([val(r, size * n)[gr * size:(gr + 1) * size] for r in range(n)], s.reduce_op)  # noqa: E731
        return w, lambda: torch.equal(out, ref())
    if s.op in ("all_to_all_single", "all_to_all_single_uneven", "all_to_all_v"):
        uneven = s.op != "all_to_all_single"
        # counts[i][j]: elements rank i sends to rank j.
        counts = [[(size + i + 2 * j) % 5 + 1 if uneven else size for j in range(n)] for i in range(n)]
        inp = val(gr, sum(counts[gr]))
        out = torch.empty(sum(row[gr] for row in counts), dtype=dt)
        if s.op == "all_to_all_v":
            w = xccl.all_to_all_v(out, inp, counts, group, a)
        else:
            w = xccl.all_to_all_single(out, inp, [row[gr] for row in counts], counts[gr], group, a)

        def a2a_ref() -> torch.Tensor:
            parts = []
            for i in range(n):
                start = sum(counts[i][:gr])
                parts.append(val(i, sum(counts[i]))[start:start + counts[i][gr]])
            return torch.cat(parts)

        return w, lambda: torch.equal(out, a2a_ref())
    if s.op == "all_to_all":
        ins = [val(gr, size * n)[j * size:(j + 1) * size].clone() for j in range(n)]
        outs = [torch.empty(size, dtype=dt) for _ in range(n)]
        w = xccl.all_to_all(outs, ins, group, a)
        return w, lambda: all(torch.equal(outs[i], val(i, size * n)[gr * size:(gr + 1) * size]) for i in range(n))
    if s.op == "gather":
        root = members[s.index % n]
        lst = [torch.empty(size, dtype=dt) for _ in range(n)] if me == root else None
        w = xccl.gather(val(gr), lst, root, group, a)
        return w, lambda: lst is None or all(torch.equal(lst[r], val(r)) for r in range(n))
    if s.op == "scatter":
        root = members[s.index % n]
        out = torch.empty(size, dtype=dt)
        lst = [val(n + r) for r in range(n)] if me == root else None
        w = xccl.scatter(out, lst, root, group, a)
        return w, lambda: torch.equal(out, val(n + gr))
    if s.op == "barrier":
        return xccl.barrier(group, a), lambda: True
    if s.op == "all_gather_into_tensor_uneven":
        rows = [(size + r) % 4 + 1 for r in range(n)]
        out = torch.empty(sum(rows), dtype=dt)
        w = xccl.all_gather_into_tensor_uneven(out, val(gr, rows[gr]), rows, group, a)
        return w, lambda: torch.equal(out, torch.cat([val(r, rows[r]) for r in range(n)]))
    if s.op == "reduce_scatter_tensor_uneven":
        rows = [(size + r) % 4 + 1 for r in range(n)]
        out = torch.empty(rows[gr], dtype=dt)
        w = xccl.reduce_scatter_tensor_uneven(out, val(gr, sum(rows)), rows, redop, group, a)
        lo = sum(rows[:gr])
        return w, lambda: torch.equal(out, reduce_ref([val(r, sum(rows))[lo:lo + rows[gr]] for r in range(n)],
                                                      s.reduce_op))
    if s.op == "sendrecv":
        peer = members[1 - gr]
        got = torch.empty(size, dtype=dt)
        works = [xccl.isend(val(gr), peer, group), xccl.irecv(got, peer, group)]
        if not a:
            for work in works:
                work.wait()
            works = []
        return (_Both(works) if works else None), lambda: torch.equal(got, val(1 - gr))
    raise AssertionError(s.op)


class _Both:
    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def _rank(rank: int, args: argparse.Namespace, port: int, phase: str, death: Any, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(args.world))
    torch.set_num_threads(1)
    import xccl

    xccl.init("cpu", timeout=args.timeout, fallback="emulate", check=args.check)
    n = args.world
    spec = {"world": list(range(n)), "pair_lo": [0, 1], "pair_hi": [n - 2, n - 1], "ends": [0, n - 1]}
    groups = {name: (None if name == "world" else xccl.new_group(ranks)) for name, ranks in spec.items()}
    steps = plan(args.seed, args.steps, spec)
    kill_at = args.kill_at if phase == "kill" else -1
    done = wrong = 0
    first_wrong: list[str] = []
    pending: list[tuple[Any, Callable[[], bool], Step]] = []
    rss0 = rss_start = _rss_mb()
    samples: list[tuple[int, float]] = []
    started = time.monotonic()

    def flush() -> None:
        nonlocal wrong
        for work, check, st in pending:
            work.wait()
            if not check():
                wrong += 1
                if len(first_wrong) < 5:
                    first_wrong.append(f"{st}")
        pending.clear()

    result: dict[str, Any] = {"rank": rank}
    try:
        for s in steps:
            if s.index == kill_at and rank == args.victim:
                death.value = time.time()
                os.kill(os.getpid(), signal.SIGKILL)
            if s.index == args.warmup:
                flush()
                rss_start, started, done = _rss_mb(), time.monotonic(), 0
            if s.index % 500 == 0:
                samples.append((s.index, round(_rss_mb(), 1)))
            members = spec[s.group]
            if rank not in members:
                continue
            work, check = _run_step(s, args.seed, members, groups[s.group], rank)
            done += 1
            if work is None:
                if not check():
                    wrong += 1
                    if len(first_wrong) < 5:
                        first_wrong.append(f"{s}")
            else:
                pending.append((work, check, s))
                if len(pending) >= 4:
                    flush()
        flush()
        result.update(error="")
    except xccl.XcclError as exc:
        result.update(error=type(exc).__name__, error_at=time.time(), message=str(exc).splitlines()[0][:300])
    except Exception as exc:  # an untyped error is a finding: report it
        result.update(error=f"untyped {type(exc).__name__}", error_at=time.time(), message=str(exc)[:300])
    elapsed = time.monotonic() - started
    result.update(
        collectives=done, wrong=wrong, first_wrong=first_wrong, seconds=elapsed,
        per_second=done / elapsed if elapsed > 0 else 0.0, rss_init_mb=rss0, rss_start_mb=rss_start,
        rss_end_mb=_rss_mb(), rss_samples=samples,
    )
    queue.put(result)
    if not result["error"]:
        xccl.barrier()
        xccl.shutdown()


def _phase(args: argparse.Namespace, phase: str) -> dict[str, Any]:
    import multiprocessing as mp

    from xccl.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    death = ctx.Value("d", 0.0)
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, args, port, phase, death, queue)) for r in range(args.world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    expected = args.world - (1 if phase == "kill" else 0)
    results = []
    deadline = time.monotonic() + args.deadline
    while len(results) < expected and time.monotonic() < deadline:
        try:
            results.append(queue.get(timeout=5))
        except Exception:  # queue.Empty: keep waiting until the deadline
            continue
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    out: dict[str, Any] = {"phase": phase, "wall_s": time.monotonic() - t0, "ranks": sorted(results, key=lambda r: r["rank"])}
    if phase == "kill":
        out["victim"], out["kill_at"] = args.victim, args.kill_at
        out["death_to_error_s"] = {r["rank"]: r["error_at"] - death.value for r in results if r.get("error_at")}
        out["silent_ranks"] = sorted(set(range(args.world)) - {args.victim} - {r["rank"] for r in results})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--warmup", type=int, default=200, help="steps before throughput and RSS are measured")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=10.0, help="xccl.init(timeout=...) in seconds")
    p.add_argument("--check", action="store_true", help="run with the mismatch detector on")
    p.add_argument("--phase", choices=("both", "clean", "kill"), default="both")
    p.add_argument("--kill-at", type=int, default=1500)
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--deadline", type=float, default=1800.0, help="seconds before the parent gives up on a phase")
    p.add_argument("--json", default="benchmarks/results/soak.json")
    p.add_argument("--quick", action="store_true", help="2 ranks, 40 steps, the kill at step 20: a smoke run (tests)")
    args = p.parse_args()
    if args.quick:
        args.world, args.steps, args.warmup, args.kill_at, args.victim, args.timeout = 2, 40, 5, 20, 1, 5.0
    phases = ["clean", "kill"] if args.phase == "both" else [args.phase]
    report: dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "phases": {}}
    for phase in phases:
        res = report["phases"][phase] = _phase(args, phase)
        print(f"\n== {phase}: {args.world} ranks, {args.steps} steps, seed {args.seed}, timeout {args.timeout:g} s"
              f"{', detector on' if args.check else ''}  (wall {res['wall_s']:.0f} s)")
        print(f"{'rank':>4} {'collectives':>11} {'wrong':>5} {'per s':>8} {'RSS start':>10} {'RSS end':>8} "
              f"{'growth':>7}  error")
        for r in res["ranks"]:
            growth = r["rss_end_mb"] - r["rss_start_mb"]
            after = res.get("death_to_error_s", {}).get(r["rank"])
            err = r["error"] + (f" {after:.2f} s after the death" if after is not None else "")
            print(f"{r['rank']:>4} {r['collectives']:>11} {r['wrong']:>5} {r['per_second']:>8.0f} "
                  f"{r['rss_start_mb']:>8.1f}MB {r['rss_end_mb']:>6.1f}MB {growth:>5.1f}MB  {err}")
        if phase == "clean":
            ranks = res["ranks"]
            res["summary"] = {
                "collectives": sum(r["collectives"] for r in ranks),
                "wrong": sum(r["wrong"] for r in ranks),
                "median_per_second": statistics.median(r["per_second"] for r in ranks) if ranks else 0,
                "max_rss_growth_mb": max((r["rss_end_mb"] - r["rss_start_mb"] for r in ranks), default=0),
                "errors": [r["error"] for r in ranks if r["error"]],
            }
            print("summary:", res["summary"])
        else:
            bound = args.timeout + 5
            late = {k: v for k, v in res["death_to_error_s"].items() if v > bound}
            res["summary"] = {
                "survivors": args.world - 1,
                "raised": {r["rank"]: r["error"] for r in res["ranks"]},
                "max_death_to_error_s": max(res["death_to_error_s"].values(), default=None),
                "late": late,
                "silent": res["silent_ranks"],
                "wrong_before_death": sum(r["wrong"] for r in res["ranks"]),
            }
            print("summary:", res["summary"])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
