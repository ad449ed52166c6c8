"""The world's rendezvous: the store, and a check that every rank was told the same world, before any group.

``xccl.init`` makes the store itself (as torch's ``env://`` and ``tcp://`` handlers would, torchrun's agent store
included), and before the process group every rank publishes its :class:`~xccl.collectives._health._facts.Facts` and
compares its view of the world with the first rank's: a rank that differs, ranks that never arrive and a rank
started twice each get an error that names them on every rank, where torch would time out blaming nothing in
particular. One round of store operations on the success path (docs/multinode.md, "Nodes that disagree about the
world"; the keys are listed in ``xccl.collectives._health._liveness``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlparse

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from ..collectives._health._facts import VENDOR_FIELDS, WORLD, Facts, describe_ranks, parse_lines
from ..collectives._health._liveness import Liveness, look_wait, open_port, route_address
from ..collectives._islands import WorldMap, islands_of
from ..collectives._state import PROCESS
from ..errors import InitError, RendezvousTimeout
from ..ops._torch import TORCH
from ..plugin._fake_world import transport
from ..plugin._jobenv import JobEnv, job_env

__all__ = ["Endpoint", "check_world", "facts_of", "open_store", "rendezvous", "world_map"]

ROOT: Final = "xccl/world/"
#: The longest rank 0 keeps its store up, past its own deadline, for ranks that started later to time out too.
_LINGER: Final = 5.0


@dataclass(frozen=True)
class Endpoint:
    """Where the store runs, when xccl made it."""

    addr: str
    port: int
    #: Who runs it: ``"rank 0's process"`` or ``"torchrun's agent"``.
    hosted_by: str


def open_store(url: str, rank: int, size: int, timeout: _dt.timedelta) -> tuple[Any, Endpoint | None]:
    """The rendezvous store for ``url``, as torch's handler would make it, except that rank 0's server does not
    wait for its clients (the world check does, and knows whom it waits for). Other URLs (``file://``, queries)
    go to torch's handler; the Endpoint is then None.

    Raises:
        RuntimeError: what ``TCPStore`` raises (port in use, server unreachable): ``rendezvous_error`` explains it.
    """
    parsed = urlparse(url)
    if parsed.scheme == "env" and not parsed.query and not parsed.netloc:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    elif parsed.scheme == "tcp" and not parsed.query and parsed.hostname and parsed.port:
        addr, port = parsed.hostname, parsed.port
    else:
        store, _, _ = next(dist.rendezvous(url, rank, size, timeout=timeout))
        store.set_timeout(timeout)
        return store, None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
        # torchrun's agent on node 0 runs the server; every rank is a client (torch's _create_c10d_store).
        return dist.TCPStore(addr, port, size, is_master=False, timeout=timeout), Endpoint(addr, port,
                                                                                            "torchrun's agent")
    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"
    store = dist.TCPStore(addr, port, size, is_master=rank == 0, timeout=timeout, wait_for_workers=False,
                          multi_tenant=True, use_libuv=use_libuv)
    return store, Endpoint(addr, port, "rank 0's process")


def _xccl_version() -> str:
    try:
        return importlib.metadata.version("xccl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def facts_of(
    rank: int, size: int, local_rank: int, plugin: str, backend: str, simulate: bool, check: bool, fallback: str,
    endpoint: Endpoint | None, port: int, job: JobEnv | None = None, heterogeneous: bool = False,
) -> Facts:
    """This rank's Facts; ``port`` is its liveness port (0: none); ``job``: the launcher's (default
    :func:`~xccl.plugin.job_env`); ``heterogeneous``: the mixed-vendor switch."""
    job = job_env() if job is None else job
    addr = ""
    if endpoint is not None:
        with contextlib.suppress(OSError):
            addr, _ = route_address(endpoint.addr, endpoint.port)
    return Facts(
        rank=rank, world_size=size, local_rank=local_rank,
        local_world_size=-1 if job.local_world_size is None else job.local_world_size,
        node=-1 if job.node_rank is None else job.node_rank,
        plugin=plugin, backend=backend, simulate=simulate, check=check, fallback=fallback, xccl=_xccl_version(),
        torch=TORCH.version.split("+")[0], host=socket.gethostname(), addr=addr, port=port, pid=os.getpid(),
        heterogeneous=heterogeneous,
    )


def _on_store_host(facts: Facts, endpoint: Endpoint | None) -> bool:
    if endpoint is None:
        return False
    if endpoint.hosted_by.startswith("rank 0") and facts.rank == 0:
        return True
    # Rank 0's host, or torchrun's node 0, is MASTER_ADDR: the ranks whose own address it is run there.
    try:
        infos = socket.getaddrinfo(endpoint.addr, endpoint.port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return any(str(i[4][0]) == facts.addr for i in infos)


def check_world(store: Any, facts: Facts, endpoint: Endpoint | None, started: float, deadline: float
                ) -> tuple[str, list[Facts]]:
    """Publish ``facts`` in the rendezvous ``store`` (before torch's ``default_pg`` prefix) and wait, until
    ``deadline`` (``time.monotonic()``, like ``started``, when the rendezvous began), for every rank's; compare.

    Returns:
        The store prefix of this world's keys, and the Facts of the ranks on the store's host (``endpoint``).

    Raises:
        InitError: the ranks disagree about the world, or a rank was started twice.
        RendezvousTimeout: not every rank arrived by the deadline (the message names the missing ones).
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # One process per rank: a second process told the same RANK is refused (only it: the world may already run
    # with the first).
    me = f"{facts.host}|{facts.pid}"
    owner = store.compare_set(f"{ROOT}{restart}/owner/{facts.rank}", "", me).decode("utf-8", "replace")
    if owner != me:
        host, _, pid = owner.rpartition("|")
        raise InitError(
            f"rank {facts.rank} was started twice: here ({facts.where()}, pid {facts.pid}) and on {host} (pid "
            f"{pid}). Give every process its own RANK (torchrun does; check the launch script or the node ranks)"
        )
    # The n-th world of this rank in this store (a shutdown and a second init reuse a multi-tenant store).
    gen = store.add(f"{ROOT}{restart}/gen/{facts.rank}", 1)
    prefix = f"{ROOT}{restart}.{gen}"
    s = PrefixStore(prefix, store)
    try:
        _compare(s, facts, endpoint, started, deadline)
    except (InitError, RendezvousTimeout) as exc:
        with contextlib.suppress(RuntimeError):
            s.add("done", 1)
            if endpoint is not None and endpoint.hosted_by.startswith("rank 0") and facts.rank == 0:
                _linger(s, deadline, isinstance(exc, RendezvousTimeout))
        raise
    return prefix, parse_lines(s.get("storehost")) if s.check(["storehost"]) else []


def _compare(s: Any, facts: Facts, endpoint: Endpoint | None, started: float, deadline: float) -> None:
    mine, view = facts.encode(), facts.view()
    s.set(f"rank/{facts.rank}", mine)
    s.append("log", mine + "\n")
    if _on_store_host(facts, endpoint):
        s.append("storehost", mine + "\n")
    s.add("arrived", 1)
    ref = s.compare_set("ref", "", view)
    if ref != view.encode():
        _flag(s, facts, ref)
        raise _disagreement(s, facts, deadline)
    if s.add("count", 1) == facts.world_size:
        s.set(f"full/{facts.world_size}", "1")
    if not s.check(["bad"]):
        left = deadline - time.monotonic()
        if left <= 0:
            raise _missing(s, facts, endpoint, time.monotonic() - started)
        try:
            s.wait([f"full/{facts.world_size}"], _dt.timedelta(seconds=left))
        except dist.DistStoreError as exc:
            if s.check(["bad"]):
                raise _disagreement(s, facts, deadline) from None
            raise _missing(s, facts, endpoint, time.monotonic() - started) from exc
    if s.check(["bad"]):
        raise _disagreement(s, facts, deadline)


def _linger(s: Any, deadline: float, timed_out: bool) -> None:
    """Keep rank 0's store up until the other ranks that came have failed too (each reads it to say why): until
    as many have said so as arrived, at most until the deadline (after a timeout, a little past it: the others'
    deadlines count from their own start)."""
    until = max(deadline, time.monotonic() + 1.0) + (_LINGER if timed_out else 0.0)
    step = 0.01
    while s.add("done", 0) < s.add("arrived", 0) and time.monotonic() < until:
        time.sleep(step)
        step = min(step * 2, 0.2)


def _settle(s: Any, deadline: float) -> dict[int, Facts]:
    """Every rank's Facts, once all ranks of the smallest world any rank was told have arrived (those exist in
    any launch), or by the deadline: a disagreement is reported with every rank's side of it."""
    seen, arrived = -1, _arrived(s)
    step = 0.01
    while time.monotonic() < deadline:
        count = s.add("arrived", 0)
        if count != seen:
            seen, arrived = count, _arrived(s)
            want = min(f.world_size for f in arrived.values()) if arrived else 0
            if all(r in arrived for r in range(want)):
                break
        time.sleep(step)
        step = min(step * 2, 0.1)
    return arrived


def _flag(s: Any, facts: Facts, ref: bytes) -> None:
    """Mark the world bad and wake every rank waiting for it to fill: each waits on its own size's key, this rank's
    or the WORLD_SIZE of the first rank's view ``ref`` (its first field)."""
    s.set("bad", str(facts.rank))
    sizes = {facts.world_size}
    with contextlib.suppress(ValueError, IndexError, TypeError, KeyError):
        if type(size := json.loads(ref)[0]) is int:
            sizes.add(size)
    for n in sizes:
        s.set(f"full/{n}", "1")


def _arrived(s: Any) -> dict[int, Facts]:
    return {f.rank: f for f in parse_lines(s.get("log"))} if s.check(["log"]) else {}


def _disagreement(s: Any, facts: Facts, deadline: float) -> InitError:
    """The InitError saying, for each field the ranks differ on, which ranks hold each value."""
    arrived = _settle(s, deadline)
    arrived[facts.rank] = facts
    # In a mixed-vendor world (every rank switched) each rank's plugin is its own: not a difference to report.
    mixed = all(f.heterogeneous for f in arrived.values())
    differ = [(name, label) for name, label in WORLD
              if not (mixed and name in VENDOR_FIELDS) and len({getattr(f, name) for f in arrived.values()}) > 1]
    groups: dict[tuple[str, ...], list[int]] = {}
    for f in arrived.values():
        groups.setdefault(tuple(_shown(getattr(f, name)) for name, _ in differ), []).append(f.rank)
    labels = [label for _, label in differ]
    fields = " and ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 1 else labels)
    held = "; ".join(f"{describe_ranks(rs, arrived)} {'has' if len(rs) == 1 else 'have'} {', '.join(values)}"
                     for values, rs in sorted(groups.items(), key=lambda kv: min(kv[1])))
    what = (f"They differ in {fields}: {held}" if differ else
            "The ranks that arrived agree, but another rank found a difference")
    return InitError(
        f"rank {facts.rank}: the ranks were not told the same world (checked at xccl.init, before any process "
        f"group; {len(arrived)} ranks compared). {what}. Launch every node with the same WORLD_SIZE "
        "(--nnodes x --nproc-per-node), the same XCCL_VENDOR / XCCL_SIMULATE / XCCL_CHECK / XCCL_HETEROGENEOUS "
        "settings (a mixed-vendor world: XCCL_HETEROGENEOUS=1 on every rank), and the same "
        "torch and xccl versions (xccl doctor --world shows what each rank has)"
    )


def _shown(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _missing(s: Any, facts: Facts, endpoint: Endpoint | None, waited: float) -> RendezvousTimeout:
    arrived = _arrived(s)
    arrived[facts.rank] = facts
    missing = [r for r in range(facts.world_size) if r not in arrived]
    here = describe_ranks(sorted(arrived), arrived)
    per_node = {f.local_world_size for f in arrived.values()}
    nodes = ""
    if len(per_node) == 1 and (n := next(iter(per_node))) > 0 and all(
            f.node in (-1, f.rank // n) for f in arrived.values()):
        ids = sorted({r // n for r in missing})
        nodes = f" (with {n} ranks per node: node{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))})"
    if not missing:  # every rank's record is there: the wait for the last key, not a rank, ran out of time
        return _check_ran_out(facts, None, waited)
    store = f"{endpoint.addr}:{endpoint.port}" if endpoint is not None else "the store"
    who = f"rank {missing[0]}{nodes} did" if len(missing) == 1 else f"ranks {missing}{nodes} did"
    return RendezvousTimeout(
        f"{who} not arrive; {len(arrived)} of {facts.world_size} did: {here}. The missing ranks were not "
        f"started, crashed while starting, or cannot reach the rendezvous store at {store} "
        f"(MASTER_ADDR:MASTER_PORT); also check that WORLD_SIZE ({facts.world_size} here) is right",
        rank=facts.rank, world_size=facts.world_size, elapsed=waited,
    )


def _check_ran_out(facts: Facts, setup: _dt.timedelta | None, waited: float) -> RendezvousTimeout:
    """The error when every rank arrived but the world check did not finish in time (a slow store or machine)."""
    limit = f" ({setup.total_seconds():g} s)" if setup is not None else ""
    return RendezvousTimeout(
        f"every rank arrived ({facts.world_size} of {facts.world_size}), but the world check did not finish within "
        f"the setup timeout{limit}: the store or the machine was too slow (a loaded machine, a slow network). Raise "
        "it with xccl.init(setup_timeout=...) or XCCL_SETUP_TIMEOUT=<seconds>",
        rank=facts.rank, world_size=facts.world_size, elapsed=waited,
    )


def rendezvous(
    url: str, rank: int, size: int, local_rank: int, timeout: _dt.timedelta, *, plugin: str, backend: str,
    simulate: bool, check: bool, fallback: str, started: float, job: JobEnv | None = None, heterogeneous: bool = False,
    setup: _dt.timedelta | None = None,
) -> tuple[Any, Liveness | None]:
    """The store for ``init_process_group`` once every rank has arrived and agrees, and this rank's
    :class:`~xccl.collectives._health._liveness.Liveness` (None for a world of one, or a store xccl did not make).
    The store and the world check wait ``setup`` (default ``timeout``) for every rank; ``timeout`` is the
    collective timeout (the liveness probes' pace).

    With ``heterogeneous`` the ranks may differ in plugin, backend and simulation; every rank's Facts then give
    the world's map (:func:`world_map`), kept in ``PROCESS.world_map``.

    Raises:
        InitError, RendezvousTimeout: see :func:`check_world`.
        RuntimeError: the store could not be made (``rendezvous_error`` explains it).
    """
    if not transport().waits:
        # Nobody else will arrive: a local store for xccl's own keys, no world check, no liveness port.
        return dist.HashStore(), None
    t = time.perf_counter()
    setup = timeout if setup is None else setup
    store, endpoint = open_store(url, rank, size, setup)
    t = PROCESS.lap("store", t)
    if heterogeneous and endpoint is None and size > 1:
        raise InitError(f"a mixed-vendor world (heterogeneous) needs xccl's own rendezvous, where every rank's "
                        f"vendor is published: use env:// (torchrun) or tcp://host:port, not {url!r}")
    if heterogeneous and size == 1:
        PROCESS.world_map = islands_of([(rank, plugin, backend, socket.gethostname())])
    if endpoint is None or size == 1:
        return store, None
    try:
        _, family = route_address(endpoint.addr, endpoint.port)
        sock = open_port(family)
    except OSError:
        sock = None  # no liveness port: faults will not name the lost ranks, everything else works
    t = PROCESS.lap("liveness port", t)
    try:
        port = sock.getsockname()[1] if sock is not None else 0
        facts = facts_of(rank, size, local_rank, plugin, backend, simulate, check, fallback, endpoint, port, job,
                         heterogeneous)
        try:
            prefix, peers = check_world(store, facts, endpoint, started, started + setup.total_seconds())
            if heterogeneous:
                PROCESS.world_map = world_map(store, prefix, size)
        except dist.DistStoreError as exc:  # a store read of the check itself ran out of time
            raise _check_ran_out(facts, setup, time.monotonic() - started) from exc
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    PROCESS.lap("world check", t)
    # The process group's keys go under this world's prefix too. torchrun's agent shares its store with the
    # workers and keeps it across restarts: without a prefix per start, a restarted rank reads its peers' gloo
    # addresses from the start before and fails to connect ("Connection refused"; torch's own env:// handler
    # fails the same way on 2.13, pytorch/pytorch#167288). A second world in a multi-tenant store (shutdown, then
    # init again) is kept apart the same way.
    pg_store = PrefixStore(f"{prefix}/pg", store)
    if sock is None:
        return pg_store, None
    return pg_store, Liveness(sock, rank, (endpoint.addr, endpoint.port), prefix, endpoint.hosted_by, peers,
                              look_wait(timeout))


def world_map(store: Any, prefix: str, size: int) -> WorldMap:
    """The world's map from every rank's Facts under ``prefix`` (after :func:`check_world`: all have arrived);
    one store read, the same record on every rank."""
    log = parse_lines(PrefixStore(prefix, store).get("log"))
    seen = {f.rank: f for f in log}
    if sorted(seen) != list(range(size)):  # pragma: no cover - check_world waited for every rank
        raise InitError(f"the world map lacks ranks {sorted(set(range(size)) - set(seen))}")
    return islands_of((f.rank, f.plugin, f.backend, f.host) for f in seen.values())
