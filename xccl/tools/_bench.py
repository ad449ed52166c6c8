"""``xccl bench``: an nccl-tests-style sweep of one or more collectives through xccl.

:func:`launch` starts ``nproc`` local ranks (``torch.multiprocessing`` spawn, rendezvous over ``env://`` on
127.0.0.1 with a free port), each calls ``xccl.init`` with the chosen plugin and runs the sweep; rank 0 prints
the table as it goes and hands the results back to the launching process as JSON.

What is measured, per op and message size:

* ``size``/``count`` follow nccl-tests: the bytes of the whole buffer the op is named after (the gathered output
  of all_gather, the full input of reduce_scatter, one rank's send buffer of all_to_all);
* ``time`` is the median over iterations of the slowest rank's time for one call (each rank times every call;
  the per-call maximum over ranks is taken, then the median over calls);
* ``algbw = size / time`` and ``busbw = algbw * factor`` with nccl-tests' bus-bandwidth factors
  (``doc/PERFORMANCE.md``): all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all, gather, scatter
  ``(n-1)/n``; broadcast, reduce, send/recv ``1``. Bandwidths are in GB/s (1e9 bytes per second).

With ``compare_raw`` every size also runs the plain ``torch.distributed`` call (or, for xccl's uneven ops, the
plain ``torch.distributed`` way of doing the same), interleaved with xccl's call by call (alternating which goes
first), so that a noisy shared machine slows both alike; ``ratio`` is xccl's busbw over raw's (1.0: the same,
below 1: xccl slower), taken as the median over rounds of raw's time over xccl's in the same round.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Final, TextIO, final

import torch

from ..plugin._capabilities import ALL_DTYPES, Collective

__all__ = [
    "BUSBW_FACTORS",
    "OPS",
    "BenchConfig",
    "BenchError",
    "busbw_factor",
    "format_row",
    "launch",
    "parse_size",
    "sweep_sizes",
]

C = Collective

#: nccl-tests' bus-bandwidth factor per op, as a function of the world size n.
BUSBW_FACTORS: Final[dict[str, Callable[[int], float]]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "all_gather_into_tensor_uneven": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor_uneven": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "all_to_all_single_uneven": lambda n: (n - 1) / n,
    "all_to_all_v": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "gather_any": lambda n: 1.0,
    "all_reduce_coalesced": lambda n: 2 * (n - 1) / n,
    "all_gather_coalesced": lambda n: (n - 1) / n,
    "barrier": lambda n: 0.0,
}

#: Every op ``xccl bench`` runs (``sendrecv``: each rank sends to the next and receives from the previous).
OPS: Final = tuple(BUSBW_FACTORS)

#: The capability-table entry that decides how each bench op runs.
_COLLECTIVE: Final = {op: C(op) for op in OPS if op not in ("sendrecv", "gather_any")} | {
    "sendrecv": C.SEND, "gather_any": C.RECV_ANY_SOURCE}

DTYPES: Final = {str(d).removeprefix("torch."): d for d in ALL_DTYPES}


class BenchError(Exception):
    """A bench configuration that cannot run (bad size, unknown op, missing plugin): the message says why."""


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` at world size ``n``."""
    return BUSBW_FACTORS[op](n)


_UNITS: Final = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


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
    iters: int = 20
    warmup: int = 5
    #: Calls per timed sample (1: time every call; more on GPUs, where a sync per call would dominate).
    batch: int = 1
    compare_raw: bool = False
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
        if bad:
            raise BenchError(f"unknown op(s) {', '.join(bad)}; choose from: {', '.join(OPS)} (or 'all')")
        if self.dtype not in DTYPES:
            raise BenchError(f"unknown dtype {self.dtype!r}; choose from: {', '.join(DTYPES)}")
        if self.nproc < 1:
            raise BenchError(f"--nproc must be >= 1, got {self.nproc}")
        if self.iters < 1 or self.warmup < 0 or self.batch < 1:
            raise BenchError("--iters and --batch must be >= 1 and --warmup >= 0")
        if self.simulate and self.plugin == "auto":
            raise BenchError("--simulate needs a plugin: --plugin sophgo --simulate")
        sweep_sizes(self.min_bytes, self.max_bytes, self.factor)


