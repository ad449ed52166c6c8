"""One replica group of a torchft job whose replica dimension runs on xccl (``xccl.integrations.torchft``).

``python job_torchft.py --replica I --lighthouse ADDR --barrier HOST:PORT --steps N [--die-at K]``, with the
launcher's variables of a world of one (``RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT``: each replica group is its
own job, as torchft runs them): ``xccl.init()`` makes this replica's world, torchft's ``Manager`` joins the quorum
at the lighthouse with a :class:`~xccl.integrations.torchft.ProcessGroupXccl`, and torchft's DDP and optimizer
wrapper train :mod:`_job`'s model on this replica's half of the batch, the gradients averaged over the live replica
groups through xccl's group. With ``--die-at K`` the replica SIGKILLs itself at step K, after that step's quorum and
before its allreduce: the others' allreduce fails, torchft discards the step, and the next quorum leaves it out.

Writes ``replica<I>.json`` (at every step, so the dead one's stays): per step the quorum's participants, whether
the step was committed, the error torchft recorded, the backend of torchft's group; the parameters after
``--die-at`` steps (``params_before``) and at the end (``params``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
from pathlib import Path
from typing import Any

import _job
import torch
import torch.distributed as dist
from torch import nn
from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper

import xccl
from xccl.integrations.torchft import ProcessGroupXccl

TIMEOUT = _dt.timedelta(seconds=30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--barrier", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--die-at", type=int, default=-1)
    a = p.parse_args()
    world = xccl.init()
    net = _job.model()
    opt = torch.optim.SGD(net.parameters(), lr=_job.LR)
    pg = ProcessGroupXccl(timeout=TIMEOUT)
    manager = Manager(
        pg=pg, min_replica_size=1, replica_id=f"replica_{a.replica}", lighthouse_addr=a.lighthouse,
        load_state_dict=lambda sd: (net.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
        rank=0, world_size=1, use_async_quorum=False, init_sync=False, timeout=TIMEOUT, quorum_timeout=TIMEOUT,
    )
    ddp = DistributedDataParallel(manager, net)
    ft_opt = OptimizerWrapper(manager, opt)
    _meet(a.barrier, a.replica, a.replicas)
    x, y = _job.rows(a.replica, a.replicas)
    doc: dict[str, Any] = {"plugin": world.plugin, "steps": []}
    for step in range(a.steps):
        if step == a.die_at:
            doc["params_before"] = _params(net)
        ft_opt.zero_grad()  # torchft's quorum for this step; a new quorum reconfigures xccl's group
        if step == a.die_at and a.replica == a.replicas - 1:
            _write(a.replica, doc)
            os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # torchft's DDP: manager.allreduce on xccl's group, per bucket
        err = pg.errored() or manager.errored()  # what the step's should_commit reports, if anything
        participants = manager.num_participants()
        before = manager.current_step()
        ft_opt.step()  # should_commit: every replica agrees, or none steps
        doc["steps"].append({
            "participants": participants, "committed": manager.current_step() > before,
            "error": None if err is None else _error_name(err), "loss": loss.item(),
            "backend": pg.parent.name() if pg._pg is not None else None,
            "group": repr(pg._pg),
        })
        _write(a.replica, doc)
    doc["params"] = _params(net)
    _write(a.replica, doc)
    manager.shutdown(wait=False)
    xccl.shutdown()


def _meet(address: str, replica: int, replicas: int) -> None:
    """Start together: the lighthouse's first quorum then has every replica (each heartbeats from its Manager)."""
    host, port = address.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=TIMEOUT)
    store.set(f"ready{replica}", "1")
    store.wait([f"ready{r}" for r in range(replicas)])


def _error_name(err: Any) -> str:
    original = getattr(err, "original_exception", err)
    return f"{type(original).__module__}.{type(original).__name__}: {str(original).splitlines()[0][:300]}"


def _params(net: nn.Module) -> dict[str, Any]:
    return {k: v.detach().tolist() for k, v in net.state_dict().items()}


def _write(replica: int, doc: dict[str, Any]) -> None:
    out = os.environ.get(_job.OUT_ENV)
    text = json.dumps(doc)
    if out:
        Path(out, f"replica{replica}.json").write_text(text)
    else:
        print(f"replica{replica}", text)


if __name__ == "__main__":
    main()
