"""``xccl doctor --world``: every rank of a job runs doctor, and rank 0 prints what differs between them
(docs/cli.md, ``xccl doctor --world``).

Each rank condenses its node checks into its :class:`~.doctor_facts.RankFacts` and leaves them in the launcher's
rendezvous store, never a collective, so that worlds that cannot form a process group are diagnosed too; which
store, and how long each rank waits, is in docs/cli.md. Rank 0 prints and leaves its verdict, which every rank exits
with.

Protocol (keys under ``xccl.doctor/<run id>/<restart>/``): each rank takes a slot with ``add("n", 1)`` and sets
``slot/<i>`` to its facts as JSON (slots rather than one key per rank, so that two processes given the same
``RANK`` are both seen); rank 0 also sets ``reporter``; rank 0 sets ``verdict`` to the exit status and waits
(bounded) until every other rank has read it (``add("acks", 1)``), since the store may live in rank 0's process.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TextIO, final

from torch.distributed import TCPStore

from ...errors import InitError
from ...plugin import job_env
from .doctor_checks import collect
from .doctor_facts import RankFacts, WorldVerdict, compare, gather, rank_list
from .doctor_model import DEFAULT_TIMEOUT, MARK

__all__ = ["DEFAULT_TIMEOUT", "USAGE", "Launch", "launch_of", "render_world", "run_world"]

#: How long rank 0 keeps the store up for the other ranks to read the verdict, at most.
_ACK_WAIT: Final = 10.0
_POLL: Final = 0.05

USAGE: Final = """\
xccl doctor --world compares every rank of a job, so it runs on every rank, started by the launcher:

  torchrun --nproc-per-node 8 --no-python xccl doctor --world                  # one node
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
      --rdzv-endpoint NODE0:29400 --rdzv-id doctor --no-python xccl doctor --world   # on every node
  python -m torch.distributed.run --nproc-per-node 8 -m xccl doctor --world      # without the console script

