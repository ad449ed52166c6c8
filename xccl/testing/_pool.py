"""A pool of live rank processes that run many test bodies over one real process group.

Spawning a rank costs seconds (importing torch), so a pool starts ``world_size`` processes once, each calls
``xccl.init`` over a real TCP rendezvous on loopback, and then runs test bodies sent to it: ``pool.run(fn, *args)``
calls ``fn(*args)`` on every rank at once and returns each rank's :class:`Outcome`. Every wait has a timeout: a
body that hangs on any rank kills the pool (the next ``run`` starts a fresh one) and raises ``TimeoutError``
naming the silent ranks.

Bodies must be picklable by reference (module-level functions). Exceptions come back as :class:`Outcome` with the
exception's class names, message and public attributes, since xccl's typed errors do not round-trip through
pickle.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

__all__ = ["Outcome", "RankPool", "RankPools", "all_here", "free_port"]


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@final
@dataclass(frozen=True)
class Outcome:
    """What one rank's body did: its return value, or the exception it raised, or that it died."""

    rank: int
    ok: bool
    value: Any = None
    #: Names of the exception's classes, most derived first (e.g. ``["InvalidArgument", "XcclError", ...]``).
    error_types: tuple[str, ...] = ()
    message: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    traceback: str = ""
    elapsed: float = 0.0

    def raised(self, exc_type: type[BaseException] | str) -> bool:
        """Whether the body raised ``exc_type`` (or a subclass of it)."""
        name = exc_type if isinstance(exc_type, str) else exc_type.__name__
        return not self.ok and name in self.error_types

    def __str__(self) -> str:
        if self.ok:
            return f"rank {self.rank}: ok {self.value!r}"
        return f"rank {self.rank}: {self.error_types[0] if self.error_types else '?'}: {self.message}\n{self.traceback}"


def all_here(tag: str, timeout: float = 300.0) -> None:
    """Wait until every rank of the world has called ``all_here(tag)``: a barrier in the world's store, bounded by
    ``timeout`` (generous), not by the collective timeout.

    For a body that runs a short collective timeout on purpose (to provoke a fault quickly): on a loaded machine
    the ranks reach it seconds apart (imports, DDP's or FSDP2's first construction), and without this the first
    collective would time out on the early ones before the fault the test is about. Each tag is used once per world.
    """
    import datetime

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    if store.add(f"xccl.testing/{tag}/here", 1) == dist.get_world_size():
        store.set(f"xccl.testing/{tag}/all", "1")
    store.wait([f"xccl.testing/{tag}/all"], datetime.timedelta(seconds=timeout))


def _describe(rank: int, exc: BaseException, elapsed: float) -> Outcome:
    names = tuple(c.__name__ for c in type(exc).__mro__)
    plain = (str, int, float, bool, tuple, list, dict, type(None))
    attrs = {k: v for k, v in vars(exc).items() if not k.startswith("_") and isinstance(v, plain)}
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Outcome(rank, False, None, names, str(exc), attrs, tb, elapsed)


def _worker(
    rank: int,
    world_size: int,
    port: int,
    init_kwargs: dict[str, Any],
    env: dict[str, str],
    tasks: Any,
    results: Any,
) -> None:
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    import torch

    torch.set_num_threads(1)
    import xccl

    try:
        xccl.init(**init_kwargs)
    except BaseException as exc:  # reported to the parent, which fails the test with it
        results.put(("init", _describe(rank, exc, 0.0)))
        return
    results.put(("init", Outcome(rank, True)))
    while True:
        item = tasks.get()
        if item is None:
            break
        seq, fn, args, kwargs = item
        started = time.monotonic()
        try:
            value = fn(*args, **kwargs)
            out = Outcome(rank, True, value, elapsed=time.monotonic() - started)
        except BaseException as exc:  # every failure goes back to the parent
            out = _describe(rank, exc, time.monotonic() - started)
        try:
            results.put((seq, out))
        except Exception as exc:  # e.g. an unpicklable return value
            results.put((seq, _describe(rank, exc, 0.0)))
    with contextlib.suppress(Exception):
        xccl.shutdown()


