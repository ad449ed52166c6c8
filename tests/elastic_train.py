"""A tiny DDP training run that survives a lost host under ``torchrun --max-restarts``: it resumes from its last
complete DCP checkpoint at every start. Run by tests/test_elastic_restart.py and benchmarks/restart.py on namespaced
hosts (tests/netns); importable for what both need besides: the model, the data of a step, the single-process
reference, and the torchrun command line with the rendezvous settings a restart needs.

As a script (under torchrun)::

    python elastic_train.py CKPT_DIR [--steps N] [--every K] [--pace S]

Every rank runs ``xccl.init`` (its rendezvous and world check run on every start, restarts included), wraps the
model in DDP on xccl's world, loads the newest checkpoint under ``CKPT_DIR`` that DCP finished (its ``.metadata``
exists), trains the remaining steps, and saves a checkpoint after every ``K``-th step. Step ``s``'s global batch is
fixed by ``s`` and split evenly over the ranks: with DDP's gradient averaging every world size computes the same
update, so the final weights equal :func:`reference` whatever the world did on the way (up to summation order).

What each rank saw goes to ``$XCCL_NETNS_OUT`` (default: ``CKPT_DIR``) as JSON: ``start-a{attempt}-r{rank}.json``
when the first step of a start completed (world size, the step it resumed from, xccl.init's phases),
``error-a{attempt}-r{rank}.json`` when a step raised (then the process exits 3, and torchrun's agent restarts the
workers), ``final-r{rank}.json`` at the end (the weights, on rank 0); rank 0 also keeps ``progress-a{attempt}``
(the last step completed) and appends every save to ``saves.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from torch import nn

if TYPE_CHECKING:
    from netns import Hosts

STEPS: Final = 24
EVERY: Final = 3
#: Seconds each step sleeps after its update: a pace the test can kill a host within.
PACE: Final = 0.15
GLOBAL_BATCH: Final = 8  # divisible by every world size the job runs at (4, 2)
LR: Final = 0.05
#: xccl.init(timeout=...) of every rank: a lost host becomes PeerFailure (or CollectiveTimeout) within it.
TIMEOUT: Final = 10.0
#: xccl.init(setup_timeout=...): starting ranks on a busy machine is slower than a collective.
SETUP_TIMEOUT: Final = 120.0
#: The rendezvous settings of torchrun's c10d handler (``--rdzv-conf``) the tests and the benchmark use, against
#: torch's defaults (last call 30 s; a dead node is dropped after 3 missed 5 s keep-alives): after a host is lost,
#: the survivor's agent waits until the dead node's heartbeat expires (keep_alive_interval x keep_alive_max_attempt)
#: and then ``last_call_timeout`` for more nodes before it restarts its workers on the smaller world.
TUNED_RDZV: Final = {"last_call_timeout": 5, "keep_alive_interval": 2, "keep_alive_max_attempt": 3}
RDZV_PORT: Final = 29400


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: the same on every rank, at every world size, in every start."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 8, generator=gen), torch.randn(GLOBAL_BATCH, 4, generator=gen)


def reference(steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The weights after ``steps`` steps on one process, the whole global batch at once (no failure, no DDP)."""
    model = make_model()
    opt = make_optimizer(model)
    for step in range(steps):
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def torchrun_argv(
    program: str | os.PathLike[str], args: Sequence[str], *, host: int, local_addr: str, endpoint: str, run_id: str,
    nnodes: str = "1:2", nproc: int = 2, max_restarts: int = 1, rdzv: Mapping[str, int] | None = TUNED_RDZV,
) -> list[str]:
    """The torchrun command of one host of an elastic job: c10d rendezvous at ``endpoint`` (hosted by host 0's
    agent), ``--nnodes nnodes``, ``--max-restarts``, and ``rdzv`` (None: torch's defaults) in ``--rdzv-conf``."""
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    conf = {"is_host": int(host == 0), "join_timeout": 180, "read_timeout": 60, **(rdzv or {})}
    return [*launcher, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2", f"--local-addr={local_addr}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()), str(program), *args]


