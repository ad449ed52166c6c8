"""Jobs on namespaced hosts: torchrun (or bare ranks with torchrun's environment) started on each host of a
:class:`~netns.Hosts`, and the :class:`Job` that waits for them and collects what they wrote.

The launchers are :class:`~netns.Hosts` methods (``hosts.run_torchrun``, ``hosts.run_ranks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # annotations only: the package imports this module
    from . import Hosts

__all__ = ["MASTER_PORT", "RDZV_PORT", "Job", "killpg", "run_ranks", "run_torchrun"]

#: Port of the rendezvous (every host has its own port space, so a fixed port cannot clash).
RDZV_PORT: Final = 29400
MASTER_PORT: Final = 29500


@dataclass
class Job:
    """Processes started on some hosts for one program; results come back as files in ``out``."""

    hosts: Hosts
    #: The job's directory: the program's ``$XCCL_NETNS_OUT``, with each process's command and output.
    out: Path
    #: (host index, process) per started process: one torchrun agent per host, or one process per rank.
    procs: list[tuple[int, subprocess.Popen[bytes]]]
    #: Each process's output file, in ``procs`` order.
    logs: list[Path]
    started: float = field(default_factory=time.time)
    #: Indices (into ``procs``) of the processes :meth:`wait` had to kill at its deadline.
    hung: list[int] = field(default_factory=list)
    #: Index into ``procs`` -> ``time.time()`` at which :meth:`wait_exit` saw the process end.
    exits: dict[int, float] = field(default_factory=dict)

    def wait(self, timeout: float) -> list[int | None]:
        """Wait at most ``timeout`` seconds in all for every process; kill (and list in ``hung``) those still
        running then, with everything else on their host. Returns the exit codes in ``procs`` order (None: killed
        at the deadline)."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for i, (host, p) in enumerate(self.procs):
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.hung.append(i)
                killpg(p)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
                codes.append(None)
                self.hosts.kill_host(host)
        return codes

    def wait_exit(self, timeout: float, poll: float = 0.05) -> dict[int, float]:
        """Wait at most ``timeout`` s for every process, noting in ``exits`` when each ended; kills nothing.
        Returns ``exits``."""
        deadline = time.monotonic() + timeout
        pending = {i for i in range(len(self.procs)) if i not in self.exits}
        while pending and time.monotonic() < deadline:
            for i in list(pending):
                if self.procs[i][1].poll() is not None:
                    self.exits[i] = time.time()
                    pending.discard(i)
            time.sleep(poll)
        return dict(self.exits)

    def wait_files(self, pattern: str, count: int, timeout: float) -> list[Path]:
        """Wait at most ``timeout`` s until ``count`` files match ``pattern`` in ``out`` (or every process ended);
        returns those that do."""
        deadline = time.monotonic() + timeout
        found: list[Path] = []
        while time.monotonic() < deadline:
            found = sorted(self.out.glob(pattern))
            if len(found) >= count or all(p.poll() is not None for _, p in self.procs):
                break
            time.sleep(0.1)
        return sorted(self.out.glob(pattern))

    def results(self, pattern: str = "rank-*.json") -> dict[int, dict[str, Any]]:
        """Every rank's result file (JSON with a ``rank`` field), by rank."""
        res: dict[int, dict[str, Any]] = {}
        for f in sorted(self.out.glob(pattern)):
            with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
                data = json.loads(f.read_text())
                res[int(data["rank"])] = data
        return res

    def log(self, tail: int = 6000) -> str:
        """The last ``tail`` characters of every process's output, for assertion messages."""
        parts = []
        for (host, _), path in zip(self.procs, self.logs, strict=True):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"----- host {host}: {path.name}\n{text[-tail:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """SIGKILL every process of the job (and its process group) and reap it."""
        for _, p in self.procs:
            killpg(p)
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def killpg(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        p.kill()


# Both are bound as methods of Hosts (``hosts.run_torchrun``): hence ``self``.


def run_torchrun(
    self: Hosts,
    program: str | os.PathLike[str],
    *,
    nproc: int = 2,
    hosts: Sequence[int] | None = None,
    nnodes: int | None = None,
    rdzv: str = "c10d",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    host_env: Mapping[int, Mapping[str, str]] | None = None,
    max_restarts: int = 0,
    rdzv_timeout: float = 60.0,
    name: str = "torchrun",
) -> Job:
    """Start ``torchrun ... program args`` on each of ``hosts`` (default: all), the rendezvous on host 0.

    Args:
        program: the Python file every rank runs.
        nproc: ranks per host (``--nproc-per-node``).
        hosts: host indices to start it on (a host left out never arrives).
        nnodes: ``--nnodes`` (default: the number of hosts of the set).
        rdzv: ``"c10d"`` (``--rdzv-backend c10d --rdzv-endpoint host0:29400``; node ranks in order of
            arrival) or ``"static"`` (``--master-addr host0 --node-rank i``).
        args: the program's arguments.
        env: extra environment of every process; ``host_env``: per host index, on top.
        max_restarts: torchrun's ``--max-restarts`` (0: an agent exits when one of its workers fails).
        rdzv_timeout: c10d's join timeout (seconds).
        name: names the job's output directory.

    The program's environment has ``XCCL_NETNS_OUT`` (the job's output directory), ``XCCL_NETNS_HOST`` and
    ``XCCL_NETNS_ADDR``, besides what torchrun sets.
    """
    which = list(range(self.n)) if hosts is None else list(hosts)
    nnodes = self.n if nnodes is None else nnodes
    out = self._new_job_dir(name)
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    h0 = self.hosts[0].addr
    procs: list[tuple[int, subprocess.Popen[bytes]]] = []
    logs: list[Path] = []
    run_id = f"{self.token}-{self._jobseq}"
    for i in which:
        h = self.hosts[i]
        common = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                  "--monitor-interval=0.2", f"--local-addr={h.addr}"]
        if rdzv == "c10d":
            conf = f"is_host={'1' if i == 0 else '0'},join_timeout={int(rdzv_timeout)},read_timeout=30"
            rd = ["--rdzv-backend=c10d", f"--rdzv-endpoint={h0}:{RDZV_PORT}", f"--rdzv-id={run_id}",
                  f"--rdzv-conf={conf}"]
        elif rdzv == "static":
            rd = [f"--master-addr={h0}", f"--master-port={MASTER_PORT}", f"--node-rank={i}"]
        else:
            raise ValueError(f"rdzv={rdzv!r}: 'c10d' or 'static'")
        argv = [*launcher, *common, *rd, str(program), *args]
        penv = self.env(i, {**(env or {}), **(host_env or {}).get(i, {}), "XCCL_NETNS_OUT": str(out)})
        log = out / f"host{i}.log"
        (out / f"host{i}.cmd").write_text(" ".join(argv) + "\n")
        procs.append((i, self.popen(i, argv, env=penv, log=log)))
        logs.append(log)
    job = Job(self, out, procs, logs)
    self._jobs.append(job)
    return job


def run_ranks(
    self: Hosts,
    program: str | os.PathLike[str],
    *,
    nproc: int = 2,
    hosts: Sequence[int] | None = None,
    world_size: int | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    host_env: Mapping[int, Mapping[str, str]] | None = None,
    name: str = "ranks",
) -> Job:
    """Start ``python program args`` once per rank, with the environment torchrun would set, and no agent.

    Host ``i`` runs global ranks ``i * nproc .. i * nproc + nproc - 1``; ``MASTER_ADDR`` is host 0.
    ``WORLD_SIZE`` is ``world_size`` (default ``n * nproc``; ``host_env`` may override it per host). Nothing
    waits for the other hosts but ``xccl.init``'s own rendezvous.
    """
    which = list(range(self.n)) if hosts is None else list(hosts)
    world = self.n * nproc if world_size is None else world_size
    out = self._new_job_dir(name)
    procs: list[tuple[int, subprocess.Popen[bytes]]] = []
    logs: list[Path] = []
    for i in which:
        for local in range(nproc):
            rank = i * nproc + local
            penv = self.env(i, {
                "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(i),
                "MASTER_ADDR": self.hosts[0].addr, "MASTER_PORT": str(MASTER_PORT),
                **(env or {}), **(host_env or {}).get(i, {}), "XCCL_NETNS_OUT": str(out),
            })
            log = out / f"host{i}-rank{rank}.log"
            procs.append((i, self.popen(i, [sys.executable, str(program), *args], env=penv, log=log)))
            logs.append(log)
    job = Job(self, out, procs, logs)
    self._jobs.append(job)
    return job

