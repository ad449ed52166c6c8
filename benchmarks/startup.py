"""What ``xccl.init`` + a barrier costs against ``dist.init_process_group("gloo")`` + a barrier, and where it goes.

For each plugin (cpu, simulated Sophgo, simulated Ascend) and world size, ``size`` rank processes are forked from
a server that has imported torch and xccl (so the figures start *after* ``import``, as the issue measured), all
released at once; each rank times, from its release to the end of its first barrier, either
``xccl.init(...)`` + ``xccl.barrier()`` or ``dist.init_process_group("gloo")`` + ``dist.barrier()``. A launch's
time is its slowest rank's (the job can start when the last rank can); CPU is a rank's own CPU time over the same
span (all its threads, mean over ranks), the figure a busy shared machine distorts least; the table gives the
median over ``--repeat`` launches of each, the two kinds interleaved so a busy machine weighs on both alike, and ``extra`` =
xccl's median minus torch's (goal: at most 0.1 s at every size).

The breakdown is the mean over ranks and launches of ``xccl.collectives._state.PROCESS.phases`` (what ``xccl.init``
records as it goes) plus the lazy imports ``xccl.init`` and ``xccl.barrier`` bring and the first barrier (its
planning included). ``process group`` is what ``init_process_group`` adds around the vendor's own group.

Bytecode: the rank processes write and read compiled bytecode under ``--pycache`` (``PYTHONPYCACHEPREFIX``) and
one unmeasured launch warms it, because a user's interpreter has its ``.pyc`` files; with
``PYTHONDONTWRITEBYTECODE=1`` every lazy import recompiles its source, which once dominated these figures.

``--against DIR`` compares two versions of xccl in one run: DIR is another checkout (e.g. ``git archive <commit> |
tar -x -C DIR``), imported through ``PYTHONPATH``; each repeat launches the whole grid once with it ("before") and
once with this checkout ("after"), alternately, and the table puts the two side by side with torch's figure (the
median over both).

Usage::

    python benchmarks/startup.py                          # 2, 8, 32 ranks; cpu, sophgo, ascend; 3 launches each
    python benchmarks/startup.py --sizes 2 --repeat 5
    python benchmarks/startup.py --against /tmp/xccl-before   # before/after, side by side
    python benchmarks/startup.py --quick                  # 2 ranks, cpu and simulated Ascend, 1 launch (tests)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"

if __name__ == "__mp_main__":
    # The forkserver (preload "__main__" first) and so every rank: cache bytecode (under PYTHONPYCACHEPREFIX) as a
    # user's interpreter does, even when this script runs with PYTHONDONTWRITEBYTECODE, which multiprocessing
    # passes on as -B.
    sys.dont_write_bytecode = False
VENDORS = ("cpu", "sophgo", "ascend")
GOAL = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, size: int, port: int, vendor: str, kind: str, go: Any, out: Any) -> None:
    # At most 8 ranks per (simulated) node, as on the vendors' 8-device boards: 32 ranks are 4 nodes of 8.
    per_node = min(size, 8)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
                      OMP_NUM_THREADS="1")
    for var in ("XCCL_SIMULATE", "XCCL_VENDOR", "XCCL_CHECK", "TORCHELASTIC_RUN_ID"):
        os.environ.pop(var, None)
    import torch
    import torch.distributed as dist

    import xccl

    torch.set_num_threads(1)
    expect = os.environ.get("XCCL_STARTUP_TREE")
    if expect and not str(Path(xccl.__file__).resolve()).startswith(expect):
        out.put((rank, False, f"measuring the xccl at {xccl.__file__}, not the one of {expect}", {}))
        return
    go.wait(120)
    t0, c0 = time.perf_counter(), time.process_time()
    phases: dict[str, float] = {}
    try:
        if kind == "torch":
            dist.init_process_group("gloo")
            dist.barrier()
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
        else:
            init = xccl.init  # the lazy import of the runtime
            t1 = time.perf_counter()
            if vendor == "cpu":
                init("cpu", timeout=60)
            else:
                init(vendor, simulate=True, timeout=60)
            t2 = time.perf_counter()
            barrier = xccl.barrier  # the lazy import of the public collectives
            t3 = time.perf_counter()
            barrier()
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            from xccl.collectives._state import PROCESS

            recorded: dict[str, float] = getattr(PROCESS, "phases", {})  # an xccl from before the phases: none
            phases = {"import runtime": t1 - t0, **recorded, "import collectives API": t3 - t2,
                      "first barrier": total - (t3 - t0)}
            inner = phases.get("native group", 0.0) + phases.get("host-side gloo group", 0.0)
            if "process group" in phases:
                phases["process group"] -= inner
            phases["other init"] = (t2 - t1) - sum(recorded.values()) + inner
        phases["cpu"] = cpu
        out.put((rank, True, total, phases))
    except Exception as exc:  # reported to the parent
        out.put((rank, False, f"{type(exc).__name__}: {exc}", {}))
    finally:
        if kind == "torch" and dist.is_initialized():
            dist.destroy_process_group()
        elif kind == "xccl":
            xccl.shutdown()


def launch(ctx: Any, size: int, vendor: str, kind: str) -> tuple[float, dict[str, float]]:
    """One launch of ``size`` ranks: the slowest rank's seconds, and the phases' mean over ranks."""
    out, go = ctx.Queue(), ctx.Event()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, size, port, vendor, kind, go, out), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    # Release the ranks together once every one has started (its imports are the server's, so this is quick).
    time.sleep(0.5 + 0.05 * size)
    go.set()
    got = []
    try:
        for _ in procs:
            got.append(out.get(timeout=180))
    except queue.Empty:
        raise RuntimeError(f"{kind} {vendor} x{size}: only {len(got)} ranks reported in 180 s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    bad = [g for g in got if not g[1]]
    if bad:
        raise RuntimeError(f"{kind} {vendor} x{size}: rank {bad[0][0]}: {bad[0][2]}")
    phases: dict[str, float] = {}
    for _, _, _, ph in got:
        for k, v in ph.items():
            phases[k] = phases.get(k, 0.0) + v / size
    return max(g[2] for g in got), phases


def run(sizes: list[int], vendors: list[str], repeat: int, pycache: Path) -> dict[str, Any]:
    """Every (vendor, size): ``repeat`` launches of torch and of xccl, interleaved; the medians and phases."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(pycache)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "xccl"])
    for vendor in vendors:  # warm the bytecode cache and the forkserver; not measured
        launch(ctx, 2, vendor, "xccl")
    rows = []
    for size in sizes:
        for vendor in vendors:
            times: dict[str, list[float]] = {"torch": [], "xccl": [], "torch_cpu": [], "xccl_cpu": []}
            phases: dict[str, float] = {}
            for _ in range(repeat):
                for kind in ("torch", "xccl"):
                    t, ph = launch(ctx, size, vendor, kind)
                    times[kind].append(t)
                    times[f"{kind}_cpu"].append(ph.pop("cpu"))
                    if kind == "xccl":
                        for k, v in ph.items():
                            phases[k] = phases.get(k, 0.0) + v / repeat
            rows.append({"vendor": vendor, "size": size, "runs": times, "phases": phases})
            print(f"  {vendor} x{size}: torch {statistics.median(times['torch']):.3f} s, xccl "
                  f"{statistics.median(times['xccl']):.3f} s", file=sys.stderr, flush=True)
    return {"rows": rows}


