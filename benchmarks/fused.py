"""Fused matmul + collective ops against the plain sequence, on CPU ranks over gloo.

For each op and shape, every rank times, in interleaved rounds so that all variants see the same machine noise:

* ``seq``: the plain sequence (``chunks=1``: one matmul, then one blocking collective);
* ``fused``: the portable pipelined version with the chunk count the cost model picks (or ``--chunks``);
* ``mm``: the matmul alone; ``comm``: the collective alone (same sizes, output allocated as in the op).

A round's time is the slowest rank's; each variant reports the minimum over rounds (the least disturbed run on a
shared machine) and the median. Derived per shape: ``speedup = seq / fused``; ``fused/seq`` against its limit
``max(mm, comm) / (mm + comm)`` (perfect overlap); and the share of the hideable time actually hidden,
``hidden = (mm + comm - fused) / min(mm, comm)`` (100% is perfect overlap; negative means slower than the sum).

Usage::

    python benchmarks/fused.py                      # 2 ranks, one thread each, the default shapes
    python benchmarks/fused.py --ops mm_reduce_scatter --shapes 4096x256x4096 --sweep 1,2,3,4,6,8
    python benchmarks/fused.py --markdown docs/performance_fused.md

Writes ``benchmarks/results/fused.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

OPS = ("mm_reduce_scatter", "all_gather_mm", "mm_all_reduce")
#: (m, k, n) of the full product on one rank: mm_reduce_scatter / mm_all_reduce multiply (m, k) @ (k, n);
#: all_gather_mm gathers m rows in all (m / W per rank) and multiplies them by (k, n). From communication-heavy
#: to compute-heavy; all_gather_mm moves k columns where the others move n, so its communication-heavy shape is the
#: transposed one.
SHAPES = {
    "mm_reduce_scatter": ("4096x256x4096", "4096x512x4096", "4096x1024x4096", "4096x4096x4096"),
    "mm_all_reduce": ("4096x256x4096", "4096x512x4096", "4096x1024x4096", "4096x4096x4096"),
    "all_gather_mm": ("4096x4096x256", "4096x4096x512", "4096x4096x1024", "4096x4096x4096"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _case(op: str, shape: str, dtype: torch.dtype, world: int, rank: int) -> dict[str, Any]:
    """Tensors and the four callables of one case."""
    import xccl

    m, k, n = (int(x) for x in shape.split("x"))
    gen = torch.Generator().manual_seed(rank)
    if op == "all_gather_mm":
        a = torch.randn(m // world, k, generator=gen).to(dtype)
    else:
        a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    fused = getattr(xccl, op)

    if op == "mm_reduce_scatter":
        y = torch.mm(a, b)

        def mm() -> None:
            torch.mm(a, b)

        def comm() -> None:
            xccl.reduce_scatter_tensor(y.new_empty((m // world, n)), y)
    elif op == "mm_all_reduce":
        y = torch.mm(a, b)

        def mm() -> None:
            torch.mm(a, b)

        def comm() -> None:
            xccl.all_reduce(y)
    else:
        g = a.new_empty((m, k))

        def mm() -> None:
            torch.mm(g, b)

        def comm() -> None:
            xccl.all_gather_into_tensor(a.new_empty((m, k)), a)

    return {"a": a, "b": b, "fused": fused, "mm": mm, "comm": comm}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    import xccl
    from xccl._capabilities import Collective
    from xccl._fused import _bounds, choose_chunks

    xccl.init("cpu", fallback="emulate")

    def timed(fn: Any) -> float:
        xccl.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        xccl.all_reduce(dt, xccl.ReduceOp.MAX)  # the slowest rank's time is the op's time
        return float(dt.item())

    results = []
    for op in args.ops:
        for shape in args.shapes or SHAPES[op]:
            for dname in args.dtypes:
                dtype = DTYPES[dname]
                case = _case(op, shape, dtype, world, rank)
                a, b, fused = case["a"], case["b"], case["fused"]
                m, k, n = (int(x) for x in shape.split("x"))
                rows = {"mm_reduce_scatter": m // world, "all_gather_mm": m // world, "mm_all_reduce": m}[op]
                auto = choose_chunks(Collective(op), "cpu", dtype, rows, k, n, world)
                variants: dict[str, Any] = {
                    "seq": lambda fused=fused, a=a, b=b: fused(a, b, chunks=1),
                    "mm": case["mm"],
                    "comm": case["comm"],
                }
                counts = sorted({int(c) for c in args.sweep.split(",")}) if args.sweep else [args.chunks or auto]
                for c in counts:
                    if c != 1:
                        variants[f"c{c}"] = lambda c=c, fused=fused, a=a, b=b: fused(a, b, chunks=c)
                times: dict[str, list[float]] = {v: [] for v in variants}
                for fn in variants.values():  # warm up: allocator, gloo buffers, matmul kernels
                    fn()
                names = list(variants)
                for r in range(args.rounds):
                    order = names if r % 2 == 0 else names[::-1]
                    for v in order:
                        times[v].append(timed(variants[v]))
                row = {
                    "op": op, "shape": shape, "dtype": dname, "world_size": world, "auto_chunks": auto,
                    "chunks": [len(_bounds(rows, c)) for c in counts],
                    "min_s": {v: min(ts) for v, ts in times.items()},
                    "median_s": {v: statistics.median(ts) for v, ts in times.items()},
                }
                results.append(row)
                if rank == 0:
                    print(_line(row), flush=True)
    if rank == 0:
        queue.put(results)
    xccl.shutdown()
    _ = dist


def _is_chunked(variant: str) -> bool:
    return variant[0] == "c" and variant[1:].isdigit()


def _derive(row: dict[str, Any]) -> dict[str, Any]:
    t = row["min_s"]
    mm, comm, seq = t["mm"], t["comm"], t["seq"]
    fused_key = min((k for k in t if _is_chunked(k)), key=lambda k: t[k], default="seq")
    fused = t[fused_key]
    return {
        "fused_variant": fused_key,
        "speedup": seq / fused,
        "fused_over_seq": fused / seq,
        "limit": max(mm, comm) / (mm + comm),
        "hidden": (mm + comm - fused) / min(mm, comm),
    }


def _line(row: dict[str, Any]) -> str:
    t = row["min_s"]
    d = _derive(row)
    sweep = " ".join(f"{k}={v * 1e3:.0f}" for k, v in t.items() if _is_chunked(k))
    return (
        f"{row['op']:18s} {row['shape']:15s} {row['dtype']:8s} auto={row['auto_chunks']} "
        f"seq={t['seq'] * 1e3:7.1f}ms {sweep} mm={t['mm'] * 1e3:.1f} comm={t['comm'] * 1e3:.1f} "
        f"speedup={d['speedup']:.2f}x fused/seq={d['fused_over_seq']:.2f} (limit {d['limit']:.2f}) "
        f"hidden={d['hidden'] * 100:.0f}%"
    )


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        "# Fused matmul + collective: portable pipelined version vs the plain sequence",
        "",
        f"{meta['world_size']} CPU ranks over gloo (loopback), {meta['threads']} compute thread each, torch "
        f"{meta['torch']}, {meta['cpus']} cores shared with other work; `python benchmarks/fused.py` "
        f"({meta['rounds']} interleaved rounds, minimum over rounds, slowest rank per round).",
        "",
        "| op | m x k x n | dtype | chunks | sequential ms | fused ms | speedup | mm ms | comm ms | fused/seq "
        "| limit | hidden |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t, d = row["min_s"], _derive(row)
        chunks = d["fused_variant"][1:] if d["fused_variant"] != "seq" else "1"
        out.append(
            f"| {row['op']} | {row['shape'].replace('x', ' x ')} | {row['dtype']} | {chunks} "
            f"| {t['seq'] * 1e3:.1f} | {t[d['fused_variant']] * 1e3:.1f} | {d['speedup']:.2f}x "
            f"| {t['mm'] * 1e3:.1f} | {t['comm'] * 1e3:.1f} | {d['fused_over_seq']:.2f} | {d['limit']:.2f} "
            f"| {d['hidden'] * 100:.0f}% |"
        )
    out += [
        "",
        "`fused/seq` cannot go below `limit = max(mm, comm) / (mm + comm)` (everything hidden); `hidden = (mm + comm"
        " - fused) / min(mm, comm)` is the share of the hideable time that was hidden. all_gather_mm's shapes are "
        "m (rows after the gather) x k x n; it moves k columns where the others move n.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--shapes", nargs="+", help="m x k x n, e.g. 4096x256x4096 (default: per-op list)")
    p.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunks", type=int, default=0, help="force this chunk count for 'fused' (0: cost model)")
    p.add_argument("--sweep", default="", help="comma list of chunk counts to time instead of the model's choice")
    p.add_argument("--json", default="benchmarks/results/fused.json")
    p.add_argument("--markdown", default="", help="also write the table to this file")
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, args.world_size, port, args, queue)) for r in range(args.world_size)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        print("a rank failed", file=sys.stderr)
        return 1
    rows = queue.get()
    meta = {
        "world_size": args.world_size, "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
        "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(),
    }
    for row in rows:
        row.update(_derive(row))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(_markdown(rows, meta))
    print(f"wrote {args.json}" + (f" and {args.markdown}" if args.markdown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
