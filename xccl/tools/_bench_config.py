"""``xccl bench``'s vocabulary: the ops it runs, nccl-tests' bus-bandwidth factors, sizes and the configuration.

Nothing here communicates; the measuring is in :mod:`._bench_measure`, the buffers and calls per op in
:mod:`._bench_ops`, the table and plot in :mod:`._bench_report`, and the launcher in :mod:`._bench`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from ..ops._specs import SPECS
from ..plugin._capabilities import ALL_DTYPES, Collective

__all__ = [
    "BUSBW_FACTORS",
    "DTYPES",
    "OPS",
    "BenchConfig",
    "BenchError",
    "busbw_factor",
    "human_size",
    "parse_size",
    "sweep_sizes",
]

C = Collective

#: Every op ``xccl bench`` runs (``sendrecv``: each rank sends to the next and receives from the previous;
#: ``gather_any``: a receive from any source), and the capability-table entry that decides how it runs.
COLLECTIVE: Final[dict[str, Collective]] = {
    **{str(key): key for key in (
        C.ALL_REDUCE, C.ALL_GATHER, C.ALL_GATHER_INTO_TENSOR, C.ALL_GATHER_INTO_TENSOR_UNEVEN, C.REDUCE_SCATTER,
        C.REDUCE_SCATTER_TENSOR, C.REDUCE_SCATTER_TENSOR_UNEVEN, C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE,
        C.ALL_TO_ALL_SINGLE_UNEVEN, C.ALL_TO_ALL_V, C.GATHER, C.SCATTER, C.BROADCAST, C.REDUCE)},
    "sendrecv": C.SEND, "gather_any": C.RECV_ANY_SOURCE,
    **{str(key): key for key in (C.ALL_REDUCE_COALESCED, C.ALL_GATHER_COALESCED, C.BARRIER, C.MONITORED_BARRIER)},
}
#: nccl-tests' bus-bandwidth factor per bench op, as a function of the world size n (the specs' ``bus``; the
#: point-to-point ops move their bytes once).
BUSBW_FACTORS: Final[dict[str, Callable[[int], float]]] = {
    op: SPECS[key].bus_factor if op not in ("sendrecv", "gather_any") else (lambda n: 1.0)
    for op, key in COLLECTIVE.items()
}
OPS: Final = tuple(COLLECTIVE)

DTYPES: Final = {str(d).removeprefix("torch."): d for d in ALL_DTYPES}

#: Fewest rounds per size by default when ``time_per_size`` shortens the sweep of the large sizes: with fewer, the
#: 95% confidence interval of a median spans most of the samples (at 30 it spans the 10th to the 21st of 30).
MIN_ROUNDS: Final = 30


class BenchError(Exception):
    """A bench configuration that cannot run (bad size, unknown op, missing plugin): the message says why."""


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` at world size ``n``."""
    return BUSBW_FACTORS[op](n)


#: Binary unit suffixes, upper-cased (``K``, ``KB`` and ``KiB`` alike).
_UNITS: Final = {"": 1, "B": 1, **{p + s: 1 << 10 * i for i, p in enumerate("KMG", 1) for s in ("", "B", "IB")}}


def parse_size(text: str | int) -> int:
    """``"64M"``, ``"4K"``, ``"4"``, ``"1.5MiB"`` -> bytes (binary units, as nccl-tests' ``-b``/``-e``)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if m is None or m.group(2).upper() not in _UNITS:
        raise BenchError(f"size {text!r} is not a number of bytes with an optional K, M or G suffix (e.g. 64M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """``min_bytes, min_bytes*factor, ...`` up to ``max_bytes`` inclusive."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise BenchError(f"sizes must satisfy 1 <= min ({min_bytes}) <= max ({max_bytes})")
    if factor <= 1 and max_bytes != min_bytes:
        raise BenchError(f"the step factor must be > 1, got {factor}")
    out, size = [], float(min_bytes)
    while size <= max_bytes:
        out.append(int(size))
        if factor <= 1:
            break
        size *= factor
    return out