def table(doc: dict[str, Any]) -> str:
    """The results as a Markdown table, then the breakdown of xccl's time per phase (ms)."""
    labels = doc["labels"]
    sfx = [f" {lb}" if lb else "" for lb in labels]
    head = " | ".join(f"xccl{x} (s) | extra{x} (s)" for x in sfx)
    cpu_head = " | ".join(f"xccl{x} CPU (s)" for x in sfx)
    lines = [f"| plugin | ranks | torch (s) | {head} | torch CPU (s) | {cpu_head} |",
             "|---|---:|---:|" + "---:|---:|" * len(labels) + "---:|" + "---:|" * len(labels)]
    for r in doc["rows"]:
        cells = " | ".join(f"{r['xccl_s'][lb]:.3f} | {r['xccl_s'][lb] - r['torch_s']:+.3f}" for lb in labels)
        cpu = " | ".join(f"{r['xccl_cpu_s'][lb]:.3f}" for lb in labels)
        lines.append(f"| {r['vendor']} | {r['size']} | {r['torch_s']:.3f} | {cells} | {r['torch_cpu_s']:.3f} | {cpu} |")
    lb = labels[-1]
    names: list[str] = []
    for r in doc["rows"]:
        names += [k for k in r["phases"][lb] if k not in names]
    heads = [f"{r['vendor']} x{r['size']}" for r in doc["rows"]]
    lines += ["", f"xccl{' ' + lb if lb else ''}: time by phase (ms, mean over ranks and launches)", "",
              "| phase | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{1e3 * r['phases'][lb].get(n, 0.0):.1f}" for r in doc["rows"]) + " |")
    return "\n".join(lines)


