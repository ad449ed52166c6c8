"""The conformance suite's batched rank runs: each batch body runs once per world size, on the suite's own rank
pools, and the per-op tests read its merged report (``xccl.testing.conformance``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import pytest

from xccl.plugin._capabilities import Collective

from ._pool import Outcome, RankPool

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["Batches"]

#: How long one batch body may run on its ranks.
_BATCH_TIMEOUT: Final = 300.0


class Batches:
    """Runs each batch body once per world size and remembers the merged report, or the failure, so that the
    per-op tests read it instead of running (or hanging) again.

    The suite keeps its own rank pools (one per world size, closed with the suite) rather than the session's
    ``rank_pools``: its ranks are initialised for one plugin and would only evict the pools other tests share.
    CPU and simulated ranks fork from a server that imported torch once (a pool starts in a second instead of
    several); ranks on a real accelerator are spawned, since a vendor runtime need not survive a fork.
    """

    def __init__(self, target: Target, workdir: str) -> None:
        self.target = target
        self.workdir = workdir
        self._pools: dict[tuple[int, tuple[tuple[str, str], ...]], RankPool] = {}
        self._done: dict[tuple[str, int], dict[str, dict[str, list[str]]] | list[Outcome] | str] = {}

    def _pool(self, world_size: int, env: Mapping[str, str] | None = None) -> RankPool:
        why = self.target.cannot_run(world_size)
        if why:
            pytest.skip(why)
        key = (world_size, tuple(sorted((env or {}).items())))
        pool = self._pools.get(key)
        if pool is None:
            cpu = self.target.simulate or self.target.plugin.device_type == "cpu"
            pool = self._pools[key] = RankPool(
                world_size, self.target.init_kwargs(), {**self.target.env, **(env or {})},
                start_method="forkserver" if cpu else "spawn",
            )
        if not pool.alive:
            pool.start()
        return pool

    def close(self) -> None:
        """Stop every rank."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def outcomes(self, kind: str, world_size: int, body: Callable[..., Any], *args: Any,
                 env: Mapping[str, str] | None = None) -> list[Outcome]:
        """Every rank's outcome of ``body(*args, progress)``, run once per (kind, world size), on ranks with
        ``env`` added to the suite's environment."""
        key = (kind, world_size)
        if key not in self._done:
            progress = os.path.join(self.workdir, f"{kind}-{world_size}")
            try:
                pool = self._pool(world_size, env)
                self._done[key] = pool.run(body, *args, progress, timeout=_BATCH_TIMEOUT)
            except TimeoutError as exc:
                self._done[key] = f"{exc}. {_where(progress, world_size)}"
            except RuntimeError as exc:  # the pool failed to start: xccl.init raised on some rank
                self._done[key] = f"the {world_size} ranks could not start {self.target.mode}: {exc}"
        done = self._done[key]
        if isinstance(done, str):
            pytest.fail(done, pytrace=False)
        return done  # type: ignore[return-value]

    def report(self, kind: str, world_size: int, body: Callable[..., Any], *args: Any) -> dict[str, dict[str, list[str]]]:
        """The per-op report of a batch body, merged over ranks: a label ran only if it ran on every rank."""
        key = (f"{kind}:merged", world_size)
        if key not in self._done:
            outs = self.outcomes(kind, world_size, body, *args)
            bad = [o for o in outs if not o.ok]
            if bad:
                self._done[key] = "the batch failed on some ranks:\n" + "\n".join(map(str, bad))
            else:
                self._done[key] = _merge([o.value for o in outs])
        done = self._done[key]
        if isinstance(done, str):
            pytest.fail(done, pytrace=False)
        return done  # type: ignore[return-value]


def _where(progress: str, world_size: int) -> str:
    lines = []
    for r in range(world_size):
        try:
            with open(f"{progress}.{r}", encoding="utf-8") as f:
                lines.append(f"rank {r} was in: {f.read()}")
        except OSError:
            continue
    return "; ".join(lines) if lines else "no rank reported what it was doing"


def _merge(reports: list[dict[str, dict[str, list[str]]]]) -> dict[str, dict[str, list[str]]]:
    merged: dict[str, dict[str, list[str]]] = {}
    for op in Collective:
        per_rank = [rep[op.value] for rep in reports]
        ran = [label for label in per_rank[0]["ran"] if all(label in p["ran"] for p in per_rank)]
        by_message: dict[str, list[int]] = {}
        for r, p in enumerate(per_rank):
            for msg in p["failures"]:
                by_message.setdefault(msg, []).append(r)
        # The same failure on every rank is one line, not one per rank.
        failures = [f"{'every rank' if len(rs) == len(per_rank) > 1 else _ranks(rs)}: {msg}"
                    for msg, rs in by_message.items()]
        merged[op.value] = {
            "ran": ran,
            "refused": per_rank[0]["refused"],
            "skipped": per_rank[0]["skipped"],
            "failures": failures,
        }
    return merged


def _ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
