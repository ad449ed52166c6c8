"""What the conformance suite runs on each rank: every case of :mod:`._cases`, compared with its reference.

The suite (:mod:`xccl.testing.conformance`) sends these module-level functions to a :class:`RankPool`, so they
must import without pytest. Each rank builds the same list of cases from the plugin's own capability table: the
call order must be identical on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

import xccl
from xccl.plugin._capabilities import CapabilityTable, Collective, Level, Mode

from ._cases import SYNC_ONLY, build
from ._claims import async_shapes, claim_fix, shapes
from ._reference import make, mismatch

__all__ = [
    "barrier_holds",
    "comm_names",
    "eager_batch",
    "error_line",
    "graph_batch",
    "graph_ops",
    "kernel_signature_problems",
    "note",
    "refusal_batch",
]

C = Collective


def _ring_peer_ok(table: CapabilityTable, op: Collective, dt: torch.dtype, n: int, mode: Mode) -> bool:
    if op not in (C.SEND, C.RECV):
        return True
    peer = C.RECV if op is C.SEND else C.SEND
    return table.supports(peer, mode=mode, dtype=dt, world_size=n)


def _compare(outs: Any, want: tuple[torch.Tensor | None, ...]) -> str | None:
    outs = tuple(outs)
    if len(outs) != len(want):
        return f"{len(outs)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(outs, want, strict=True)):
        if w is None:
            continue
        why = mismatch(g, w)
        if why is not None:
            return f"output {i}: {why}"
    return None


def error_line(exc: BaseException) -> str:
    """``"<type>: <the first line of its message>"``."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def note(progress: str | None, rank: int, what: str) -> None:
    """Note in ``<progress>.<rank>`` what this rank is about to do, so that a hang is reported with the call."""
    if progress:
        with open(f"{progress}.{rank}", "w", encoding="utf-8") as f:
            f.write(what)


def _table() -> CapabilityTable:
    return xccl.capabilities(xccl.get_world().plugin)


def _report() -> dict[str, list[str]]:
    return {"ran": [], "refused": [], "skipped": [], "failures": []}


def kernel_signature_problems(progress: str | None = None) -> list[str]:
    """What is wrong with the signatures of the selected runtime's kernels (empty: each takes what xccl passes)."""
    from xccl.collectives._state import PROCESS
    from xccl.plugin._kernels import kernels_problems

    runtime = PROCESS.runtime
    return [] if runtime is None else kernels_problems(runtime.kernels())