Any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT on each process works (Slurm, mpirun).
"""


@final
@dataclass(frozen=True, slots=True)
class Launch:
    """What the launcher told this rank, and where the store is."""

    rank: int
    world_size: int
    local_rank: int
    addr: str
    port: int
    #: torchrun's agent hosts the store (every rank is a client); otherwise rank 0 hosts it.
    agent_store: bool
    #: Separates the keys of one run (and one torchrun restart) from another's in a long-lived store.
    prefix: str


def launch_of(env: Mapping[str, str]) -> Launch | str:
    """The launch this rank is part of, or why there is none (a message that says how to run ``--world``)."""

    try:
        job = job_env(env)
    except InitError as exc:
        return f"{exc}: fix the launcher's variables (`xccl doctor` says more)"
    rank, size, local = job.rank, job.world_size, job.local_rank
    if rank is None or size is None:
        unset = " and ".join(n for n, v in (("RANK", rank), ("WORLD_SIZE", size)) if v is None)
        return (USAGE + f"\nThis process has no {unset}: no launcher started it. `xccl doctor` (without --world) "
                "checks this node alone.")
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if job.source in ("slurm", "lsf", "mpi") and job.master_addr and job.master_port:
        addr, port = job.master_addr, str(job.master_port)
    if not addr or not port.isdigit() or not 0 < int(port) < 65536:
        return (f"MASTER_ADDR={addr or '(unset)'} MASTER_PORT={port or '(unset)'}: --world exchanges its findings "
                "through the store at MASTER_ADDR:MASTER_PORT; set both (torchrun does)\n\n" + USAGE)
    run_id = env.get("TORCHELASTIC_RUN_ID", "") or "none"
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "") or "0"
    return Launch(rank, size, rank if local is None else local, addr, int(port),
                  env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", f"xccl.doctor/{run_id}/{restart}/")


def _store(launch: Launch, timeout: float) -> Any:
    """A client of torchrun's agent store, or (without one) rank 0 hosts a store and the others connect to it.

    Rank 0 hosts without waiting for the others (``wait_for_workers=False``): the missing ones are what it reports.
    A client first waits for the port to accept a connection, within ``timeout``: TCPStore's own connect loop
    overshoots its timeout (about twice it, measured on torch 2.13) and prints a C++ stack for each attempt.
    """
    hosting = launch.rank == 0 and not launch.agent_store
    if not hosting and not _accepts(launch.addr, launch.port, time.monotonic() + timeout):
        raise TimeoutError(f"nothing accepted a connection at {launch.addr}:{launch.port}")
    return TCPStore(launch.addr, launch.port, None, hosting, _dt.timedelta(seconds=timeout), wait_for_workers=False)


def _accepts(addr: str, port: int, deadline: float) -> bool:
    """Whether ``addr:port`` accepts a TCP connection before ``deadline`` (tried every 0.2 s)."""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(min(left, 1.0), 0.05)):
                return True
        except OSError:
            if left <= 0:
                return False
            time.sleep(min(0.2, max(left, 0.0)))


def run_world(
    env: Mapping[str, str] | None = None,
    *,
    vendor: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``xccl doctor --world`` on this rank; the exit status (the same on every rank that hears rank 0).

    Returns:
        0 when every rank answered and nothing was flagged; 1 when something was (or rank 0 never answered);
        2 when this process was not started by a launcher.
    """
    env = dict(os.environ if env is None else env)
    out, err = out or sys.stdout, err or sys.stderr
    launch = launch_of(env)
    if isinstance(launch, str):
        print(launch, file=err)
        return 2
    mine = gather(collect(env, vendor=vendor), env, launch.rank, launch.world_size, launch.local_rank)
    started = time.monotonic()
    try:
        store = _store(launch, timeout)
    except Exception as exc:  # DistNetworkError, DistStoreError, RuntimeError: the store is not reachable
        hosting = launch.rank == 0 and not launch.agent_store
        hint = "" if hosting or launch.agent_store else (
            "Rank 0 hosts it: it has not started, has already given up waiting (--timeout), or MASTER_ADDR/"
            "MASTER_PORT differ between ranks. "
        )
        print(f"xccl doctor --world: rank {launch.rank} could not {'host the store on' if hosting else 'reach the store at'}"
              f" {launch.addr}:{launch.port} within {timeout:g} s ({type(exc).__name__}: {_first_line(exc)}). "
              + hint + _summary(mine), file=err)
        return 1
    key = launch.prefix
    store.set(f"{key}slot/{store.add(key + 'n', 1)}", json.dumps(mine.to_dict()))
    if launch.rank != 0:
        return _follow(store, key, launch, mine, timeout, started, err)
    store.set(key + "reporter", mine.host)
    answers = _gather_all(store, key, mine, started + timeout)
    verdict = compare(answers, timeout)
    print(json.dumps(verdict.to_dict(), indent=2) if as_json else render_world(verdict), file=out, flush=True)
    code = 0 if verdict.ok else 1
    store.set(key + "verdict", str(code))
    _wait_until(lambda: int(store.add(key + "acks", 0)) >= len(answers) - 1, _ACK_WAIT)
    return code


def _gather_all(store: Any, key: str, mine: RankFacts, deadline: float) -> list[RankFacts]:
    """Every rank's facts, polled until all of ``0..WORLD_SIZE-1`` have answered or ``deadline`` has passed."""
    got: dict[int, RankFacts] = {}
    while True:
        taken = int(store.add(key + "n", 0))
        for slot in range(1, taken + 1):
            if slot not in got and store.check([f"{key}slot/{slot}"]):
                got[slot] = _parse(store.get(f"{key}slot/{slot}"))
        if len(got) == taken:
            expected = max(f.world_size for f in [mine, *got.values()])
            if set(range(expected)) <= {f.rank for f in got.values()}:
                return list(got.values())
        if time.monotonic() >= deadline:
            return list(got.values())
        time.sleep(_POLL)


def _parse(raw: bytes) -> RankFacts:
    try:
        data = json.loads(raw)
    except ValueError:
        data = {}
    return RankFacts.from_dict(data if isinstance(data, dict) else {})