def human_size(n: int) -> str:
    """``67108864`` -> ``"64 MiB"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


@final
@dataclass(frozen=True)
class BenchConfig:
    """Everything one ``xccl bench`` run needs; picklable, sent to every rank."""

    ops: tuple[str, ...] = ("all_reduce",)
    plugin: str = "auto"
    simulate: bool = False
    nproc: int = 2
    min_bytes: int = 4
    max_bytes: int = 64 << 20
    factor: float = 2.0
    dtype: str = "float32"
    #: Timed rounds per size (with ``time_per_size``: the most).
    iters: int = 20
    warmup: int = 5
    #: Calls per timed sample (1: time every call; more on GPUs, where a sync per call would dominate).
    batch: int = 1
    compare_raw: bool = False
    #: With ``compare_raw``: time the raw call twice per round, the second as an A/A control whose ratio to the
    #: first shows how far the machine's noise alone moves a ratio.
    control: bool = False
    #: With ``compare_raw``: xccl's calls run on the raw calls' group (the vendor's own, which xccl adopts), so that
    #: the two differ only by the layer above the communicator; False: on xccl's world, a communicator of its own,
    #: whose luck with the scheduler on a loaded machine then enters the ratio (measured here: 2 to 10%).
    same_group: bool = True
    #: Sweep the sizes this many times, each pass running its share of every size's rounds, so that a burst of
    #: load from elsewhere is spread over the sizes instead of falling on one.
    passes: int = 1
    #: Seconds of timed calls to aim for per size (0: exactly ``iters`` rounds): the rounds at a size are what fits,
    #: between ``min_iters`` and ``iters``, from the warm-up's per-call time (the slowest rank's).
    time_per_size: float = 0.0
    #: With ``time_per_size``: the fewest rounds per size, however long its calls.
    min_iters: int = MIN_ROUNDS
    #: Microseconds of idle before each timed call (0: back to back): above 0 each call is timed as a training step
    #: issues it, after a barrier and this gap (docs/cli.md, ``--gap-us``: back-to-back calls cost less).
    gap_us: float = 0.0
    #: With ``gap_us``: spend the gap in a busy loop on this rank's core (a step's forward pass) instead of
    #: sleeping, so that the communicator's threads wait for a core as they do inside a step.
    gap_busy: bool = False
    #: Show a one-line progress counter on stderr (rank 0).
    progress: bool = False
    #: Print the table on stdout (rank 0).
    table: bool = True
    #: Collective and rendezvous timeout in seconds.
    timeout: float = 120.0
    #: Intra-op threads per rank (default: the cores divided among the ranks).
    threads: int | None = None

    def check(self) -> None:
        """Raise :class:`BenchError` for a configuration that cannot run."""
        bad = [op for op in self.ops if op not in OPS]
        for wrong, why in (
            (bad, f"unknown op(s) {', '.join(bad)}; choose from: {', '.join(OPS)} (or 'all')"),
            (self.dtype not in DTYPES, f"unknown dtype {self.dtype!r}; choose from: {', '.join(DTYPES)}"),
            (self.nproc < 1, f"--nproc must be >= 1, got {self.nproc}"),
            (self.iters < 1 or self.warmup < 0 or self.batch < 1, "--iters and --batch must be >= 1 and --warmup >= 0"),
            (not 1 <= self.passes <= self.iters,
             f"--passes must be between 1 and --iters ({self.iters}), got {self.passes}"),
            (self.time_per_size < 0, f"--time-per-size must be >= 0 seconds, got {self.time_per_size}"),
            (self.min_iters < 1, f"--min-iters must be >= 1, got {self.min_iters}"),
            (self.gap_us < 0, f"--gap-us {self.gap_us}: must be 0 (back to back) or a positive number of microseconds"),
            (self.gap_busy and self.gap_us <= 0, "--gap-busy is what the gap does: pass --gap-us too"),
            (self.gap_us > 0 and self.batch != 1, "--gap-us times calls one at a time: drop --batch"),
            (self.control and not self.compare_raw, "--aa-control is a control for --compare-raw: pass both"),
            (self.simulate and self.plugin == "auto", "--simulate needs a plugin: --plugin sophgo --simulate"),
        ):
            if wrong:
                raise BenchError(why)
        sweep_sizes(self.min_bytes, self.max_bytes, self.factor)
