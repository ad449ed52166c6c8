"""Restart-to-first-step under torchrun: what a lost host costs a job that restarts and resumes from its checkpoint.

Two namespaced hosts x 2 ranks (tests/netns: network namespaces joined by a bridge; needs root) run
tests/elastic_train.py (a small DDP model on xccl's world, a DCP checkpoint every 3 steps) under ``torchrun
--nnodes 1:2 --max-restarts 1``; once the job is past step 10, host 1 is killed (SIGKILL of everything in its
namespace, its torchrun agent included). Host 0's ranks see xccl's PeerFailure, exit, and their agent restarts them on
the world that is left (2 ranks), where they resume from the last complete checkpoint. Each run's timeline, in
seconds after the kill:

* ``typed error``: the first of host 0's ranks to record the error (xccl's PeerFailure);
* ``agent saw the failure``: host 0's agent logs the worker's exit (its monitor interval is 0.2 s here);
* ``rendezvous done``: the agent's new round, alone (the lost node's keep-alive must expire, then the last call);
* ``worker process up``: the restarted ranks' processes begin (the later rank's);
* ``imports done``, ``xccl.init done``, ``DDP wrapped``, ``checkpoint loaded``;
* ``first step``: the first step on the shrunk world completed (the later rank's): **restart-to-first-step**.

Also per run: ``xccl.init`` of the first start and of the restart (the slower rank's), the world check's share of it
(``xccl.collectives._state.PROCESS.phases``: mostly waiting for the other ranks to arrive), and the steps redone
(the steps completed after the last checkpoint, lost with the host). The table gives the median, min and max over
``--repeat`` runs.

``--rdzv torch`` uses torch's rendezvous defaults (last call 30 s, a dead node dropped after 3 x 5 s of missed
keep-alives) instead of ``tests/elastic_train.TUNED_RDZV`` (5 s; 3 x 2 s).

Without root or network namespaces the script prints why and exits 0 (``--quick`` in tests/test_benchmarks.py
then checks only that it says so).

Usage::

    sudo python benchmarks/restart.py                  # 3 runs, cpu, tuned rendezvous
    sudo python benchmarks/restart.py --repeat 5 --vendor sophgo
    sudo python benchmarks/restart.py --rdzv torch     # torch's rendezvous defaults
    python benchmarks/restart.py --quick               # 1 run (a smoke run: tests)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the netns harness and the training script live with the tests

RESULTS = ROOT / "benchmarks" / "results" / "restart.json"
SIMULATE = {"cpu": {}, "sophgo": {"XCCL_SIMULATE": "sophgo"}, "ascend": {"XCCL_SIMULATE": "ascend"}}
KILL_AFTER = 10
ROWS = ("typed error", "agent saw the failure", "rendezvous done", "worker process up", "imports done",
        "xccl.init done", "DDP wrapped", "checkpoint loaded", "first step")
#: torchrun's log line prefix: I1128 12:28:37.313000 <pid> <file>:<line>] <message>
_LOG = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}\.\d+) \d+ \S+\] (.*)$")


def _log_times(log: Path, year: int) -> list[tuple[float, str]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _LOG.match(line)
        if m:
            mo, d, h, mi, s, msg = m.groups()
            t = time.mktime((year, int(mo), int(d), int(h), int(mi), 0, 0, 0, -1)) + float(s)
            out.append((t, msg))
    return out


def _after(events: list[tuple[float, str]], since: float, text: str) -> float:
    return next((t for t, msg in events if t >= since and text in msg), float("nan"))


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def one_run(workdir: Path, vendor: str, rdzv: str) -> dict[str, Any]:
    import elastic_train as et
    from netns import Hosts

    with Hosts(2, workdir=workdir / "hosts") as hosts:
        out, ckpt = workdir / "job", workdir / "ckpt"
        ckpt.mkdir(parents=True)
        # LOGLEVEL=INFO: torchrun's agent logs when it saw the failure and when its new round completed.
        job = et.launch(hosts, out, [str(ckpt)], env={**SIMULATE[vendor], "LOGLEVEL": "INFO"},
                        rdzv=et.TUNED_RDZV if rdzv == "tuned" else None)
        deadline = time.monotonic() + 240
        progress: dict[str, Any] = {}
        while time.monotonic() < deadline and progress.get("step", -1) < KILL_AFTER:
            if any(p.poll() is not None for _, p in job.procs):
                raise RuntimeError(f"the job ended before step {KILL_AFTER}:\n{job.log()}")
            with contextlib.suppress(OSError, ValueError):
                progress = _json(out / "progress-a0")
            time.sleep(0.02)
        if progress.get("step", -1) < KILL_AFTER:
            raise RuntimeError(f"the job did not reach step {KILL_AFTER}:\n{job.log()}")
        killed = hosts.kill_host(1)
        codes = job.wait(timeout=300)
        if codes[0] != 0:
            raise RuntimeError(f"host 0's torchrun exited {codes[0]}:\n{job.log()}")
        first = [_json(f) for f in sorted(out.glob("start-a0-r*.json"))]
        again = [_json(f) for f in sorted(out.glob("start-a1-r*.json"))]
        errors = [_json(f) for f in sorted(out.glob("error-a0-r*.json"))]
        saves = [json.loads(line) for line in (out / "saves.jsonl").read_text().splitlines()]
        events = _log_times(out / "host0.log", time.localtime(killed).tm_year)
    if len(again) != 2 or {d["world_size"] for d in again} != {2}:
        raise RuntimeError(f"the restart did not run 2 ranks at world size 2: {again}")
    noticed = _after(events, killed, "failed (exitcode")
    latest = {k: max(d["times"][k] for d in again) for k in again[0]["times"]}
    last_ckpt = max(s["step"] for s in saves if s["attempt"] == 0)
    timeline = {
        "typed error": min(d["at"] for d in errors) if errors else float("nan"),
        "agent saw the failure": noticed,
        "rendezvous done": _after(events, noticed, "Rendezvous complete"),
        "worker process up": latest["process"],
        "imports done": latest["imported"],
        "xccl.init done": latest["inited"],
        "DDP wrapped": latest["ddp"],
        "checkpoint loaded": latest["loaded"],
        "first step": latest["first_step"],
    }
    return {
        "timeline_s": {k: v - killed for k, v in timeline.items()},
        "errors": sorted({d["chain"][0]["types"][0] for d in errors}),
        "init_s": {"first start": max(d["times"]["inited"] - d["times"]["imported"] for d in first),
                   "restart": max(d["times"]["inited"] - d["times"]["imported"] for d in again)},
        "world_check_s": {"first start": max(d["phases"].get("world check", 0.0) for d in first),
                          "restart": max(d["phases"].get("world check", 0.0) for d in again)},
        "restart_phases_s": {k: max(d["phases"].get(k, 0.0) for d in again) for k in again[0]["phases"]},
        "killed_after_step": progress["step"], "resumed_from": again[0]["resumed_from"],
        "steps_redone": progress["step"] - last_ckpt,
    }


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "timeline_s": {k: _stats([r["timeline_s"][k] for r in runs]) for k in ROWS},
        "init_s": {k: _stats([r["init_s"][k] for r in runs]) for k in ("first start", "restart")},
        "world_check_s": {k: _stats([r["world_check_s"][k] for r in runs]) for k in ("first start", "restart")},
        "steps_redone": _stats([float(r["steps_redone"]) for r in runs]),
    }


def _print(doc: dict[str, Any]) -> None:
    n = len(doc["runs"])
    print(f"restart-to-first-step under torchrun: 2 hosts x 2 ranks -> 1 host x 2 ranks, {doc['vendor']}, "
          f"{doc['rdzv']} rendezvous ({doc['rdzv_conf'] or 'torch defaults'}), {n} run{'s' * (n > 1)}")
    print(f"{'seconds after host 1 was killed':<34}{'median':>8}{'min':>8}{'max':>8}")
    for row in ROWS:
        s = doc["summary"]["timeline_s"][row]
        print(f"{row:<34}{s['median']:>8.2f}{s['min']:>8.2f}{s['max']:>8.2f}")
    for what in ("init_s", "world_check_s"):
        label = "xccl.init" if what == "init_s" else "  of which world check"
        for k in ("first start", "restart"):
            s = doc["summary"][what][k]
            print(f"{label + ', ' + k:<34}{s['median']:>8.2f}{s['min']:>8.2f}{s['max']:>8.2f}")
    s = doc["summary"]["steps_redone"]
    print(f"{'steps redone (after the last ckpt)':<34}{s['median']:>8.0f}{s['min']:>8.0f}{s['max']:>8.0f}")
    print(f"typed errors seen: {sorted({e for r in doc['runs'] for e in r['errors']})}; resumed from steps "
          f"{[r['resumed_from'] for r in doc['runs']]}; load average after the runs {doc['load_average_after'][0]:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--vendor", choices=sorted(SIMULATE), default="cpu")
    p.add_argument("--rdzv", choices=("tuned", "torch"), default="tuned")
    p.add_argument("--json", default=str(RESULTS))
    p.add_argument("--quick", action="store_true", help="1 run: a smoke run (tests)")
    args = p.parse_args()
    import elastic_train as et
    from netns import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"restart.py: skipped: 2 hosts need network namespaces: {reason}")
        doc: dict[str, Any] = {"skipped": reason}
    else:
        runs = []
        for i in range(1 if args.quick else args.repeat):
            with tempfile.TemporaryDirectory(prefix="xccl-restart-") as tmp:
                runs.append(one_run(Path(tmp), args.vendor, args.rdzv))
            print(f"run {i + 1}: first step {runs[-1]['timeline_s']['first step']:.1f} s after the kill", flush=True)
        doc = {"vendor": args.vendor, "rdzv": args.rdzv, "rdzv_conf": et.TUNED_RDZV if args.rdzv == "tuned" else {},
               "kill_after_step": KILL_AFTER, "checkpoint_every": et.EVERY, "runs": runs, "summary": summarise(runs)}
        import torch

        doc["torch"] = torch.__version__
        doc["load_average_after"] = os.getloadavg()
        _print(doc)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