class RankPool:
    """``world_size`` live rank processes, each initialised with ``xccl.init(**init_kwargs)``.

    Args:
        world_size: number of ranks.
        init_kwargs: keyword arguments for ``xccl.init`` in every rank.
        env: extra environment variables for the ranks (e.g. ``{"XCCL_SIMULATE": "sophgo"}``).
        rank_env: more for single ranks, over ``env`` (rank -> variables): a mixed-vendor world gives each rank
            its own ``XCCL_SIMULATE``.
        start_timeout: seconds to wait for every rank to initialise.
        start_method: ``"spawn"``, or ``"forkserver"``: ranks forked from a server that imported torch and xccl
            once, so a pool starts in a fraction of a second (for tests that kill ranks and need fresh pools).
    """

    def __init__(
        self,
        world_size: int,
        init_kwargs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
        start_method: str = "spawn",
        rank_env: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        self.world_size = world_size
        self.init_kwargs = dict(init_kwargs or {})
        self.env = dict(env or {})
        self.rank_env = {r: dict(v) for r, v in (rank_env or {}).items()}
        self.start_timeout = start_timeout
        self.start_method = start_method
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._seq = 0

    @property
    def alive(self) -> bool:
        """Whether every rank process is running."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> None:
        """Spawn the ranks and wait until each has initialised (raises on any failure)."""
        self.close()
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload(["torch", "xccl"])
        port = free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(  # type: ignore[attr-defined]
                target=_worker,
                args=(r, self.world_size, port, self.init_kwargs, {**self.env, **self.rank_env.get(r, {})},
                      self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        outs = self._collect("init", self.start_timeout)
        bad = [o for o in outs if not o.ok]
        if bad:
            self.close()
            raise RuntimeError("rank pool failed to start:\n" + "\n".join(map(str, bad)))

    def _collect(self, seq: Any, timeout: float) -> list[Outcome]:
        got: dict[int, Outcome] = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world_size:
            try:
                s, out = self._results.get(timeout=0.2)
                if s == seq:
                    got[out.rank] = out
                continue
            except queue.Empty:
                pass
            # Only once the queue is drained: a rank that died will never answer.
            for r, p in enumerate(self._procs):
                if r not in got and not p.is_alive():
                    got[r] = Outcome(r, False, error_types=("RankDied",), message=f"exit code {p.exitcode}")
            if time.monotonic() > deadline and len(got) < self.world_size:
                silent = [r for r in range(self.world_size) if r not in got]
                self.close()
                raise TimeoutError(f"ranks {silent} did not answer within {timeout:.0f}s; the pool was killed")
        return [got[r] for r in range(self.world_size)]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any) -> list[Outcome]:
        """Run ``fn(*args, **kwargs)`` on every rank; each rank's :class:`Outcome`, in rank order.

        Raises:
            TimeoutError: some rank neither answered nor died within ``timeout`` (the pool is killed).
        """
        if not self.alive:
            self.start()
        self._seq += 1
        for q in self._tasks:
            q.put((self._seq, fn, args, kwargs))
        return self._collect(self._seq, timeout)

    def run_ok(self, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any) -> list[Any]:
        """Like :meth:`run`, but raise ``AssertionError`` with every rank's traceback unless all succeeded."""
        outs = self.run(fn, *args, timeout=timeout, **kwargs)
        bad = [o for o in outs if not o.ok]
        if bad:
            raise AssertionError("body failed on some ranks:\n" + "\n".join(map(str, bad)))
        return [o.value for o in outs]

    def close(self) -> None:
        """Stop the ranks (politely, then by force)."""
        for q in self._tasks:
            with contextlib.suppress(Exception):
                q.put(None)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs, self._tasks = [], []

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankPools:
    """Pools keyed by configuration; at most ``keep`` pools stay alive (2 cores do not run many ranks).

    By default ranks fork from a server that imported torch and xccl once: spawning each rank re-imports torch (3 s
    of CPU), which was half the CPU time of the test files that share pools. The server never touches a device,
    so a rank still initialises its accelerator (or the vendor's SDK) itself, after the fork.
    """

    def __init__(self, keep: int = 2, start_method: str = "forkserver") -> None:
        self.keep = keep
        self.start_method = start_method
        self._pools: dict[tuple[Any, ...], RankPool] = {}

    def get(self, world_size: int, env: Mapping[str, str] | None = None, **init_kwargs: Any) -> RankPool:
        """A started pool of ``world_size`` ranks initialised with ``xccl.init(**init_kwargs)`` and ``env``."""
        key = (world_size, tuple(sorted((env or {}).items())), tuple(sorted(init_kwargs.items())))
        pool = self._pools.pop(key, None)
        if pool is None:
            while len(self._pools) >= self.keep:
                self._pools.pop(next(iter(self._pools))).close()
            pool = RankPool(world_size, init_kwargs, env, start_method=self.start_method)
        self._pools[key] = pool  # most recently used last
        if not pool.alive:
            pool.start()
        return pool

    def close(self) -> None:
        """Stop every pool."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