def _follow(store: Any, key: str, launch: Launch, mine: RankFacts, timeout: float, started: float, err: TextIO) -> int:
    """A rank other than 0: wait for rank 0 to appear (up to the timeout), then for its verdict."""
    if not _wait_until(lambda: store.check([key + "reporter"]), started + timeout - time.monotonic()):
        print(f"xccl doctor --world: rank {launch.rank}: rank 0 never answered within {timeout:g} s (it reports for "
              "the world): it did not start, crashed, or was given another MASTER_ADDR/MASTER_PORT. "
              + _summary(mine), file=err)
        return 1
    # Rank 0 stops waiting for the others at most `timeout` after it started, then prints: allow that, and more.
    if not _wait_until(lambda: store.check([key + "verdict"]), timeout + _ACK_WAIT):
        print(f"xccl doctor --world: rank {launch.rank}: rank 0 started but gave no verdict; see its output. "
              + _summary(mine), file=err)
        return 1
    code = int(store.get(key + "verdict"))
    store.add(key + "acks", 1)
    return code


def _wait_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + max(seconds, 0.0)
    while True:
        try:
            if done():
                return True
        except Exception:  # the store went away (its host exited): nothing more will arrive
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _summary(f: RankFacts) -> str:
    return (f"This rank: host {f.host}, plugin {f.plugin} ({f.plugin_dist}, {f.mode}), torch {f.torch}, "
            f"xccl {f.xccl}, WORLD_SIZE={f.world_size}" + (f"; problems: {'; '.join(f.problems)}" if f.problems else ""))


# ------------------------------------------------------------------------------------------------------ render


_COLUMNS: Final[tuple[tuple[str, Callable[[RankFacts], str]], ...]] = (
    ("host", lambda f: f.host),
    ("rank", lambda f: str(f.rank)),
    ("local", lambda f: str(f.local_rank)),
    ("pid", lambda f: str(f.pid)),
    ("plugin", lambda f: f.plugin + (" (sim)" if f.mode == "simulated" else "")),
    ("distribution", lambda f: f.plugin_dist),
    ("vendor", lambda f: f.vendor),
    ("device", lambda f: f.device),
    ("torch", lambda f: f.torch),
    ("xccl", lambda f: f.xccl),
    ("world", lambda f: str(f.world_size)),
    ("sdk", lambda f: ", ".join(f"{k} {v}" for k, v in sorted(f.sdk.items()) if "." not in k and v != "-") or "-"),
    ("rank table", lambda f: f.rank_table.get("entry", f.rank_table.get("error", "-"))),
    ("status", lambda f: f"{len(f.problems)} FAIL" if f.problems else "ok"),
)


def render_world(verdict: WorldVerdict) -> str:
    """One row per rank, grouped by host, then every difference, then the verdict."""
    hosts = verdict.hosts()
    lines = [f"xccl doctor --world: {len(verdict.ranks)} of {verdict.expected} ranks answered, on "
             f"{len(hosts)} host(s): " + "; ".join(f"{h} ({rank_list(r)})" for h, r in hosts.items()), ""]
    order = {h: i for i, h in enumerate(hosts)}
    rows = [[get(f) for _, get in _COLUMNS]
            for f in sorted(verdict.ranks, key=lambda f: (order[f.host], f.rank, f.pid))]
    rows += [["?", str(r), *["-"] * (len(_COLUMNS) - 3), "MISSING"] for r in verdict.missing]
    header = [name for name, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if verdict.differences:
        lines += ["", "differences"]
        lines += [f"  {MARK[d.status]}  {d.what}: {d}" if not d.summary else f"  {MARK[d.status]}  {d}"
                  for d in verdict.differences]
    flagged = [d.what for d in verdict.differences if d.status == "fail"]
    lines.append("")
    if flagged:
        lines.append(f"{len(flagged)} problem(s) across the world: {', '.join(dict.fromkeys(flagged))}")
    else:
        plugins = sorted({f.plugin for f in verdict.ranks})
        lines.append(f"all {len(verdict.ranks)} ranks agree: plugin {', '.join(map(repr, plugins))}, "
                     f"torch {verdict.ranks[0].torch}, xccl {verdict.ranks[0].xccl}")
    return "\n".join(lines)
