"""``xccl bench``: an nccl-tests-style sweep of one or more collectives through xccl.

:func:`launch` starts ``nproc`` local ranks (``torch.multiprocessing`` spawn, rendezvous over ``env://`` on
127.0.0.1 with a free port), each calls ``xccl.init`` with the chosen plugin and runs the sweep; rank 0 prints
the table as it goes and hands the results back to the launching process as JSON.

What the columns mean (sizes and counts as nccl-tests counts them, the slowest rank's median time, nccl-tests'
bus-bandwidth factors) and what ``compare_raw`` and ``control`` add is in docs/cli.md (``xccl bench``); how the
rounds are ordered, split into passes and sized by time is in :mod:`._bench_measure`.

The pieces: :mod:`._bench_config` (ops, factors, sizes, :class:`BenchConfig`), :mod:`._bench_ops` (the buffers
and calls per op), :mod:`._bench_measure` (timing and statistics), :mod:`._bench_report` (table, summary, plot).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict
from typing import Any

import torch

from ..ops._torch import TORCH
from ._bench_config import COLLECTIVE, OPS, BenchConfig, BenchError, busbw_factor, parse_size, sweep_sizes
from ._bench_measure import Progress, run_op
from ._bench_report import plot, summarize

#: What the CLI, the tests and ``benchmarks/`` use; the rest is in the modules named above.
__all__ = ["OPS", "BenchConfig", "BenchError", "busbw_factor", "launch", "parse_size", "plot", "summarize",
           "sweep_sizes"]

#: An older name, kept for the tests that use it.
_COLLECTIVE = COLLECTIVE


# ---------------------------------------------------------------------------------------------------- ranks


def _rounds(cfg: BenchConfig) -> str:
    """How many rounds per size and how, in words, for the header."""
    parts = [f"{cfg.time_per_size:g} s of rounds per size (at most {cfg.iters})" if cfg.time_per_size > 0
             else f"{cfg.iters} rounds per size"]
    if cfg.passes > 1:
        parts.append(f"in {cfg.passes} passes over the sizes")
    parts.append(f"{cfg.batch} call(s) per sample after {cfg.warmup} warm-up")
    if cfg.control:
        parts.append("raw twice per round (A/A control)")
    return ", ".join(parts)


def _rank_main(local_rank: int, cfg: BenchConfig, port: int, result_path: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(local_rank),
            "WORLD_SIZE": str(cfg.nproc),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(cfg.nproc),
        }
    )
    import faulthandler

    faulthandler.enable()  # a rank that aborts in C++ says where
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // cfg.nproc))
    import xccl
    from xccl.runtime import vendor_group

    try:
        world = xccl.init(cfg.plugin, simulate=cfg.simulate or None, fallback="emulate", timeout=cfg.timeout)
    except xccl.XcclError as exc:
        print(f"xccl bench: rank {local_rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(3)
    try:
        rank, n = world.rank, world.world_size
        out = sys.stdout if rank == 0 and cfg.table else None
        progress = Progress(sys.stderr if rank == 0 and cfg.progress else None)
        if out is not None:
            sim = " (simulated on CPU)" if world.simulate else ""
            out.write(
                f"# xccl bench: plugin {world.plugin}{sim}, backend {world.backend}, {n} ranks, "
                f"{cfg.dtype}; {_rounds(cfg)}\n# time: median of the slowest rank's per-call time; bandwidths in "
                "GB/s\n"
            )
        # Raw calls run on the vendor's own group: the world's is xccl's, which would dispatch them too.
        raw_group = vendor_group() if cfg.compare_raw else None
        results = [run_op(op, cfg, n, rank, world.device, out, progress, raw_group) for op in cfg.ops]
        progress.clear()
        if rank == 0:
            doc = {
                "xccl_bench": 1,
                "plugin": world.plugin,
                "backend": world.backend,
                "simulate": world.simulate,
                "world_size": n,
                "device": str(world.device.type),
                "torch": TORCH.version,
                "xccl": xccl.__version__,
                "config": asdict(cfg),
                "timing": "median over rounds of the slowest rank's time per call; ratio: median over rounds of "
                "raw's time over xccl's (A/A control: raw's over raw's) with a distribution-free 95% CI",
                "results": results,
            }
            with open(result_path, "w") as f:
                json.dump(doc, f)
        xccl.barrier()
    finally:
        xccl.shutdown()
    # Seen here under load (torch 2.13, gloo): a rank aborting at interpreter exit, after its Python code had
    # finished ("terminate called without an active exception", no Python frame). The results are written and
    # the process group is destroyed, so leave without running C++ static destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(cfg: BenchConfig) -> dict[str, Any]:
    """Start ``cfg.nproc`` local ranks, run the sweep and return rank 0's results.

    Raises:
        BenchError: the configuration cannot run, or a rank failed (its error was printed on stderr).
    """
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    from ..testing._pool import free_port

    cfg.check()
    fd, path = tempfile.mkstemp(prefix="xccl-bench-", suffix=".json")
    os.close(fd)
    try:
        try:
            start_processes(  # type: ignore[no-untyped-call]
                _rank_main, args=(cfg, free_port(), path), nprocs=cfg.nproc, start_method="spawn"
            )
        except ProcessRaisedException as exc:
            raise BenchError(f"a rank failed:\n{exc}") from None
        except ProcessExitedException as exc:
            raise BenchError(
                f"rank {exc.error_index} exited with code {exc.exit_code} (see its message above)"
            ) from None
        with open(path) as f:
            text = f.read()
        if not text:
            raise BenchError("rank 0 wrote no results")
        return json.loads(text)  # type: ignore[no-any-return]
    finally:
        os.unlink(path)
