"""Wall time of ``xccl preflight`` on this machine: FSDP2 on simulated Sophgo at 64 ranks (a fake world: ranks 0
and 63 played, each a process) beside the same script at 4 ranks, real (4 processes) and fake (2 processes).

Each case runs the command as a user types it (``python -m xccl preflight ... -- python examples/fsdp2_train.py``,
the script's default 2 steps), ``--repeat`` times, the cases interleaved so that a busy machine weighs on all alike;
the table gives the median and the range. The issue's goal: 64 ranks in under 2 minutes on a 2-core machine.

Usage::

    python benchmarks/preflight.py                 # 64 fake, 4 real, 4 fake; 3 repeats -> results/preflight.json
    python benchmarks/preflight.py --quick         # 16 fake only, 1 repeat (tests)
    python benchmarks/preflight.py --tp-fsdp2      # DTensor TP + FSDP2 on simulated Ascend, 16 ranks on 2 nodes
                                                   # (fake), with its compiled region -> results/preflight_tp.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "preflight.json"

#: (label, world, nodes, mode): Sophgo machines hold 8 TPUs, so 64 ranks span 8 nodes.
CASES = [("sophgo 64, fake (ranks 0, 63)", 64, 8, "fake"), ("sophgo 4, real (4 processes)", 4, 1, "real"),
         ("sophgo 4, fake (ranks 0, 3)", 4, 1, "fake")]
QUICK = [("sophgo 16, fake (ranks 0, 15)", 16, 2, "fake")]
#: The issue's second example: examples/tp_fsdp2_train.py (TP inside a node, FSDP2 across, a compiled region) on
#: Ascend A2 at 16 ranks on 2 nodes, one step.
TP_FSDP2 = [("ascend TP+FSDP2 16, fake (0, 15)", 16, 2, "fake")]
SCRIPTS = {"sophgo": ["examples/fsdp2_train.py"], "ascend": ["examples/tp_fsdp2_train.py", "--steps", "1"]}


def once(world: int, nodes: int, mode: str, vendor: str = "sophgo") -> float:
    """Seconds one preflight takes, start to exit, as a user runs it."""
    cmd = [sys.executable, "-m", "xccl", "preflight", "--vendor", vendor, "--world", str(world), "--nodes",
           str(nodes), "--mode", mode, "--", "python", *SCRIPTS[vendor]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCCL_", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    if proc.returncode != 0 or f"verdict: runs on {vendor}" not in proc.stdout:
        raise SystemExit(f"preflight failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 ranks fake only, 1 repeat")
    parser.add_argument("--tp-fsdp2", action="store_true", help="TP + FSDP2 on Ascend, 16 ranks fake, only")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cases, repeat = (QUICK, 1) if args.quick else (TP_FSDP2, args.repeat) if args.tp_fsdp2 else (CASES, args.repeat)
    vendor = "ascend" if args.tp_fsdp2 else "sophgo"
    args.json = args.json or str(RESULTS.with_name("preflight_tp.json") if args.tp_fsdp2 else RESULTS)
    times: dict[str, list[float]] = {label: [] for label, *_ in cases}
    for _ in range(repeat):
        for label, world, nodes, mode in cases:
            times[label].append(once(world, nodes, mode, vendor))
    rows: list[dict[str, Any]] = [{"case": label, "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                                   "runs": len(t)} for label, t in times.items()]
    print(f"xccl preflight wall time, {repeat} run(s) each, {os.cpu_count()} CPUs")
    print(f"{'case':32} {'median s':>9} {'min s':>7} {'max s':>7}")
    for r in rows:
        print(f"{r['case']:32} {r['median_s']:9.1f} {r['min_s']:7.1f} {r['max_s']:7.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