def launch(hosts: Hosts, out: Path, args: Sequence[str], *, env: Mapping[str, str] | None = None,
           rdzv: Mapping[str, int] | None = TUNED_RDZV, max_restarts: int = 1, share_store: bool = True) -> Any:
    """Start this script under torchrun on every host of ``hosts`` (``--nnodes 1:<n>``); returns a ``netns.Job``.

    ``hosts.run_torchrun`` fixes ``--rdzv-conf`` to torch's defaults plus a join timeout; a restart on fewer hosts
    is timed by ``last_call_timeout`` and the keep-alive settings, so this builds the command itself (with the
    harness's public parts: ``popen``, ``env``, ``Job``; teardown kills what runs in the namespaces).

    ``share_store=False`` sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (rank 0 of each start hosts a new store);
    the default keeps torch's own: the agent's rendezvous store, shared with the workers and kept across restarts,
    where a start's keys stay. xccl puts every world's keys under a prefix of its own per start
    (``xccl.runtime._rendezvous``), so a restarted rank does not read its peers' old addresses (plain
    ``init_process_group("gloo")`` does on torch 2.13 and fails to connect: pytorch/pytorch#135712, #167288).
    """
    from netns import Job

    env = {**({} if share_store else {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}), **(env or {})}
    out.mkdir(parents=True, exist_ok=True)
    run_id = f"{hosts.token}-{out.name}"
    procs, logs = [], []
    for i in range(hosts.n):
        argv = torchrun_argv(__file__, args, host=i, local_addr=hosts[i].addr, endpoint=f"{hosts[0].addr}:{RDZV_PORT}",
                             run_id=run_id, nnodes=f"1:{hosts.n}", max_restarts=max_restarts, rdzv=rdzv)
        log = out / f"host{i}.log"
        (out / f"host{i}.cmd").write_text(" ".join(argv) + "\n")
        procs.append((i, hosts.popen(i, argv, env=hosts.env(i, {**env, "XCCL_NETNS_OUT": str(out)}), log=log)))
        logs.append(log)
    return Job(hosts, out, procs, logs)


# ------------------------------------------------------------------------------------------------ the worker


def process_start() -> float:
    """When this process began (``time.time()`` scale, 10 ms steps; Linux): a restart's clock starts with the
    process, before Python imports torch."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return float("nan")


def complete_checkpoints(root: Path) -> list[int]:
    """The steps of the checkpoints under ``root`` that DCP finished (``.metadata`` is written last)."""
    steps = []
    for d in root.glob("step-*"):
        m = re.fullmatch(r"step-(\d+)", d.name)
        if m and (d / ".metadata").exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def _write(out: Path, name: str, data: Mapping[str, Any]) -> None:
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, out / name)


def _fault(exc: BaseException) -> dict[str, Any]:
    chain, e = [], exc
    while e is not None and len(chain) < 4:
        chain.append({"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:600]})
        e = e.__cause__ or e.__context__
    return {"at": time.time(), "chain": chain}


def main(argv: Sequence[str] | None = None) -> int:
    started = time.time()
    p = argparse.ArgumentParser()
    p.add_argument("ckpt", type=Path)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--every", type=int, default=EVERY)
    p.add_argument("--pace", type=float, default=PACE)
    a = p.parse_args(argv)
    out = Path(os.environ.get("XCCL_NETNS_OUT", a.ckpt))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    import xccl
    from xccl.collectives._state import PROCESS

    imported = time.time()
    world = xccl.init(timeout=TIMEOUT, setup_timeout=SETUP_TIMEOUT)
    inited = time.time()
    rank, n = world.rank, world.world_size
    torch.set_num_threads(1)
    model = DDP(make_model().to(world.device))
    opt = make_optimizer(model)
    wrapped = time.time()
    found = complete_checkpoints(a.ckpt)
    start = 0
    if found:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=a.ckpt / f"step-{found[-1]:06d}")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = found[-1] + 1
    loaded = time.time()
    record: dict[str, Any] = {
        "rank": rank, "attempt": attempt, "world_size": n, "env_world_size": int(os.environ["WORLD_SIZE"]),
        "host": socket.gethostname(), "pid": os.getpid(), "plugin": world.plugin, "resumed_from": found[-1] if found else None,
        "start_step": start, "checkpoints_at_start": found, "phases": dict(PROCESS.phases),
        "times": {"process": process_start(), "started": started, "imported": imported, "inited": inited, "ddp": wrapped, "loaded": loaded},
    }
    step = start
    try:
        for step in range(start, a.steps):
            x, y = batch(step)
            xs, ys = x.chunk(n)[rank].to(world.device), y.chunk(n)[rank].to(world.device)
            nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
            opt.zero_grad()
            if step == start:
                record["times"]["first_step"] = time.time()
                _write(out, f"start-a{attempt}-r{rank}.json", record)
            if (step + 1) % a.every == 0 or step == a.steps - 1:
                msd, osd = get_state_dict(model, opt)
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=a.ckpt / f"step-{step:06d}")
                if rank == 0:
                    with open(out / "saves.jsonl", "a") as f:
                        f.write(json.dumps({"step": step, "attempt": attempt, "world_size": n, "at": time.time()}) + "\n")
            if rank == 0:
                _write(out, f"progress-a{attempt}", {"step": step, "at": time.time()})
            time.sleep(a.pace)
    except Exception as exc:
        _write(out, f"error-a{attempt}-r{rank}.json", {"rank": rank, "attempt": attempt, "step": step, **_fault(exc)})
        print(f"rank {rank} (attempt {attempt}) failed at step {step}: {type(exc).__name__}: {exc}", flush=True)
        return 3
    final = {"rank": rank, "attempt": attempt, "world_size": n, "steps": a.steps, "at": time.time()}
    if rank == 0:
        final["weights"] = {k: v.detach().cpu().tolist() for k, v in model.module.state_dict().items()}
    _write(out, f"final-r{rank}.json", final)
    xccl.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
