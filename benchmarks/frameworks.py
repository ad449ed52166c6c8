"""Each training framework's job through xccl against the same job on plain gloo, side by side in one run.

The jobs are the ones tests/frameworks runs (2 ranks, the cpu plugin, the test MLP, ``--steps`` SGD steps), launched
as a user would, once on xccl's backend and once on plain gloo (``XCCL_FRAMEWORK_BASELINE=gloo``: no xccl at all),
the two alternating round by round (which goes first alternates too), ``--rounds`` rounds after one untimed
launch of each job:

* ``lightning_ddp``: ``torchrun`` + Lightning ``DDPStrategy(process_group_backend=...)``;
* ``deepspeed_zero2`` / ``deepspeed_zero3``: ``torchrun`` + ``deepspeed.init_distributed`` + ``deepspeed.initialize``
  (both stages in one launch; the launch time is counted once, for ZeRO-2);
* ``accelerate``: ``torchrun`` + ``xccl.init()`` (or ``init_process_group("gloo")``) + ``Accelerator(cpu=True)``;
* ``torchtitan_fsdp2``: torchtitan's FSDP2 recipe with SUM forced (``--force-sum``): with its default ``PREMUL_SUM``
  it does not run on plain gloo at all (gloo has no PREMUL_SUM), so that is the configuration both can time;
* ``ray_train``: ``TorchTrainer``, 2 workers, xccl's and gloo's trainers alternating in one Ray session
  (``job_ray.py --plugins cpu,gloo --repeat R``); "job" is ``trainer.fit()``.

Two times per job: **job**, launch to exit (what a user waits for: interpreter and framework imports, process-group
creation, training, teardown), and **train**, the training loop as the job itself timed it on rank 0. Ratios are
xccl / gloo of the medians. A machine shared with other work makes the absolute figures noisy; the interleaving
puts both sides under the same noise.

Usage: ``python benchmarks/frameworks.py [--rounds 3] [--steps 50] [--jobs lightning_ddp,accelerate,...]
[--json benchmarks/results/frameworks.json]``; ``--quick`` is the small mode (one round of 3 steps of the
Accelerate job, no warm-up launch), which tests/frameworks runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "frameworks"))  # the job scripts and their launcher

from _launch import run  # noqa: E402

#: job -> (script, arguments, [(result name, reported job)]): a launch can time several jobs (DeepSpeed's stages).
LAUNCHED: dict[str, tuple[str, list[str], list[str]]] = {
    "lightning_ddp": ("job_lightning.py", ["--strategies", "ddp", "--devices", "2"], ["ddp"]),
    "deepspeed": ("job_deepspeed.py", ["--stages", "2,3"], ["zero2", "zero3"]),
    "accelerate": ("job_accelerate.py", ["--mode", "cpu"], ["accelerate_cpu"]),
    "torchtitan_fsdp2": ("job_torchtitan.py", ["--force-sum"], ["torchtitan_fsdp2"]),
}
REPORTED = {"ddp": "lightning_ddp", "zero2": "deepspeed_zero2", "zero3": "deepspeed_zero3",
            "accelerate_cpu": "accelerate", "torchtitan_fsdp2": "torchtitan_fsdp2"}


def _launched(job: str, side: str, steps: int, times: dict[str, dict[str, dict[str, list[float]]]]) -> None:
    script, args, names = LAUNCHED[job]
    env = {"XCCL_FRAMEWORK_STEPS": str(steps), "DS_ACCELERATOR": "cpu",
           "TORCH_EXTENSIONS_DIR": str(Path(sys.prefix) / "torch_extensions")}  # as tests/frameworks/test_deepspeed
    if side == "gloo":
        env["XCCL_FRAMEWORK_BASELINE"] = "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        done = run(script, args, "cpu", Path(tmp), nproc=2, timeout=900, env=env)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{job} on {side} failed: {done.first_error()}\n{done.output[-2000:]}")
        for i, name in enumerate(names):
            result = json.loads(Path(tmp, f"{name}.json").read_text())
            row = times.setdefault(REPORTED[name], {}).setdefault(side, {"job_s": [], "train_s": []})
            if i == 0:
                row["job_s"].append(wall)
            row["train_s"].append(float(result["train_s"]))


def _ray(rounds: int, steps: int, times: dict[str, dict[str, dict[str, list[float]]]]) -> None:
    env = {"XCCL_FRAMEWORK_STEPS": str(steps), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300"}
    with tempfile.TemporaryDirectory() as tmp:
        done = run("job_ray.py", ["--plugins", "cpu,gloo", "--repeat", str(rounds)], "cpu", Path(tmp),
                   timeout=1800, env=env)
        errors = sorted(Path(tmp).glob("*.error"))
        if done.returncode != 0 or errors:
            raise RuntimeError(f"ray_train failed: {errors[0].read_text()[:2000] if errors else done.output[-2000:]}")
        for i in range(2 * rounds):
            name = f"{'cpu' if i % 2 == 0 else 'gloo'}.{i}"
            side = "xccl" if name.startswith("cpu") else "gloo"
            row = times.setdefault("ray_train", {}).setdefault(side, {"job_s": [], "train_s": []})
            row["job_s"].append(float(Path(tmp, f"{name}.fit_s").read_text()))
            row["train_s"].append(float(json.loads(Path(tmp, f"{name}.json").read_text())["train_s"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--jobs", default=",".join([*LAUNCHED, "ray_train"]))
    p.add_argument("--json", default="benchmarks/results/frameworks.json")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed launch of each job")
    p.add_argument("--quick", action="store_true", help="small mode: --rounds 1 --steps 3 --jobs accelerate "
                   "--no-warmup (checks the script works; measures nothing)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.steps, args.jobs, args.warmup = 1, 3, "accelerate", False
    jobs = args.jobs.split(",")
    times: dict[str, dict[str, dict[str, list[float]]]] = {}
    for job in (j for j in jobs if j in LAUNCHED and args.warmup):  # untimed: DeepSpeed's JIT build, file cache
        _launched(job, "xccl", 1, {})
    for r in range(args.rounds):
        for job in (j for j in jobs if j in LAUNCHED):
            for side in (("xccl", "gloo") if r % 2 == 0 else ("gloo", "xccl")):
                _launched(job, side, args.steps, times)
                print(f"round {r + 1}/{args.rounds}: {job} on {side} done: {json.dumps(times)}", flush=True)
    failed: dict[str, str] = {}
    if "ray_train" in jobs:
        try:
            _ray(args.rounds, args.steps, times)
        except RuntimeError as exc:  # the other jobs' figures still stand; the failure goes in the table
            failed["ray_train"] = str(exc)
    rows: dict[str, dict[str, Any]] = {}
    print(f"\n{'job':<18}{'gloo job s':>12}{'xccl job s':>12}{'ratio':>8}{'gloo train s':>14}{'xccl train s':>14}"
          f"{'ratio':>8}")
    for name, sides in times.items():
        # A launch that runs several jobs (DeepSpeed's stages) counts its launch time for the first one only.
        med = {(side, k): statistics.median(v[k]) if v[k] else float("nan")
               for side, v in sides.items() for k in ("job_s", "train_s")}
        row = {"gloo_job_s": med["gloo", "job_s"], "xccl_job_s": med["xccl", "job_s"],
               "job_ratio": med["xccl", "job_s"] / med["gloo", "job_s"],
               "gloo_train_s": med["gloo", "train_s"], "xccl_train_s": med["xccl", "train_s"],
               "train_ratio": med["xccl", "train_s"] / med["gloo", "train_s"], "samples": sides}
        rows[name] = row
        print(f"{name:<18}{row['gloo_job_s']:>12.2f}{row['xccl_job_s']:>12.2f}{row['job_ratio']:>8.2f}"
              f"{row['gloo_train_s']:>14.3f}{row['xccl_train_s']:>14.3f}{row['train_ratio']:>8.2f}")
    for name, why in failed.items():
        print(f"{name:<18}failed: {why.splitlines()[0]}")
    import torch

    doc = {"world_size": 2, "plugin": "cpu", "rounds": args.rounds, "steps": args.steps, "torch": torch.__version__,
           "model": "MLP Linear(8, 16) ReLU Linear(16, 4), global batch 8, SGD, float32", "results": rows, "failed": failed}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
