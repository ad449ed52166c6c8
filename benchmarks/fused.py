"""Fused matmul + collective ops against the plain sequence, on CPU ranks over gloo.

For each op and shape, every rank times, in interleaved rounds so that all variants see the same machine noise:

* ``seq``: the unfused sequence a user writes: ``torch.mm``, then the blocking xccl collective (or the reverse);
* ``fused``: the fused op as called by default (the chunk count the cost model picks; where it picks 1 this is the
  plain sequence inside the op), or ``--chunks`` / each count of ``--sweep``;
* ``mm``: the matmul alone; ``comm``: the collective alone (same sizes, output allocated as in the op).

A round's time is the slowest rank's; each variant reports the minimum over rounds (the least disturbed run on a
shared machine) and the median, and the median CPU time of the rank process (all threads, gloo's included).
Derived per shape: ``speedup = seq / fused``; ``fused/seq`` against its limit ``max(mm, comm) / (mm + comm)``
(perfect overlap); the collective's CPU share (CPU time over wall time); and the share of the hideable time hidden,
``hidden = (mm + comm - fused) / min(mm, comm)`` (100% is perfect overlap; negative means slower than the sum).

Usage::

    python benchmarks/fused.py                      # 2 ranks, one thread each, the default shapes
    python benchmarks/fused.py --ops mm_reduce_scatter --shapes 4096x256x4096 --sweep 1,2,3,4,6,8
    python benchmarks/fused.py --markdown benchmarks/results/fused.md   # a table to paste into docs/performance.md

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

        def seq() -> None:
            z = torch.mm(a, b)
            xccl.reduce_scatter_tensor(z.new_empty((m // world, n)), z)
    elif op == "mm_all_reduce":
        y = torch.mm(a, b)

        def mm() -> None:
            torch.mm(a, b)

        def comm() -> None:
            xccl.all_reduce(y)

        def seq() -> None:
            xccl.all_reduce(torch.mm(a, b))
    else:
        g = a.new_empty((m, k))

        def mm() -> None:
            torch.mm(g, b)

        def comm() -> None:
            xccl.all_gather_into_tensor(a.new_empty((m, k)), a)

        def seq() -> None:
            h = a.new_empty((m, k))
            xccl.all_gather_into_tensor(h, a)
            torch.mm(h, b)

    return {"a": a, "b": b, "fused": fused, "mm": mm, "comm": comm, "seq": seq}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    import xccl
    from xccl.fused._cost import bounds, choose_chunks
    from xccl.plugin._capabilities import Collective

    xccl.init("cpu", fallback="emulate")

    def timed(fn: Any) -> tuple[float, float]:
        """Wall time of the slowest rank, and this process's CPU time (all its threads: gloo's too)."""
        xccl.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu = time.process_time() - c0
        dt = torch.tensor([time.perf_counter() - t0, cpu], dtype=torch.float64)
        xccl.all_reduce(dt, xccl.ReduceOp.MAX)
        return float(dt[0]), float(dt[1])

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
                variants: dict[str, Any] = {"seq": case["seq"], "mm": case["mm"], "comm": case["comm"]}
                counts = sorted({int(c) for c in args.sweep.split(",")}) if args.sweep else [args.chunks or auto]
                for c in counts:
                    # The default call (chunks=None) when timing the model's choice, so its cost is included.
                    chosen = None if not args.sweep and not args.chunks else c
                    variants[f"c{c}"] = lambda c=chosen, fused=fused, a=a, b=b: fused(a, b, chunks=c)
                times: dict[str, list[float]] = {v: [] for v in variants}
                cpu: dict[str, list[float]] = {v: [] for v in variants}
                for fn in variants.values():  # warm up: allocator, gloo buffers, matmul kernels
                    fn()
                # Sequential next to the fused variants, so each round times them back to back.
                names = ["seq", *(v for v in variants if _is_chunked(v)), "mm", "comm"]
                for r in range(args.rounds):
                    order = names if r % 2 == 0 else names[::-1]
                    for v in order:
                        wall, used = timed(variants[v])
                        times[v].append(wall)
                        cpu[v].append(used)
                row = {
                    "op": op, "shape": shape, "dtype": dname, "world_size": world, "auto_chunks": auto,
                    "chunks": [len(bounds(rows, c)) for c in counts],
                    "min_s": {v: min(ts) for v, ts in times.items()},
                    "median_s": {v: statistics.median(ts) for v, ts in times.items()},
                    "cpu_median_s": {v: statistics.median(ts) for v, ts in cpu.items()},
                    "rounds_s": times,
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
    fused_key = min((k for k in t if _is_chunked(k)), key=lambda k: t[k])
    fused = t[fused_key]
    comm_cpu = min(row["cpu_median_s"]["comm"], comm)
    rounds = row.get("rounds_s", {})
    # Sequential and fused run back to back in every round: the median of the per-round ratios cancels the
    # machine's drift better than a ratio of minimums.
    paired = [s / f for s, f in zip(rounds.get("seq", []), rounds.get(fused_key, []), strict=True)]
    return {
        "fused_variant": fused_key,
        "speedup": statistics.median(paired) if paired else seq / fused,
        "speedup_from": "paired rounds" if paired else "minimums",
        "speedup_of_minimums": seq / fused,
        "fused_over_seq": fused / seq,
        "limit": max(mm, comm) / (mm + comm),
        "comm_cpu_share": comm_cpu / comm,
        "hidden": (mm + comm - fused) / min(mm, comm),
    }


def _line(row: dict[str, Any]) -> str:
    t = row["min_s"]
    d = _derive(row)
    sweep = " ".join(f"{k}={v * 1e3:.0f}" for k, v in t.items() if _is_chunked(k))
    return (
        f"{row['op']:18s} {row['shape']:15s} {row['dtype']:8s} auto={row['auto_chunks']} "
        f"seq={t['seq'] * 1e3:7.1f}ms {sweep} mm={t['mm'] * 1e3:.1f} comm={t['comm'] * 1e3:.1f} "
        f"comm_cpu={d['comm_cpu_share'] * 100:.0f}% speedup={d['speedup']:.2f}x "
        f"fused/seq={d['fused_over_seq']:.2f} (limit {d['limit']:.2f}) hidden={d['hidden'] * 100:.0f}%"
    )


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results as a Markdown table with its legend."""
    out = [
        f"{meta['world_size']} CPU ranks over gloo (loopback), {meta['threads']} compute thread each, torch "
        f"{meta['torch']}, {meta['cpus']} cores, {meta['malloc']} malloc; {meta['rounds']} interleaved rounds, "
        "minimum over rounds of the slowest rank's time.",
        "",
        "| op | m x k x n | dtype | chunks | sequential ms | fused ms | speedup | mm ms | comm ms | comm CPU "
        "| fused/seq | limit | hidden |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t, d = row["min_s"], _derive(row)
        chunks = d["fused_variant"][1:]
        chunks = "1 (plain)" if chunks == "1" else chunks
        out.append(
            f"| {row['op']} | {row['shape'].replace('x', ' x ')} | {row['dtype']} | {chunks} "
            f"| {t['seq'] * 1e3:.1f} | {t[d['fused_variant']] * 1e3:.1f} | {d['speedup']:.2f}x "
            f"| {t['mm'] * 1e3:.1f} | {t['comm'] * 1e3:.1f} | {d['comm_cpu_share'] * 100:.0f}% "
            f"| {d['fused_over_seq']:.2f} | {d['limit']:.2f} | {d['hidden'] * 100:.0f}% |"
        )
    paired = all(_derive(row)["speedup_from"] == "paired rounds" for row in rows)
    out += [
        "",
        ("`speedup`: median over rounds of sequential / fused, each round timing both back to back (the ms "
         "columns are minimums over rounds). " if paired else "`speedup`: sequential / fused, from the minimums. ")
        + "`sequential`: `torch.mm` and the blocking xccl collective, one after the other (what the op replaces). "
        "`fused`: the op as called by default; `chunks` is the cost model's choice (`1 (plain)`: it runs the plain "
        "sequence inside the op). `comm CPU`: CPU time of the collective alone (all threads of a rank) over its "
        "wall time. `limit = max(mm, comm) / (mm + comm)`: the best `fused/seq` with perfect overlap. `hidden = "
        "(mm + comm - fused) / min(mm, comm)`: the share of the hideable time hidden (negative: slower than mm and "
        "comm measured apart).",
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
    p.add_argument("--quick", action="store_true", help="one small shape per op, 1 round: a smoke run (tests)")
    p.add_argument("--markdown", default="", help="also write the table to this file")
    p.add_argument(
        "--system-malloc", action="store_true",
        help="leave glibc's malloc as it is (default: keep freed memory, as accelerators' caching allocators do)",
    )
    p.add_argument(
        "--merge", nargs="+", metavar="JSON",
        help="run nothing: merge these result files (e.g. one per op, each run when the machine was quiet)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.rounds, args.dtypes = ["64x32x64"], 1, ["float32"]
    if args.merge:
        runs = [json.loads(Path(f).read_text()) for f in args.merge]
        return _write(args, [row for run in runs for row in run["results"]], runs[0]["meta"])
    if not args.system_malloc:
        # glibc returns every buffer of 32 MB or more to the kernel on free, so each new one page-faults afresh:
        # on this VM 60-80 ms per 64 MB, more than the matmul. Smaller chunks stay in the heap, which would credit
        # the pipelined version with a gain that has nothing to do with overlap. Keep freed memory instead, like
        # the caching allocators of CUDA and Ascend. glibc reads these at process start; the spawned ranks do.
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 40))
        os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 40))
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, args.world_size, port, args, queue)) for r in range(args.world_size)]
    for proc in procs:
        proc.start()
    # Rank 0 puts its results, or dies without: poll so a failed rank does not leave us waiting forever.
    rows = None
    while rows is None and all(proc.exitcode in (None, 0) for proc in procs):
        if not queue.empty():
            rows = queue.get()
        else:
            time.sleep(0.2)
    for proc in procs:
        proc.join()
    if rows is None or any(proc.exitcode for proc in procs):
        print("a rank failed", file=sys.stderr)
        return 1
    meta = {
        "world_size": args.world_size, "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
        "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(), "malloc": "system" if args.system_malloc else "caching",
    }
    return _write(args, rows, meta)


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], meta: dict[str, Any]) -> int:
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