def merge(docs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Launch results by label ("" alone, or "before"/"after") -> the medians the table shows."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for label, runs in docs.items():
        for doc in runs:
            for r in doc["rows"]:
                c = cells.setdefault((r["vendor"], r["size"]),
                                     {"torch": [], "xccl": {}, "torch_cpu": [], "xccl_cpu": {}, "phases": {}})
                c["torch"] += r["runs"]["torch"]
                c["xccl"].setdefault(label, []).extend(r["runs"]["xccl"])
                c["torch_cpu"] += r["runs"]["torch_cpu"]
                c["xccl_cpu"].setdefault(label, []).extend(r["runs"]["xccl_cpu"])
                ph = c["phases"].setdefault(label, {})
                for k, v in r["phases"].items():
                    ph[k] = ph.get(k, 0.0) + v / len(runs)
    rows = []
    for (vendor, size), c in cells.items():
        torch_s = statistics.median(c["torch"])
        xccl_s = {lb: statistics.median(v) for lb, v in c["xccl"].items()}
        rows.append({"vendor": vendor, "size": size, "torch_s": torch_s, "xccl_s": xccl_s,
                     "torch_cpu_s": statistics.median(c["torch_cpu"]),
                     "xccl_cpu_s": {lb: statistics.median(v) for lb, v in c["xccl_cpu"].items()},
                     "extra_s": {lb: v - torch_s for lb, v in xccl_s.items()},
                     "goal_met": {lb: v - torch_s <= GOAL for lb, v in xccl_s.items()},
                     "runs": {"torch": c["torch"], "xccl": c["xccl"]}, "phases": c["phases"]})
    return {"goal_extra_s": GOAL, "labels": list(docs), "rows": rows, "load_average": os.getloadavg()}


def _child(args: argparse.Namespace, src: Path, out: Path, pycache: Path) -> dict[str, Any]:
    """One pass over the grid in a fresh interpreter that imports xccl from checkout ``src``."""
    paths = [src, src / "plugins" / "sophgo", src / "plugins" / "ascend"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "XCCL_STARTUP_TREE": str(src)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--sizes", *map(str, args.sizes), "--vendors",
            *args.vendors, "--repeat", "1", "--pycache", str(pycache), "--raw", str(out)]
    import subprocess

    # From inside the checkout: multiprocessing's server process puts its working directory first on sys.path.
    subprocess.run(argv, env=env, cwd=src, check=True, timeout=3600)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 32], help="world sizes (default 2 8 32)")
    p.add_argument("--vendors", nargs="+", default=list(VENDORS), choices=VENDORS)
    p.add_argument("--repeat", type=int, default=3, help="launches of each kind per cell (default 3)")
    p.add_argument("--quick", action="store_true", help="2 ranks, cpu and simulated Ascend, 1 launch (for tests)")
    p.add_argument("--against", type=Path, metavar="DIR", help="another xccl checkout to compare with (before)")
    p.add_argument("--pycache", type=Path, default=Path(tempfile.gettempdir()) / "xccl-startup-pycache",
                   help="where the ranks keep compiled bytecode (PYTHONPYCACHEPREFIX)")
    p.add_argument("--json", type=Path, default=RESULTS)
    p.add_argument("--raw", type=Path, help=argparse.SUPPRESS)  # a child of --against: one pass, unmerged
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.vendors, args.repeat = [2], ["cpu", "ascend"], 1
    if args.raw is not None:
        args.raw.write_text(json.dumps(run(args.sizes, args.vendors, args.repeat, args.pycache)))
        return 0
    if args.against is not None:
        here = Path(__file__).resolve().parents[1]
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeat):
                for label, src in (("before", args.against.resolve()), ("after", here)):
                    print(f"pass {i + 1}/{args.repeat}: {label} ({src})", file=sys.stderr, flush=True)
                    runs[label].append(_child(args, src, Path(tmp) / f"{label}{i}.json", args.pycache / label))
        doc = merge(runs)
    else:
        doc = merge({"": [run(args.sizes, args.vendors, args.repeat, args.pycache)]})
    doc["argv"] = sys.argv[1:] if argv is None else argv
    print(table(doc))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