def eager_batch(progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Run every supported (op, dtype, reduce op), sync and async, on every rank; report per op.

    Returns:
        ``{op: {"ran": labels, "skipped": reasons, "failures": messages, "refused": []}}``.
    """
    w = xccl.get_world()
    table = _table()
    reports = {op.value: _report() for op in C}
    failed: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for op in C:
        rep = reports[op.value]
        tried = shapes(table, op, w.world_size)
        also_async = async_shapes(table, op, w.world_size, tried) if op not in SYNC_ONLY else set()
        for dt, ro, level in tried:
            if level is Level.UNSUPPORTED:
                continue
            if not _ring_peer_ok(table, op, dt, w.world_size, Mode.EAGER):
                rep["skipped"].append(f"{dt} (needs {'recv' if op is C.SEND else 'send'} for the ring)")
                continue
            for async_op in (False, True) if (dt, ro) in also_async else (False,):
                case = build(op, dt, ro, n=w.world_size, r=w.rank, device=w.device, async_op=async_op)
                note(progress, w.rank, f"{op.value} {case.label}")
                try:
                    why = _compare(case.fn(*case.inputs), case.want)
                except Exception as exc:  # every failure is reported, with its op
                    why = error_line(exc)
                if why is None:
                    rep["ran"].append(case.label)
                else:
                    fix = claim_fix(table, op, Mode.EAGER, dt, ro)
                    failed.setdefault((op.value, fix), []).append((f"{case.label} ({level.value})", why))
    # One line per fix: a dtype the kernel cannot compute fails for every reduce op and both ways of calling, and
    # each of those would say the same thing.
    for (op_name, fix), cases in failed.items():
        labels = ", ".join(label for label, _ in cases)
        also = "" if len(cases) == 1 else f" (the first of these {len(cases)})"
        reports[op_name]["failures"].append(f"{op_name} {labels}: {cases[0][1]}{also}. {fix}")
    return reports


def _alone(op: Collective, dt: torch.dtype, ro: str, n: int, device: torch.device) -> Callable[[], Any]:
    """One call of ``op`` that rank 0 makes while its peers call nothing."""
    if op is C.SEND:
        return lambda: xccl.send(make(0, (2,), dt).to(device), 1)
    if op is C.RECV:
        return lambda: xccl.recv(torch.empty(2, dtype=dt, device=device), 1)
    if op is C.RECV_ANY_SOURCE:
        return lambda: xccl.recv(torch.empty(2, dtype=dt, device=device))
    case = build(op, dt, ro, n=n, r=0, device=device)
    return lambda: case.fn(*case.inputs)


def refusal_batch(progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Rank 0 alone calls every call shape the table marks unsupported: each must raise UnsupportedCollective
    at once. Its peers call nothing, so an op that communicates before refusing blocks here and the suite
    reports the hang. Then every rank meets in one collective, to show the group is still usable."""
    w = xccl.get_world()
    table = _table()
    reports = {op.value: _report() for op in C}
    if w.rank == 0:
        for op in C:
            rep = reports[op.value]
            for dt, ro, level in shapes(table, op, w.world_size):
                if level is not Level.UNSUPPORTED:
                    continue
                label = " ".join(p for p in (str(dt).removeprefix("torch."), ro) if p)
                note(progress, 0, f"{op.value} {label} (alone, expected to raise)")
                try:
                    _alone(op, dt, ro, w.world_size, w.device)()
                    rep["failures"].append(f"{op.value} {label}: the table says unsupported, but it ran")
                except xccl.UnsupportedCollective:
                    rep["refused"].append(label)
                except Exception as exc:  # the wrong error is a finding
                    rep["failures"].append(f"{op.value} {label}: the table says unsupported; expected "
                                           f"UnsupportedCollective, got {error_line(exc)}")
    _meet(table, w.world_size)
    return reports


def _meet(table: CapabilityTable, n: int) -> None:
    if table.supports(C.ALL_REDUCE, dtype=torch.float32, reduce_op="sum", world_size=n):
        t = torch.ones(1, device=xccl.get_world().device)
        xccl.all_reduce(t)
        if t.item() != n:
            raise AssertionError(f"the group is damaged: all_reduce of ones gave {t.item()} on {n} ranks")
    elif table.supports(C.BARRIER, world_size=n):
        xccl.barrier()


def _graph_shape(table: CapabilityTable, op: Collective, n: int) -> tuple[torch.dtype, str] | None:
    for dt, ro, level in shapes(table, op, n, Mode.GRAPH):
        if level is not Level.UNSUPPORTED and ro in ("", "sum") and _ring_peer_ok(table, op, dt, n, Mode.GRAPH):
            return dt, ro
    return None


def graph_ops(table: CapabilityTable, world_size: int) -> list[Collective]:
    """Ops the table claims to run in graph mode (native or emulated) at ``world_size``."""
    return [op for op in C if _graph_shape(table, op, world_size) is not None]


def graph_batch(backend: str, progress: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Compile every graph-mode claim with ``torch.compile(fullgraph=True)``: the compiled function must not
    break the graph and must return what eager returns and what the reference says."""
    import torch._dynamo

    w = xccl.get_world()
    table = _table()
    reports = {op.value: _report() for op in C}
    torch._dynamo.reset()
    for op in graph_ops(table, w.world_size):
        rep = reports[op.value]
        shape = _graph_shape(table, op, w.world_size)
        if shape is None:  # pragma: no cover - graph_ops filtered these
            continue
        case = build(op, shape[0], shape[1], n=w.world_size, r=w.rank, device=w.device)
        note(progress, w.rank, f"{op.value} {case.label} (graph)")
        try:
            eager = case.fn(*case.inputs)
            compiled = torch.compile(case.fn, fullgraph=True, backend=backend)(*case.inputs)
            why = _compare(compiled, case.want)
            if why is None:
                why = _compare(compiled, tuple(t.detach().cpu() if t is not None else None for t in eager))
                why = None if why is None else f"compiled differs from eager: {why}"
        except Exception as exc:  # a graph break or a compile error is a finding
            why = error_line(exc)
        if why is None:
            rep["ran"].append(f"{case.label} graph")
        else:
            rep["failures"].append(f"{op.value} {case.label} (graph, {backend}): {why}")
    return reports


def comm_names(progress: str | None = None) -> dict[str, str]:
    """Communicator names of the world, of two groups over every rank, and of this rank's half of the world,
    each asked twice; every member asks (HCCL creates the communicator on the first request)."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    every_a = xccl.new_group(list(range(n)))
    every_b = xccl.new_group(list(range(n)))
    low = xccl.new_group(list(range(n // 2)))
    high = xccl.new_group(list(range(n // 2, n)))
    half = low if r < n // 2 else high
    return {
        "world": xccl.comm_name(),
        "world again": xccl.comm_name(None),
        "every rank, group a": xccl.comm_name(every_a),
        "every rank, group b": xccl.comm_name(every_b),
        "every rank, group a again": xccl.comm_name(every_a),
        f"half {'low' if r < n // 2 else 'high'}": xccl.comm_name(half),
    }


#: How late rank 0 enters the barrier in :func:`barrier_holds`, seconds.
BARRIER_LATE = 0.3


def barrier_holds(progress: str | None = None) -> dict[str, float]:
    """Rank 0 enters the barrier :data:`BARRIER_LATE` seconds late; every rank notes (wall clock: one host's, or
    hosts kept in sync) when it entered and when it left. A barrier holds every rank until the last entered,
    whatever the vendor's ``Work.wait()`` does (SCCL's returns at once; xccl then blocks on the host)."""
    xccl.barrier()
    if xccl.get_world().rank == 0:
        time.sleep(BARRIER_LATE)
    entered = time.time()
    xccl.barrier()
    return {"entered": entered, "left": time.time()}
