"""Fitting a :class:`~xccl.plugin._cost.CostModel` to measurements: ``xccl bench --json``, nccl-tests, HCCL Test.

The model per op is ``time = latency + size * factor(op, n) / busbw`` (:mod:`xccl.plugin._cost`), linear in
``x = size * factor``: :func:`fit` solves it by least squares on the *relative* error (each point weighted by
``1 / time``), because a prediction is judged by its ratio to the measured time and an unweighted fit would let the
largest size decide alone, leaving the latency (what small messages cost) to chance.

:func:`calibrate` reads one measurement file, of any of three formats (detected from its content):

* ``xccl bench --json`` (``"xccl_bench": 1``): per op the rows' ``size`` and the median ``xccl.time_us``;
* an nccl-tests log (``all_reduce_perf`` and friends, NVIDIA/nccl-tests ``src/common.cu``): the table rows
  ``size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong``; the out-of-place time is used;
* an HCCL Test log (``all_reduce_test`` and friends, Ascend's "HCCL Performance Tester: Result Description"):
  ``data_size(Bytes): | avg_time(us): | alg_bandwidth(GB/s): | check_result:`` rows. The fit works from
  ``avg_time`` and ``data_size``, not from the bandwidth, whose "GB/s" are 2**30 bytes per second (docs/fidelity.md).

Neither log names the world size on every line; the bench JSON has ``world_size``, an nccl-tests log lists its ranks
(``#  Rank  0 Pid ...``) or the ratio of its busbw to algbw gives it, and an HCCL Test log gives it through the
``-p``/``mpirun -n`` of its command line when that is pasted in; otherwise ``world_size=`` must say.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from ..errors import InvalidArgument
from ..ops._vocab import Collective
from ..plugin._cost import CostModel, LinkCost, bus_factor

__all__ = ["STATS", "Point", "calibrate", "fit", "read_points"]

C = Collective

#: The ops each measured name stands for: one native op serves both of torch's spellings (all_gather and
#: all_gather_into_tensor run the same kernel), so a measurement of one calibrates both.
_ALIASES: Final[Mapping[str, tuple[Collective, ...]]] = {
    **{c.value: (c,) for c in (C.ALL_REDUCE, C.ALL_GATHER_INTO_TENSOR, C.REDUCE_SCATTER_TENSOR, C.ALL_TO_ALL_SINGLE,
                               C.BROADCAST, C.REDUCE, C.GATHER, C.SCATTER)},
    "allreduce": (C.ALL_REDUCE,),
    "all_gather": (C.ALL_GATHER, C.ALL_GATHER_INTO_TENSOR),
    "allgather": (C.ALL_GATHER, C.ALL_GATHER_INTO_TENSOR),
    "reduce_scatter": (C.REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR),
    "reducescatter": (C.REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR),
    "all_to_all": (C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE),
    "alltoall": (C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE),
    "sendrecv": (C.SEND, C.RECV),
}


@final
@dataclass(frozen=True, slots=True)
class Point:
    """One measurement: ``op`` over ``group_size`` ranks moved ``nbytes`` (nccl-tests' size) in ``seconds``.

    Attributes:
        op: the collective measured.
        nbytes: the bytes of the buffer the op is named after (all_gather: the gathered output).
        group_size: the ranks in the group.
        seconds: the time of one call.
        where: where it was read (``FILE:LINE``), for error messages and the fitted source.
    """

    op: Collective
    nbytes: int
    group_size: int
    seconds: float
    where: str = ""


def _bad(where: str, problem: str) -> InvalidArgument:
    return InvalidArgument("calibrate", f"{where}: {problem}" if where else problem)


def _solve(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """Weighted least squares of ``t = a + b x`` with weights ``1/t**2`` (relative error); ``a >= 0``."""
    w = [1.0 / (t * t) for t in ts]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    st = sum(wi * t for wi, t in zip(w, ts, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts, strict=True))
    det = sw * sxx - sx * sx
    a, b = (st * sxx - sx * sxt) / det, (sw * sxt - sx * st) / det
    if a < 0:  # noise at small sizes can put the intercept below zero: a call never takes negative time
        a, b = 0.0, sxt / sxx
    return a, b


def fit(points: Iterable[Point | tuple[Collective, int, int, float]], *, source: str = "fitted") -> dict[
        Collective, LinkCost]:
    """Fit latency and bus bandwidth per op: ``seconds = latency + nbytes * bus_factor(op, n) / busbw``.

    Args:
        points: measurements, as :class:`Point` or ``(op, nbytes, group_size, seconds)``.
        source: the source recorded in every fitted :class:`LinkCost` (the file, say).

    Returns:
        Per op, the fitted cost (latency in µs, busbw in GB/s).

    Raises:
        InvalidArgument: a point is not a measurement (size or time not positive, group below 2), or an op has
            fewer than two distinct sizes, or its time does not grow with size (no bandwidth to fit).
    """
    by_op: dict[Collective, list[Point]] = defaultdict(list)
    for raw in points:
        p = raw if isinstance(raw, Point) else Point(*raw)
        if not isinstance(p.op, Collective):
            raise _bad(p.where, f"op {p.op!r} is not a Collective")
        if p.nbytes < 0 or not math.isfinite(p.seconds) or p.seconds <= 0 or p.group_size < 2:
            raise _bad(p.where, f"not a measurement: {p.op.value} of {p.nbytes} B over {p.group_size} ranks in "
                                f"{p.seconds} s (sizes >= 0, times > 0 and groups of 2 or more ranks)")
        by_op[p.op].append(p)
    if not by_op:
        raise _bad(source, "no measurements to fit")
    out: dict[Collective, LinkCost] = {}
    for op, pts in by_op.items():
        xs = [p.nbytes * bus_factor(op, p.group_size) for p in pts]
        if len(set(xs)) < 2:
            raise _bad(pts[0].where or source, f"{op.value}: a latency and a bandwidth need at least two sizes")
        a, b = _solve(xs, [p.seconds for p in pts])
        if b <= 0:
            raise _bad(pts[0].where or source, f"{op.value}: its time does not grow with size, so no bandwidth "
                                               "can be fitted (sizes too small for this link?)")
        out[op] = LinkCost(latency_us=a * 1e6, busbw_gbps=1.0 / b / 1e9, source=source)
    return out


# ------------------------------------------------------------------------------------------------- readers

_NUM: Final = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
#: mpirun's ``--tag-output`` prefix (``[1,0]<stdout>:``), which published nccl-tests logs often carry.
_MPI_TAG: Final = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_NCCL_RANK: Final = re.compile(r"^#?\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+")
_NCCL_OP: Final = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|gather|scatter|"
                             r"sendrecv)_perf\b")
_HCCL_HEAD: Final = re.compile(r"data_size\s*\(Bytes\)\s*:?\s*\|", re.IGNORECASE)
_HCCL_OP: Final = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|alltoallv|broadcast|reduce|"
                             r"scatter|send|recv)_test\b")
_HCCL_NP: Final = re.compile(r"(?:mpirun\b.*?\s-(?:n|np)\s+(\d+))|(?:\s-p\s+(\d+))")


def _ops(name: str, where: str) -> tuple[Collective, ...]:
    key = name.lower()
    if key in _ALIASES:
        return _ALIASES[key]
    try:
        return (Collective(key),)
    except ValueError:
        raise _bad(where, f"unknown op {name!r}; known: {', '.join(sorted(_ALIASES))}") from None


#: Which of a bench row's statistics is the time: the median (``xccl bench``'s ``time_us``), the lower quartile or
#: the fastest sample. On a shared machine the lower quartile estimates the uncontended cost more reproducibly
#: than the median, whose value moves with whatever else runs (benchmarks/cost_model.py compares both).
STATS: Final = ("median", "q1", "min")


def _row_time(row: Mapping[str, Any], stat: str) -> float:
    cell = row["xccl"]
    if stat == "q1":
        return float(cell["iqr_us"][0])
    if stat == "min":
        return float(min(cell["samples_us"]))
    return float(cell["time_us"])


def _from_bench(path: str, doc: Mapping[str, Any], stat: str = "median") -> list[Point]:
    from ._bench_config import BUSBW_FACTORS, COLLECTIVE  # the bench's op -> Collective map (sendrecv: SEND)

    n = doc.get("world_size")
    if not isinstance(n, int) or n < 2:
        raise _bad(path, f"'world_size' is {n!r}: a bench of 2 or more ranks is needed")
    points: list[Point] = []
    for i, res in enumerate(doc.get("results") or []):
        name = res.get("op")
        where = f"{path}: results[{i}] ({name})"
        if res.get("error") or name not in COLLECTIVE or BUSBW_FACTORS[name](4) == 0.0:
            continue  # a failed op, or one that moves no data (barrier: a latency, no bandwidth): nothing to fit
        ops = _ALIASES.get(name, (COLLECTIVE[name],))
        for j, row in enumerate(res.get("rows") or []):
            try:
                size, t_us = int(row["size"]), _row_time(row, stat)
            except (KeyError, TypeError, ValueError, IndexError):
                raise _bad(f"{where}.rows[{j}]", "a row needs 'size' and 'xccl': {'time_us', 'iqr_us', "
                                                 "'samples_us'}") from None
            points += [Point(op, size, n, t_us * 1e-6, f"{where}.rows[{j}]") for op in ops]
    if not points:
        raise _bad(path, "no op with measured rows (every op failed or moves no data)")
    return points


def _nccl_world(lines: Sequence[str], rows: Sequence[tuple[str, float, float, float, float]],
                ops: Sequence[Collective]) -> int | None:
    ranks = sum(1 for line in lines if _NCCL_RANK.match(line))
    if ranks >= 2:
        return ranks
    # No rank list: busbw / algbw is the op's factor, which names n; the largest row has the most digits.
    _, _, _, algbw, busbw = max(rows, key=lambda r: r[1])
    if algbw <= 0:
        return None
    f = busbw / algbw
    for n in range(2, 65537):
        if abs(bus_factor(ops[0], n) - f) < 0.01:
            return n
    return None


def _from_nccl(path: str, lines: Sequence[str], op: str | None, world_size: int | None) -> list[Point]:
    name = op
    if name is None:
        found = {m.group(1) for line in lines for m in [_NCCL_OP.search(line)] if m}
        if len(found) != 1:
            raise _bad(path, "an nccl-tests log names no single op (its command line, '..._perf', is not in it): "
                             "pass op=")
        name = found.pop()
    ops = _ops(name, path)
    time_col: int | None = None
    rows: list[tuple[str, float, float, float, float]] = []  # (where, size, seconds, algbw, busbw)
    for i, line in enumerate(lines, 1):
        where = f"{path}:{i}"
        toks = line.split()
        if line.startswith("#"):
            head = line.lstrip("#").split()
            if "size" in head and "time" in head and "busbw" in head:
                time_col = head.index("time")
            continue
        if not toks or not toks[0].isdigit() or time_col is None:
            continue
        try:
            size = int(toks[0])
            t_us, algbw, busbw = (float(x) for x in toks[time_col:time_col + 3])
        except ValueError:
            raise _bad(where, f"not an nccl-tests row: {line.strip()!r}") from None
        rows.append((where, size, t_us * 1e-6, algbw, busbw))
    if not rows:
        raise _bad(path, "no nccl-tests table (a '# size count type ... time algbw busbw' header and its rows)")
    n = world_size or _nccl_world(lines, rows, ops)
    if n is None:
        raise _bad(path, "the log lists no ranks and its bandwidths do not name the world size: pass world_size=")
    return [Point(o, int(size), n, t, where) for where, size, t, _, _ in rows for o in ops]


def _from_hccl(path: str, lines: Sequence[str], op: str | None, world_size: int | None) -> list[Point]:
    name, n = op, world_size
    for line in lines:
        if name is None and (m := _HCCL_OP.search(line)):
            name = m.group(1)
        if n is None and "_test" in line and (m := _HCCL_NP.search(line)):
            n = int(m.group(1) or m.group(2))
    if name is None:
        raise _bad(path, "an HCCL Test log names no op (its command line, '..._test', is not in it): pass op=")
    if n is None:
        raise _bad(path, "an HCCL Test log whose command line gives no rank count (-p or mpirun -n): pass "
                         "world_size=")
    ops = _ops(name, path)
    points: list[Point] = []
    in_table = False
    for i, line in enumerate(lines, 1):
        if _HCCL_HEAD.search(line):
            in_table = True
            continue
        cells = [c.strip() for c in line.split("|")]
        if not in_table or len(cells) < 3 or not cells[0].isdigit():
            in_table = in_table and bool(line.strip()) and len(cells) >= 3
            continue
        where = f"{path}:{i}"
        if not re.fullmatch(_NUM, cells[1]) or not re.fullmatch(_NUM, cells[2]):
            raise _bad(where, f"not an HCCL Test row (data_size | avg_time | alg_bandwidth | check_result): "
                              f"{line.strip()!r}")
        if len(cells) > 3 and cells[3].lower() == "failed":
            raise _bad(where, "check_result is 'failed': a run with wrong results measures nothing")
        # avg_time is the time; alg_bandwidth (data_size / time, in 2**30 B/s) is redundant with it, and the fit
        # applies the nccl-tests factor to data_size, which is the conversion to bus bandwidth the issue asks for.
        points += [Point(o, int(cells[0]), n, float(cells[1]) * 1e-6, where) for o in ops]
    if not points:
        raise _bad(path, "no HCCL Test table (a 'data_size(Bytes): | avg_time(us): | ...' header and its rows)")
    return points


def read_points(path: str | Path, *, op: str | None = None, world_size: int | None = None,
                stat: str = "median") -> list[Point]:
    """The measurements in ``path``: ``xccl bench --json`` output, an nccl-tests log or an HCCL Test log.

    Args:
        path: the file.
        op: the op a log measured, when its command line is not in it (``"all_reduce"``, ``"alltoall"``...).
        world_size: the ranks, when the file does not say.
        stat: for ``xccl bench --json``, which statistic of a row is its time (:data:`STATS`); the logs give one.

    Raises:
        InvalidArgument: the file is missing, of no known format, or a line of it is malformed (named FILE:LINE).
    """
    p = str(path)
    if stat not in STATS:
        raise _bad(p, f"stat={stat!r}: choose from {', '.join(STATS)}")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise _bad(p, f"cannot read it ({exc.strerror or exc})") from None
    if world_size is not None and world_size < 2:
        raise _bad(p, f"world_size={world_size}: a collective's cost needs 2 or more ranks")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _bad(f"{p}:{exc.lineno}", f"not valid JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or doc.get("xccl_bench") != 1:
            raise _bad(p, "a JSON file that is not 'xccl bench --json' output (no \"xccl_bench\": 1)")
        return _from_bench(p, doc, stat)
    lines = [_MPI_TAG.sub("", line) for line in text.splitlines()]
    if any(_HCCL_HEAD.search(line) for line in lines):
        return _from_hccl(p, lines, op, world_size)
    return _from_nccl(p, lines, op, world_size)


def calibrate(path: str | Path, *, generation: str, intra_node: bool = True, op: str | None = None,
              world_size: int | None = None, base: CostModel | None = None, stat: str = "median") -> CostModel:
    """A cost model fitted to the measurements in ``path`` (see :func:`read_points` for the formats).

    Args:
        path: ``xccl bench --json`` output, an nccl-tests log or an HCCL Test log.
        generation: the hardware measured (``"Atlas 800T A2"``, ``"this host"``).
        intra_node: whether the ranks measured shared one node (the fit fills ``intra``) or not (``inter``).
        op: the op of a log that does not name it.
        world_size: the ranks of a log that does not say.
        base: a model whose figures the fit overrides op by op (the plugin's published one, say); the other link
            kind and the ops not measured keep its figures.
        stat: for ``xccl bench --json``, the statistic taken as a row's time (:data:`STATS`).

    Raises:
        InvalidArgument: the file cannot be read or fitted; the message names the file and line.
    """
    source = f"fitted: {path}" + ("" if stat == "median" else f" ({stat})")
    fitted = fit(read_points(path, op=op, world_size=world_size, stat=stat), source=source)
    intra = dict(base.intra) if base else {}
    inter = dict(base.inter) if base else {}
    (intra if intra_node else inter).update(fitted)
    notes = base.notes if base else ""
    return CostModel(generation=generation, intra=intra, inter=inter, notes=notes)