# ------------------------------------------------------------------------------------------------------ cases


@dataclass
class Case:
    """One op at one size on this rank: the xccl call, the raw torch.distributed call, and the accounting."""

    size: int
    count: int
    run: Callable[[], Any]
    raw: Callable[[], Any] | None
    #: What the raw variant calls (``dist.all_reduce``), for the header and JSON.
    raw_name: str = ""
    #: Keeps the buffers alive.
    buffers: list[Any] = field(default_factory=list)


def _uneven_unit(elems: int, n: int) -> int:
    """Rows per unit for the uneven patterns (rank j holds ``unit*(j+1)``): the total stays near ``elems``."""
    return max(1, elems // (n * (n + 1) // 2))


def build_case(
    op: str, nbytes: int, dtype: torch.dtype, n: int, rank: int, device: torch.device, raw_group: Any = None
) -> Case:
    """The buffers and calls for ``op`` moving about ``nbytes`` (rounded to what the op's layout allows).

    ``raw_group`` is the vendor's own group the raw ``torch.distributed`` calls run on (the world's group is
    xccl's, under which a raw call would be dispatched by xccl too).
    """
    import torch.distributed as dist

    import xccl

    g = raw_group

    e = dtype.itemsize
    elems = max(1, nbytes // e)
    per = max(1, elems // n)  # one rank's chunk for the evenly split ops

    def z(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    ag_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        t = z(elems)
        return Case(elems * e, elems, lambda: xccl.all_reduce(t), lambda: dist.all_reduce(t, group=g), "dist.all_reduce", [t])
    if op == "broadcast":
        t = z(elems)
        return Case(elems * e, elems, lambda: xccl.broadcast(t, 0), lambda: dist.broadcast(t, 0, group=g), "dist.broadcast", [t])
    if op == "reduce":
        t = z(elems)
        return Case(elems * e, elems, lambda: xccl.reduce(t, 0), lambda: dist.reduce(t, 0, group=g), "dist.reduce", [t])
    if op == "all_gather_into_tensor":
        out, inp = z(per * n), z(per)
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.all_gather_into_tensor(out, inp),
            lambda: ag_single(out, inp, group=g),
            f"dist.{ag_single.__name__}",
            [out, inp],
        )
    if op == "all_gather":
        outs, inp = [z(per) for _ in range(n)], z(per)
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.all_gather(outs, inp),
            lambda: dist.all_gather(outs, inp, group=g),
            "dist.all_gather",
            [outs, inp],
        )
    if op == "reduce_scatter_tensor":
        out, inp = z(per), z(per * n)
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.reduce_scatter_tensor(out, inp),
            lambda: rs_single(out, inp, group=g),
            f"dist.{rs_single.__name__}",
            [out, inp],
        )
    if op == "reduce_scatter":
        out, ins = z(per), [z(per) for _ in range(n)]
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.reduce_scatter(out, ins),
            lambda: dist.reduce_scatter(out, ins, group=g),
            "dist.reduce_scatter",
            [out, ins],
        )
    if op == "all_to_all_single":
        out, inp = z(per * n), z(per * n)
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.all_to_all_single(out, inp),
            lambda: dist.all_to_all_single(out, inp, group=g),
            "dist.all_to_all_single",
            [out, inp],
        )
    if op == "all_to_all":
        outs, ins = [z(per) for _ in range(n)], [z(per) for _ in range(n)]
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.all_to_all(outs, ins),
            lambda: dist.all_to_all(outs, ins, group=g),
            "dist.all_to_all",
            [outs, ins],
        )
    if op in ("all_to_all_single_uneven", "all_to_all_v"):
        # rank i sends unit*(1 + (i+j) % n) elements to rank j: symmetric, so sends and receives match per rank.
        u = _uneven_unit(elems, n)
        matrix = [[u * (1 + (i + j) % n) for j in range(n)] for i in range(n)]
        isz, osz = matrix[rank], [row[rank] for row in matrix]
        out, inp = z(sum(osz)), z(sum(isz))
        raw = lambda: dist.all_to_all_single(out, inp, osz, isz, group=g)  # noqa: E731
        if op == "all_to_all_v":
            run = lambda: xccl.all_to_all_v(out, inp, matrix)  # noqa: E731
        else:
            run = lambda: xccl.all_to_all_single(out, inp, osz, isz)  # noqa: E731
        return Case(sum(isz) * e, sum(isz), run, raw, "dist.all_to_all_single with splits", [out, inp])
    if op == "all_gather_into_tensor_uneven":
        u = _uneven_unit(elems, n)
        sizes = [u * (j + 1) for j in range(n)]
        out, inp = z(sum(sizes)), z(sizes[rank])
        # torch.distributed has no uneven all_gather into a tensor (gloo's list all_gather refuses uneven
        # sizes); the plain way is an all_to_all_single that sends this rank's rows to every peer.
        # The input repeated for every peer is built per call, as an emulation of the op would have to.
        raw = lambda: dist.all_to_all_single(out, inp.repeat(n), sizes, [sizes[rank]] * n, group=g)  # noqa: E731
        return Case(
            sum(sizes) * e,
            sum(sizes),
            lambda: xccl.all_gather_into_tensor_uneven(out, inp, sizes),
            raw,
            "dist.all_to_all_single (own rows to every peer)",
            [out, inp],
        )
    if op == "reduce_scatter_tensor_uneven":
        u = _uneven_unit(elems, n)
        sizes = [u * (j + 1) for j in range(n)]
        out, inp = z(sizes[rank]), z(sum(sizes))
        chunks = list(torch.split(inp, sizes))
        return Case(
            sum(sizes) * e,
            sum(sizes),
            lambda: xccl.reduce_scatter_tensor_uneven(out, inp, sizes),
            lambda: dist.reduce_scatter(out, chunks, group=g),
            "dist.reduce_scatter with uneven chunks",
            [out, inp, chunks],
        )
    if op == "gather":
        t = z(per)
        lst = [z(per) for _ in range(n)] if rank == 0 else None
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.gather(t, lst, 0),
            lambda: dist.gather(t, lst, 0, group=g),
            "dist.gather",
            [t, lst],
        )
    if op == "scatter":
        t = z(per)
        lst = [z(per) for _ in range(n)] if rank == 0 else None
        return Case(
            per * n * e,
            per * n,
            lambda: xccl.scatter(t, lst, 0),
            lambda: dist.scatter(t, lst, 0, group=g),
            "dist.scatter",
            [t, lst],
        )
    if op == "sendrecv":
        send, recv = z(elems), z(elems)
        nxt, prv = (rank + 1) % n, (rank - 1) % n

        def ring(isend: Callable[..., Any], irecv: Callable[..., Any]) -> Callable[[], None]:
            def call() -> None:
                works = [irecv(recv, prv), isend(send, nxt)]
                for w in works:
                    w.wait()

            return call

        return Case(
            elems * e,
            elems,
            ring(xccl.isend, xccl.irecv),
            ring(partial(dist.isend, group=g), partial(dist.irecv, group=g)),
            "dist.isend/irecv",
            [send, recv],
        )
    if op == "all_reduce_coalesced":
        ts = [z(max(1, elems // 2)), z(max(1, elems - elems // 2))]
        return Case(sum(x.numel() for x in ts) * e, sum(x.numel() for x in ts), lambda: xccl.all_reduce_coalesced(ts),
                    lambda: [dist.all_reduce(x, group=g) for x in ts], "dist.all_reduce per tensor", [ts])
    if op == "all_gather_coalesced":
        ins = [z(max(1, per // 2)), z(max(1, per - per // 2))]
        outs_l = [[torch.empty_like(x) for x in ins] for _ in range(n)]
        return Case(
            per * n * e, per * n, lambda: xccl.all_gather_coalesced(outs_l, ins),
            lambda: [dist.all_gather([row[i] for row in outs_l], x, group=g) for i, x in enumerate(ins)],
            "dist.all_gather per tensor", [outs_l, ins],
        )
    if op == "gather_any":
        # Every rank but the last sends to the last, which receives from any source (recv without src).
        t = z(elems)

        def fan_in(recv: Callable[..., Any], send: Callable[..., Any]) -> Callable[[], None]:
            def call() -> None:
                if rank == n - 1:
                    for _ in range(n - 1):
                        recv(t)
                else:
                    send(t, n - 1)

            return call

        return Case(elems * e * (n - 1), elems * (n - 1), fan_in(xccl.recv, xccl.send),
                    fan_in(partial(dist.recv, group=g), partial(dist.send, group=g)), "dist.recv without src", [t])
    if op == "barrier":
        return Case(0, 0, lambda: xccl.barrier(), lambda: dist.barrier(group=g), "dist.barrier")
    raise BenchError(f"unknown op {op!r}")


# ------------------------------------------------------------------------------------------------- measuring


class _Progress:
    """A one-line counter on stderr, redrawn at most 5 times a second and cleared before table rows."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.last = 0.0
        self.width = 0

    def show(self, text: str, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def clear(self) -> None:
        if self.stream is not None and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


def _time(fn: Callable[[], Any], batch: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / batch


def _agree(ok: bool, device: torch.device) -> bool:
    """True only if ``ok`` on every rank (a MAX over 'failed' flags)."""
    import xccl

    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    xccl.all_reduce(flag, xccl.ReduceOp.MAX)
    return flag.item() == 0.0


def _slowest(samples: list[list[float]], device: torch.device) -> list[list[float]]:
    """Per call, the maximum over ranks of each rank's time."""
    import xccl

    t = torch.tensor(samples, dtype=torch.float32, device=device)
    xccl.all_reduce(t, xccl.ReduceOp.MAX)
    return [[float(x) for x in row] for row in t.cpu().tolist()]


def _stats(op: str, size: int, n: int, seconds: float) -> dict[str, Any]:
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return {"time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(op, n)}


def measure(
    case: Case, op: str, cfg: BenchConfig, n: int, device: torch.device, raw: bool, tick: Callable[[int], None]
) -> dict[str, Any]:
    """Warm up, then time ``cfg.iters`` samples per variant, interleaved and alternating in order."""
    variants: list[Callable[[], Any]] = [case.run] + ([case.raw] if raw and case.raw is not None else [])
    for _ in range(cfg.warmup):
        for fn in variants:
            fn()
    samples: list[list[float]] = [[] for _ in variants]
    for i in range(cfg.iters):
        order = range(len(variants)) if i % 2 == 0 else reversed(range(len(variants)))
        for v in order:
            samples[v].append(_time(variants[v], cfg.batch, device))
        tick(i + 1)
    slow = _slowest(samples, device)
    row: dict[str, Any] = {"size": case.size, "count": case.count}
    row["xccl"] = _stats(op, case.size, n, statistics.median(slow[0]))
    row["xccl"]["samples_us"] = [t * 1e6 for t in slow[0]]
    if len(variants) > 1:
        row["raw"] = _stats(op, case.size, n, statistics.median(slow[1]))
        row["raw"]["samples_us"] = [t * 1e6 for t in slow[1]]
        # Paired: each round's two calls ran back to back, so a burst of load from elsewhere slows both; the
        # median of the per-round ratios cancels it better than a ratio of the two medians.
        row["ratio"] = statistics.median(r / x for x, r in zip(slow[0], slow[1], strict=True) if x > 0)
    return row


def _try_raw(case: Case, device: torch.device) -> str:
    """Call the raw variant once; ``""`` when it ran on every rank, else why not (the same on every rank)."""
    why = ""
    try:
        if case.raw is None:
            why = "no torch.distributed equivalent"
        else:
            case.raw()
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not _agree(not why, device):
        return why or "it failed on another rank"
    return ""


def run_op(
    op: str, cfg: BenchConfig, n: int, rank: int, device: torch.device, out: TextIO | None, progress: _Progress,
    raw_group: Any = None,
) -> dict[str, Any]:
    """Run the sweep of one op on this rank; rank 0 prints rows as they complete."""
    import xccl
    from xccl.collectives._state import state_of as context

    dtype = DTYPES[cfg.dtype]
    ctx = context(None)
    coll = _COLLECTIVE[op]
    res = ctx.table.resolve(
        coll, dtype=dtype if op != "barrier" else None, reduce_op="sum" if coll.reduces else None, world_size=n
    )
    result: dict[str, Any] = {
        "op": op,
        "level": res.level.value,
        "via": res.via,
        "busbw_factor": busbw_factor(op, n),
        "raw": None,
        "raw_unavailable": None,
        "error": None,
        "rows": [],
    }
    sizes = [0] if op == "barrier" else sweep_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)
    raw_checked = not cfg.compare_raw
    use_raw = cfg.compare_raw
    seen: set[int] = set()
    for k, nbytes in enumerate(sizes):
        case = build_case(op, nbytes, dtype, n, rank, device, raw_group)
        if case.size in seen:
            continue  # small sizes that round to the same buffer
        seen.add(case.size)
        try:
            case.run()
        except xccl.XcclError as exc:
            # Dispatch refuses before communicating, identically on every rank.
            result["error"] = f"{type(exc).__name__}: {exc}"
            break
        if not raw_checked:
            result["raw"] = case.raw_name
            why = _try_raw(case, device)
            if why:
                result["raw_unavailable"], use_raw = why, False
            raw_checked = True
            if out is not None:
                _print_header(out, op, result, cfg)
        elif k == 0 and out is not None:
            _print_header(out, op, result, cfg)

        def tick(i: int, k: int = k, nbytes: int = case.size) -> None:
            progress.show(f"[xccl bench] {op}: size {k + 1}/{len(sizes)} ({human_size(nbytes)}), iter {i}/{cfg.iters}")

        row = measure(case, op, cfg, n, device, use_raw, tick)
        result["rows"].append(row)
        if out is not None:
            progress.clear()
            out.write(format_row(row, cfg.dtype) + "\n")
            out.flush()
    if out is not None and result["error"]:
        progress.clear()
        out.write(f"# {op}: {result['error']}\n")
    return result


# --------------------------------------------------------------------------------------------------- printing


def _print_header(out: TextIO, op: str, result: dict[str, Any], cfg: BenchConfig) -> None:
    how = result["level"] + (f" via {result['via']}" if result["via"] else "")
    out.write(f"#\n# {op} ({how}); busbw factor {result['busbw_factor']:.4g}\n")
    if result["raw"]:
        raw = result["raw"]
        if result["raw_unavailable"]:
            raw += f": unavailable ({result['raw_unavailable']})"
        out.write(f"# raw: {raw}\n")
    both = cfg.compare_raw and not result["raw_unavailable"]
    head = f"#{'size':>11} {'count':>11} {'type':>9}  {'time(us)':>10} {'algbw':>7} {'busbw':>7}"
    if both:
        out.write(f"#{'':33}  {'xccl':-^26}  {'raw torch.distributed':-^26}\n")
        head += f"  {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'ratio':>6}"
    out.write(head + "\n")


def format_row(row: dict[str, Any], dtype: str) -> str:
    """One table line: size, count, type, then time/algbw/busbw per variant, then the ratio."""

    def cols(s: dict[str, float]) -> str:
        return f"{s['time_us']:>10.1f} {s['algbw_gbps']:>7.3f} {s['busbw_gbps']:>7.3f}"

    line = f"{row['size']:>12} {row['count']:>11} {dtype:>9}  {cols(row['xccl'])}"
    if "raw" in row:
        ratio = row.get("ratio")
        line += f"  {cols(row['raw'])} {ratio:>6.3f}" if ratio is not None else f"  {cols(row['raw'])} {'-':>6}"
    return line


# ---------------------------------------------------------------------------------------------------- ranks


def _rank_main(local_rank: int, cfg: BenchConfig, port: int, result_path: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(local_rank),
            "WORLD_SIZE": str(cfg.nproc),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(cfg.nproc),
        }
    )
    import faulthandler

    faulthandler.enable()  # a rank that aborts in C++ says where
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // cfg.nproc))
    import xccl
    from xccl.runtime import vendor_group

    try:
        world = xccl.init(cfg.plugin, simulate=cfg.simulate or None, fallback="emulate", timeout=cfg.timeout)
    except xccl.XcclError as exc:
        print(f"xccl bench: rank {local_rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(3)
    try:
        rank, n = world.rank, world.world_size
        out = sys.stdout if rank == 0 and cfg.table else None
        progress = _Progress(sys.stderr if rank == 0 and cfg.progress else None)
        if out is not None:
            sim = " (simulated on CPU)" if world.simulate else ""
            out.write(
                f"# xccl bench: plugin {world.plugin}{sim}, backend {world.backend}, {n} ranks, "
                f"{cfg.dtype}, {cfg.iters} iters x {cfg.batch} call(s) + {cfg.warmup} warmup; "
                f"time: median of the slowest rank's per-call time; bandwidths in GB/s\n"
            )
        # Raw calls run on the vendor's own group: the world's is xccl's, which would dispatch them too.
        raw_group = vendor_group() if cfg.compare_raw else None
        results = [run_op(op, cfg, n, rank, world.device, out, progress, raw_group) for op in cfg.ops]
        progress.clear()
        if rank == 0:
            doc = {
                "xccl_bench": 1,
                "plugin": world.plugin,
                "backend": world.backend,
                "simulate": world.simulate,
                "world_size": n,
                "device": str(world.device.type),
                "torch": torch.__version__,
                "xccl": xccl.__version__,
                "config": asdict(cfg),
                "timing": "median over calls of the slowest rank's time per call",
                "results": results,
            }
            with open(result_path, "w") as f:
                json.dump(doc, f)
        xccl.barrier()
    finally:
        xccl.shutdown()
    # Seen here under load (torch 2.13, gloo): a rank aborting at interpreter exit, after its Python code had
    # finished ("terminate called without an active exception", no Python frame). The results are written and
    # the process group is destroyed, so leave without running C++ static destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(cfg: BenchConfig) -> dict[str, Any]:
    """Start ``cfg.nproc`` local ranks, run the sweep and return rank 0's results.

    Raises:
        BenchError: the configuration cannot run, or a rank failed (its error was printed on stderr).
    """
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    from ..testing._pool import free_port

    cfg.check()
    fd, path = tempfile.mkstemp(prefix="xccl-bench-", suffix=".json")
    os.close(fd)
    try:
        try:
            start_processes(  # type: ignore[no-untyped-call]
                _rank_main, args=(cfg, free_port(), path), nprocs=cfg.nproc, start_method="spawn"
            )
        except ProcessRaisedException as exc:
            raise BenchError(f"a rank failed:\n{exc}") from None
        except ProcessExitedException as exc:
            raise BenchError(
                f"rank {exc.error_index} exited with code {exc.exit_code} (see its message above)"
            ) from None
        with open(path) as f:
            text = f.read()
        if not text:
            raise BenchError("rank 0 wrote no results")
        return json.loads(text)  # type: ignore[no-any-return]
    finally:
        os.unlink(path)


def plot(doc: dict[str, Any], path: str) -> None:
    """Bus bandwidth against size, one line per op and variant (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for res in doc["results"]:
        rows = [r for r in res["rows"] if r["size"] > 0]
        if not rows:
            continue
        for variant in ("xccl", "raw"):
            pts = [(r["size"], r[variant]["busbw_gbps"]) for r in rows if variant in r]
            if pts:
                label = f"{res['op']} ({'xccl' if variant == 'xccl' else 'torch.distributed'})"
                ax.plot(
                    *zip(*pts, strict=True), marker="o", ms=3, label=label, linestyle="-" if variant == "xccl" else "--"
                )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    sim = " simulated" if doc["simulate"] else ""
    ax.set_title(
        f"xccl bench: {doc['plugin']}{sim} ({doc['backend']}), {doc['world_size']} ranks, {doc['config']['dtype']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
