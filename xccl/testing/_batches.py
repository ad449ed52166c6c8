"""The conformance suite's batched rank runs: each batch body runs once per world size, on the suite's own rank
pools, and the per-op tests read its merged report (``xccl.testing.conformance``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import pytest

from xccl.plugin._capabilities import Collective

from ._pool import Outcome, RankPools

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
        cpu = target.simulate or target.plugin.device_type == "cpu"
        # A pool per world size, and one more for the runtime checks' environment: none is ever evicted.
        self._pools = RankPools(len(target.world_sizes) + 1, "forkserver" if cpu else "spawn")
        #: Per (kind, world size): every rank's outcome, or why the ranks did not run it.
        self._done: dict[tuple[str, int], list[Outcome] | str] = {}
        self._merged: dict[tuple[str, int], dict[str, dict[str, list[str]]]] = {}

    def close(self) -> None:
        """Stop every rank."""
        self._pools.close()

    def values(self, kind: str, world_size: int, body: Callable[..., Any], *args: Any, failed: str,
               env: Mapping[str, str] | None = None) -> list[Any]:
        """Every rank's return value of ``body(*args, progress)``, in rank order, run once per (kind, world size),
        on ranks with ``env`` added to the suite's environment; the test fails with ``failed`` and each failed
        rank's error when some rank raised or died."""
        key = (kind, world_size)
        if key not in self._done:
            if why := self.target.cannot_run(world_size):
                pytest.skip(why)
            progress = os.path.join(self.workdir, f"{kind}-{world_size}")
            try:
                pool = self._pools.get(world_size, {**self.target.env, **(env or {})}, **self.target.init_kwargs())
                self._done[key] = pool.run(body, *args, progress, timeout=_BATCH_TIMEOUT)
            except TimeoutError as exc:
                self._done[key] = f"{exc}. {_where(progress, world_size)}"
            except RuntimeError as exc:  # the pool failed to start: xccl.init raised on some rank
                self._done[key] = f"the {world_size} ranks could not start {self.target.mode}: {exc}"
        done = self._done[key]
        if isinstance(done, str):
            pytest.fail(done, pytrace=False)
        if bad := [o for o in done if not o.ok]:
            pytest.fail(f"{failed}:\n" + "\n".join(map(str, bad)), pytrace=False)
        return [o.value for o in done]

    def report(self, kind: str, world_size: int, body: Callable[..., Any], *args: Any) -> dict[str, dict[str, list[str]]]:
        """The per-op report of a batch body, merged over ranks: a label ran only if it ran on every rank."""
        key = (kind, world_size)
        if key not in self._merged:
            outs = self.values(kind, world_size, body, *args, failed="the batch failed on some ranks")
            self._merged[key] = _merge(outs)
        return self._merged[key]


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
