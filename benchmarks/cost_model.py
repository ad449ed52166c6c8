"""The cost model on this machine: fitted from ``xccl bench``, checked against the communication time of real steps.

For each world size (2 and 4 ranks, the cpu plugin over gloo on loopback):

1. **fit**: ``xccl bench --json`` of all_reduce from 1 KiB to 4 MiB (the sizes the steps below move), fitted by
   :func:`xccl.tools._cost_fit.calibrate` into latency + bus bandwidth (the fit's own JSON is kept next to the
   results), three ways: ``b2b``, the calls back to back (``xccl bench``'s default); ``idle``, each call after a
   barrier and ``--gap-us`` of sleep (``xccl bench --gap-us``), as a training step issues its calls; ``busy``, the
   same gap spent computing (``--gap-busy``), as a step's forward pass keeps the core;
2. **predict**: the flight recorder lists every collective one step issues (op, bytes); the prediction is the sum
   of :func:`xccl.tools._cost_model.predict` over them;
3. **measure**: the step's communication time, two ways, in the same processes:

   * ``step diff``: the step's time with its communication minus the same step without it (the demo's forward
     with the identity in place of its all_reduce; DDP under ``no_sync()``), the two alternating step by step so
     that the machine's noise falls on both; a step's time is the slowest rank's after a barrier; the figure is the
     median over steps of the paired difference;
   * ``recorder``: per collective of the step, from the flight recorder of every rank (one clock: one host), the
     last rank's completion minus the last rank's start, summed over the step's calls, median over steps: the
     communication alone, without the wait for a peer still computing, which the step difference includes (a
     step with two collectives synchronizes its ranks twice: the sum of two phases' slowest ranks exceeds the
     slowest rank's sum).

   And, as a control, ``alone``: the step's all_reduces again right after it, one by one after a barrier as
   ``xccl bench`` times them: the same calls in the same minute without the step around them, which separates a
   fit taken at another time (predicted vs alone) from calls costing more inside a step (alone vs the others).

The steps: (a) the demo's (``xccl demo``: a tensor-parallel MLP 32 -> hidden -> 32, batch 64, whose forward
all_reduce and its backward all_reduce each move batch x 32 float32); (b) a DDP step of a small MLP (256 -> 1024 ->
256, 0.5 M parameters: DDP's gradient buckets, 1 MiB first, then the rest).

Two statistics, side by side: ``median`` (the fit to the bench's medians; measured: the median of the paired step
differences) and ``q1`` (the fit to the bench's lower quartiles; measured: the lower quartile of the steps with
communication minus that of the steps without): on a shared machine the lower quartile is the better estimate of the
uncontended cost on both sides. The ratio is predicted / measured; the issue's bar is within 25% (0.75-1.25). The
figures move from run to run with the machine's load: the table is one run's.

Usage::

    python benchmarks/cost_model.py                  # 2 and 4 ranks, 40 steps per workload
    python benchmarks/cost_model.py --quick          # 2 ranks, few steps and sizes: a smoke run (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.spawn import start_processes

RESULTS = Path(__file__).resolve().parent / "results" / "cost_model.json"
WORKLOADS = ("demo", "ddp")


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


# ------------------------------------------------------------------------------------------------ the steps


def _demo_step(rank: int, n: int, hidden: int) -> tuple[Callable[[bool], None], Any]:
    """The demo's training step (xccl/tools/cli/demo.py), with or without its all_reduce."""
    import torch.nn.functional as F

    import xccl

    d, batch = 32, 64
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(d, hidden, generator=gen) / d**0.5
    w2 = torch.randn(hidden, d, generator=gen) / hidden**0.5
    x = torch.randn(batch, d, generator=gen)
    target = torch.sin(x)
    shard = slice(rank * hidden // n, (rank + 1) * hidden // n)
    w1s = w1[:, shard].clone().requires_grad_()
    w2s = w2[shard, :].clone().requires_grad_()
    opt = torch.optim.SGD([w1s, w2s], lr=0.1)

    def step(comm: bool) -> None:
        opt.zero_grad()
        y = F.gelu(x @ w1s) @ w2s
        loss = F.mse_loss(xccl.functional.all_reduce(y) if comm else y, target)
        (loss / n).backward()
        opt.step()

    return step, None


def _ddp_step(rank: int, n: int, hidden: int) -> tuple[Callable[[bool], None], Any]:
    """A DDP step of a small MLP; without communication under ``no_sync()``."""
    import contextlib

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # the default group: xccl's world
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank))

    def step(comm: bool) -> None:
        opt.zero_grad()
        with contextlib.nullcontext() if comm else ddp.no_sync():
            ddp(x).square().mean().backward()
        opt.step()

    return step, ddp


