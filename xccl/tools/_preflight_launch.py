"""Launch the ranks of a preflight: N processes of the user's script on this machine, as torchrun would start them.

Each rank gets torchrun's variables (ranks laid out node by node, ``N / M`` per node), the vendor's simulation
(``XCCL_SIMULATE``) and the flight recorder, dumping its record at exit into the preflight's directory with its
compiled regions next to it. As with torchrun, the first rank that fails ends the run (docs/preflight.md, "What it
does, and what it cannot show"); every wait is bounded by the preflight's timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

from ..collectives._flight_dump import AT_EXIT
from ..plugin._fake_world import ENV as FAKE_ENV
from ..plugin._graph_checks import COMPILED_AT_EXIT
from ..testing._pool import free_port

__all__ = ["RankExit", "launch", "rank_env"]

#: Entries each rank's recorder keeps: a preflight runs a bounded number of steps, and a call that fell out of the
#: ring would be missing from the report.
ENTRIES: Final = 200_000
#: Seconds the other ranks get to fail on their own after the first failure, before they are stopped.
GRACE: Final = 5.0
#: Seconds a rank asked to dump (SIGUSR1) gets before it is killed.
DUMP_GRACE: Final = 2.0


@final
@dataclass(frozen=True, slots=True)
class RankExit:
    """How one rank ended.

    Attributes:
        rank: its global rank.
        returncode: its exit status (negative: the signal that ended it).
        output: the last of what it printed (stdout and stderr together).
        stopped: the launcher stopped it (another rank failed first, or the timeout).
    """

    rank: int
    returncode: int
    output: str
    stopped: bool


def rank_env(base: Mapping[str, str], *, rank: int, world: int, nodes: int, port: int, vendor: str,
             trace_dir: str, fake: bool = False) -> dict[str, str]:
    """The environment of rank ``rank``: torchrun's variables, the simulation and the recorder's switches (and,
    with ``fake``, ``XCCL_FAKE_WORLD``: the rank plays its part of a world that does not exist)."""
    per_node = world // nodes
    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
        "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node), "NODE_RANK": str(rank // per_node),
        "GROUP_WORLD_SIZE": str(nodes), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "xccl-preflight",
        "XCCL_TRACE": str(ENTRIES), AT_EXIT: "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(trace_dir, "rank_"),
        COMPILED_AT_EXIT: "1",
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"),
    })
    for name in (FAKE_ENV, "XCCL_VENDOR", "XCCL_SIMULATE"):  # XCCL_SIMULATE names the vendor; with XCCL_VENDOR too
        env.pop(name, None)                                  # they would conflict
    if fake:
        env[FAKE_ENV] = f"{rank}/{world}"
    if vendor != "cpu":
        env["XCCL_SIMULATE"] = vendor
    return env


def _tail(path: str, limit: int = 20_000) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read().decode(errors="replace")


def launch(argv: Sequence[str], *, vendor: str, world: int, nodes: int, timeout: float, trace_dir: str,
           cwd: str | None = None, env: Mapping[str, str] | None = None,
           fake: Sequence[int] | None = None) -> list[RankExit]:
    """Run ``python ARGV`` as every rank of a world of ``world`` on ``nodes`` nodes; how each rank ended.

    With ``fake``, only those ranks run, each alone in a fake world (``XCCL_FAKE_WORLD``: no communication, no
    peer to wait for); they do not depend on each other, so one failing does not end the others.

    Args:
        argv: what follows ``python``: ``train.py ARGS`` or ``-m module ARGS``.
        vendor: the plugin whose simulation the ranks run on (``cpu``: gloo itself).
        world: the number of ranks.
        nodes: the number of nodes they pretend to span (``world`` must be a multiple).
        timeout: seconds the whole run may take; ranks still running then are stopped.
        trace_dir: where the ranks dump their records and errors.
        cwd: the ranks' working directory (default: this process's).
        env: the base environment (default: this process's).
        fake: the ranks to run in a fake world (None: every rank, a real world).
    """
    port = free_port()
    base = dict(os.environ if env is None else env)
    procs: list[subprocess.Popen[bytes]] = []
    ranks = list(range(world)) if fake is None else list(fake)
    logs = [os.path.join(trace_dir, f"output_{rank}.log") for rank in ranks]
    for rank, log in zip(ranks, logs, strict=True):
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "xccl.tools._preflight_child", trace_dir, "--", *argv],
                env=rank_env(base, rank=rank, world=world, nodes=nodes, port=port, vendor=vendor,
                             trace_dir=trace_dir, fake=fake is not None),
                cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    stopped = _wait(procs, timeout, first_failure_ends=fake is None)
    return [RankExit(rank, int(p.returncode), _tail(log), i in stopped)
            for i, (rank, p, log) in enumerate(zip(ranks, procs, logs, strict=True))]


def _wait(procs: Sequence[subprocess.Popen[bytes]], timeout: float, *, first_failure_ends: bool = True) -> set[int]:
    """Wait for every rank, ending the run as torchrun does at the first failure (unless not
    ``first_failure_ends``); the indexes of the processes that were stopped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return set()
        if first_failure_ends and any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + GRACE)
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            break
        time.sleep(0.05)
    return _stop(procs)


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> set[int]:
    """Ask each rank still running to dump its record, then stop it."""
    running = {rank for rank, p in enumerate(procs) if p.poll() is None}
    for rank in running:
        procs[rank].send_signal(signal.SIGUSR1)
    end = time.monotonic() + DUMP_GRACE
    while time.monotonic() < end and any(procs[r].poll() is None for r in running):
        time.sleep(0.05)
    for rank in running:
        if procs[rank].poll() is None:
            procs[rank].kill()
        procs[rank].wait(timeout=DUMP_GRACE)
    return running