# ------------------------------------------------------------------------------------------------ the ranks


def _slowest(value: float) -> float:
    import xccl

    t = torch.tensor([value], dtype=torch.float64)
    xccl.all_reduce(t, xccl.ReduceOp.MAX)
    return float(t.item())


def _from_last_arrival(stamps: list[tuple[int, int]], n: int) -> float:
    """Per call, the last rank's completion minus the last rank's start (``time.time_ns``, one clock on one host),
    summed over the step's calls: the communication itself, without the wait for a peer still computing."""
    import xccl

    mine = torch.tensor(stamps, dtype=torch.int64).reshape(-1, 2)
    every = [torch.empty_like(mine) for _ in range(n)]
    xccl.all_gather(every, mine)
    last = torch.stack(every).amax(dim=0)  # per call: (last start, last completion)
    return float((last[:, 1] - last[:, 0]).clamp(min=0).sum()) * 1e-9


def _back_to_back(calls: list[tuple[str, int]]) -> float:
    """The step's all_reduces again, alone, one after another as ``xccl bench`` times them (each after a barrier,
    the slowest rank's time), summed: the same calls in the same minute, without the step around them."""
    import xccl

    total = 0.0
    for op, nbytes in calls:
        if op != "all_reduce":
            continue
        x = torch.ones(max(1, nbytes // 4))
        xccl.barrier()
        t0 = time.perf_counter()
        xccl.all_reduce(x)
        total += _slowest(time.perf_counter() - t0)
    return total


def _nbytes(specs: tuple[Any, ...]) -> int:
    total = 0
    for shape, dtype in specs:
        numel = 1
        for s in shape:
            numel *= int(s)
        total += numel * torch.empty((), dtype=dtype).element_size()
    return total


def _measure(name: str, rank: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    import xccl
    from xccl.collectives._flight import recorder as flight_recorder

    build = _demo_step if name == "demo" else _ddp_step
    step, _keep = build(rank, n, args.hidden)
    flight = flight_recorder()
    assert flight is not None, "the flight recorder is off (XCCL_TRACE is set by the launcher)"
    for _ in range(args.warmup):
        step(True)
        step(False)
    diffs: list[float] = []
    with_comm: list[float] = []
    without: list[float] = []
    alone: list[float] = []
    recorded: list[float] = []
    calls: list[tuple[str, int]] = []
    for i in range(args.steps):
        times = {}
        for comm in ((True, False) if i % 2 == 0 else (False, True)):
            xccl.barrier()
            mark = len(flight.entries())
            before = flight.entries()[-1].record_id if mark else -1
            t0 = time.perf_counter()
            step(comm)
            dt = time.perf_counter() - t0
            if comm:
                # DDP's reducer waits on its futures inside backward, so every call is complete when step returns.
                mine = [e for e in flight.entries() if e.record_id > before]
                calls = [(e.op, _nbytes(e.inputs)) for e in mine]
                recorded.append(_from_last_arrival([(e.started, e.completed) for e in mine], n))
            times[comm] = _slowest(dt)
        with_comm.append(times[True])
        without.append(times[False])
        alone.append(_back_to_back(calls))
        diffs.append(times[True] - times[False])
    return {"calls": calls, "diff_s": diffs, "step_s": with_comm, "bare_s": without, "recorder_s": recorded,
            "alone_s": alone}


def _rank(rank: int, n: int, port: int, args: argparse.Namespace, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n),
                      LOCAL_RANK=str(rank), XCCL_TRACE="1")
    torch.set_num_threads(1)
    import xccl

    xccl.init("cpu", fallback="emulate", timeout=300)
    out = {name: _measure(name, rank, n, args) for name in WORKLOADS}
    if rank == 0:
        Path(path).write_text(json.dumps(out))
    xccl.barrier()
    xccl.shutdown()
    sys.stdout.flush()
    os._exit(0)  # skip C++ static destructors after a clean shutdown (gloo threads at interpreter exit)


def _steps(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from xccl.testing import free_port

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        start_processes(_rank, args=(n, free_port(), args, path), nprocs=n, start_method="spawn")  # type: ignore[no-untyped-call]
        return json.loads(Path(path).read_text())  # type: ignore[no-any-return]
    finally:
        os.unlink(path)


# ------------------------------------------------------------------------------------------------ fit + report


def _fit(n: int, args: argparse.Namespace, out_dir: Path) -> dict[tuple[str, str], Any]:
    """The models fitted to ``xccl bench`` at ``n`` ranks, by (timing, statistic): ``b2b``, calls back to back as
    ``xccl bench`` times them by default; ``idle``, each call after a barrier and ``--gap-us`` of sleep
    (``xccl bench --gap-us``), as a step issues it; ``busy``, the same gap spent computing (``--gap-busy``)."""
    from xccl.tools._bench import launch
    from xccl.tools._bench_config import BenchConfig
    from xccl.tools._cost_fit import calibrate

    models = {}
    for timing, gap, busy in (("b2b", 0.0, False), ("idle", args.gap_us, False), ("busy", args.gap_us, True)):
        cfg = BenchConfig(ops=("all_reduce",), plugin="cpu", nproc=n, min_bytes=1 << 10, max_bytes=args.max_bytes,
                          factor=4.0, iters=args.iters, warmup=3, table=False, threads=1, gap_us=gap, gap_busy=busy)
        doc = launch(cfg)
        path = out_dir / f"cost_model_bench_{n}_{timing}.json"
        path.write_text(json.dumps(doc))
        for stat in ("median", "q1"):
            models[timing, stat] = calibrate(path, generation=f"this host, {n} ranks, {timing}", intra_node=True,
                                             stat=stat)
    return models


def _predict(model: Any, calls: list[tuple[str, int]], n: int) -> tuple[float | None, list[str]]:
    from xccl.plugin import Collective
    from xccl.tools._cost_model import predict

    total, why = 0.0, []
    for op, nbytes in calls:
        p = predict(model, Collective(op), nbytes, n, intra_node=True)
        if p.seconds is None:
            return None, [p.why]
        total += p.seconds
        why.append(f"{op} {nbytes} B: {p.seconds * 1e6:.0f} us")
    return total, why


def main() -> int:
    """Fit, predict and measure at each world size; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    parser.add_argument("--steps", type=int, default=40, help="timed step pairs per workload (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed step pairs (default 5)")
    parser.add_argument("--iters", type=int, default=30, help="xccl bench rounds per size (default 30)")
    parser.add_argument("--max-bytes", type=int, default=4 << 20, help="largest bench size (default 4 MiB)")
    parser.add_argument("--hidden", type=int, default=256, help="the demo's hidden width (default 256)")
    parser.add_argument("--gap-us", type=float, default=1000.0,
                        help="the gap before each call of the 'idle' and 'busy' fits (xccl bench --gap-us; "
                        "default 1000)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"output (default {RESULTS})")
    parser.add_argument("--quick", action="store_true", help="2 ranks, few steps and sizes: a smoke run (tests)")
    args = parser.parse_args()
    if args.quick:
        # Sizes up to the default 4 MiB even here: with 1 MiB at most, 3 rounds on a loaded machine could time the
        # smallest size above the largest, and no bandwidth could be fitted (the smoke run then failed).
        args.ranks, args.steps, args.warmup, args.iters = [2], 3, 1, 3
    args.json.parent.mkdir(parents=True, exist_ok=True)

    doc: dict[str, Any] = {"torch": torch.__version__, "cpus": os.cpu_count(), "steps": args.steps,
                           "iters": args.iters, "loadavg": os.getloadavg(), "runs": []}
    print(f"# cost model: fitted from xccl bench (cpu plugin, all_reduce 1 KiB..{args.max_bytes >> 10} KiB, "
          f"{args.iters} rounds), against {args.steps} step pairs; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    head = (f"{'ranks':>5}  {'workload':<8} {'calls':>5} {'bytes/step':>10}  {'fit':<11} {'predicted ms':>12}  "
            f"{'step diff ms':>12}  {'ratio':>5}  {'recorder ms':>11}  {'ratio':>5}  {'alone ms':>8}  {'ratio':>5}")
    rows: list[str] = []

    def ratio(p: float | None, m: float) -> float | None:
        return p / m if p is not None and m > 0 else None

    def fmt(r: float | None) -> str:
        return "-" if r is None else f"{r:.2f}"

    for n in args.ranks:
        models = _fit(n, args, args.json.parent)
        for (timing, stat), model in models.items():
            cost = model.intra[next(iter(model.intra))]
            print(f"  {n} ranks: all_reduce fitted ({timing} {stat}): latency {cost.latency_us:.1f} us, busbw "
                  f"{cost.busbw_gbps:.3f} GB/s", flush=True)
        steps = _steps(n, args)
        for name in WORKLOADS:
            res = steps[name]
            calls = [(op, int(b)) for op, b in res["calls"]]
            # median: the median of the paired differences, and of the recorder's sums; q1: the lower quartiles of
            # the steps with and without communication, subtracted, and of the recorder's sums (the uncontended
            # cost, as the q1 fit estimates it).
            measured = {
                "median": (statistics.median(res["diff_s"]), statistics.median(res["recorder_s"]),
                           statistics.median(res["alone_s"])),
                "q1": (_quartiles(res["step_s"])[0] - _quartiles(res["bare_s"])[0], _quartiles(res["recorder_s"])[0],
                       _quartiles(res["alone_s"])[0]),
            }
            run: dict[str, Any] = {"ranks": n, "workload": name, "calls": calls,
                                   "step_s": statistics.median(res["step_s"]),
                                   "bare_step_s": statistics.median(res["bare_s"])}
            for (timing, stat), model in models.items():
                predicted, why = _predict(model, calls, n)
                diff, rec, alone = measured[stat]
                cost = model.intra[next(iter(model.intra))]
                rows.append(f"{n:>5}  {name:<8} {len(calls):>5} {sum(b for _, b in calls):>10}  "
                            f"{timing + ' ' + stat:<11} "
                            f"{'unknown' if predicted is None else f'{predicted * 1e3:.3f}':>12}  "
                            f"{diff * 1e3:>12.3f}  {fmt(ratio(predicted, diff)):>5}  {rec * 1e3:>11.3f}  "
                            f"{fmt(ratio(predicted, rec)):>5}  {alone * 1e3:>8.3f}  {fmt(ratio(predicted, alone)):>5}")
                run[f"{timing} {stat}"] = {"predicted_s": predicted, "why": why, "step_diff_s": diff, "recorder_s": rec,
                             "alone_s": alone, "ratio_alone": ratio(predicted, alone),
                             "ratio_step_diff": ratio(predicted, diff), "ratio_recorder": ratio(predicted, rec),
                             "fit": {"latency_us": cost.latency_us, "busbw_gbps": cost.busbw_gbps,
                                     "source": cost.source}}
            doc["runs"].append(run)
    print(head)
    print("\n".join(rows))
    print("ratio = predicted / measured; the bar is 0.75-1.25. b2b: fitted to calls back to back (xccl bench's "
          f"default); idle: to calls each after a barrier and {args.gap_us:.0f} us of sleep (xccl bench --gap-us), "
          "as a step issues them; busy: the same gap spent computing (--gap-busy). median: fit to the bench's "
          "medians, measured as the median paired step difference and "
          "the recorder's median; q1: fit to the lower quartiles, measured as q1(step) - q1(step without "
          "communication) and the recorder's q1")
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
