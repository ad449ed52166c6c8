#!/usr/bin/env python3
"""Measure which torch.distributed collectives a backend computes correctly, per dtype and reduce op.

The script spawns ``--world-size`` ranks (default 2), runs every collective entry point of
``torch.distributed`` for every dtype and, for reducing collectives, every ``ReduceOp``, and checks each
result against a reference that every rank computes locally from the (deterministic) inputs of all ranks.
A cell is ``"ok"`` only if every rank saw the right result, ``"wrong result"`` if any rank saw a wrong one
and ``"error: <first line>"`` if any rank raised.

Usage::

    python scripts/probe_backend.py --json gloo.json                     # gloo on CPU
    python scripts/probe_backend.py --backend nccl --device cuda --json nccl.json

The JSON file holds ``{"meta": {...}, "matrix": {op: {dtype: {reduce_op: status}}}, "notes": {...}}``.
Collectives that do not reduce use the reduce-op key ``"none"``; ``barrier`` also uses the dtype key
``"none"``. ``notes`` holds the expected and received values of every ``"wrong result"`` cell.

A failing case may raise on one rank only (a rooted op, say); the other rank then waits for the timeout.
After every case the ranks compare outcomes over a separate gloo group and, if they disagree, move to a
fresh group so that one broken case cannot poison the rest of the matrix.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
REDUCE_OPS: tuple[str, ...] = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
PREMUL_FACTOR = 2.0
NONE = "none"
#: Elements per rank chunk. Four is enough for every 2-rank bool combination (see ``_values``).
N = 4
#: Integer views used to define what a bitwise reduction of a floating tensor would mean.
_BIT_VIEWS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
              torch.float64: torch.int64}


class WrongResult(Exception):
    """A collective returned without error but with values that differ from the reference."""


#: Remarks about results that are right but odd (a bool tensor holding a byte 2), collected per case.
_REMARKS: list[str] = []


@dataclass
class Ctx:
    """What a case needs: its rank, the group under test and where tensors live."""

    rank: int
    world: int
    group: dist.ProcessGroup
    device: torch.device


# ---------------------------------------------------------------------------------------------------------------
# Inputs and references
# ---------------------------------------------------------------------------------------------------------------


def _values(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Deterministic input of ``rank``: small positive integers, or bools covering every combination.

    Values stay in 1..3 so that sums and products of a few ranks fit in int8/uint8 and are exact in float16.
    """
    idx = torch.arange(n, dtype=torch.int64) + salt
    if dtype == torch.bool:
        # bit `rank` of the index: with two ranks the four elements cover TT, TF, FT, FF.
        return ((idx >> (rank % 2)) & 1).bool() if rank < 2 else ((idx + rank) % 2).bool()
    return ((idx + rank) % 3 + 1).to(dtype)


def _reduce_ref(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reference reduction over the ranks' contributions, computed on CPU in a wide type, cast back."""
    dtype = tensors[0].dtype
    if dtype == torch.bool:
        stack = torch.stack([t.to(torch.int64) for t in tensors])
        any_, all_ = stack.amax(0), stack.amin(0)
        table = {"SUM": any_, "MAX": any_, "BOR": any_, "PRODUCT": all_, "MIN": all_, "BAND": all_,
                 "BXOR": stack.sum(0) % 2, "AVG": any_, "PREMUL_SUM": any_}
        return table[op].bool()
    if op in ("BAND", "BOR", "BXOR"):
        view = _BIT_VIEWS.get(dtype, dtype)
        acc = tensors[0].view(view).clone()
        for t in tensors[1:]:
            bits = t.view(view)
            acc = acc & bits if op == "BAND" else acc | bits if op == "BOR" else acc ^ bits
        return acc.view(dtype)
    wide = torch.stack([t.to(torch.float64 if dtype.is_floating_point else torch.int64) for t in tensors])
    if op == "SUM":
        out = wide.sum(0)
    elif op == "PRODUCT":
        out = wide.prod(0)
    elif op == "MIN":
        out = wide.amin(0)
    elif op == "MAX":
        out = wide.amax(0)
    elif op == "AVG":
        out = wide.sum(0) / len(tensors) if dtype.is_floating_point else wide.sum(0) // len(tensors)
    elif op == "PREMUL_SUM":
        out = (wide * PREMUL_FACTOR).sum(0)
    else:
        raise ValueError(f"unknown reduce op {op}")
    return out.to(dtype)


def _torch_op(op: str) -> Any:
    """The ``ReduceOp`` object torch expects for ``op``."""
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def _check(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Raise ``WrongResult`` unless ``got`` equals ``want`` exactly (bools compared by truthiness)."""
    got = got.detach().cpu()
    if got.dtype == torch.bool:
        # A backend may leave a byte such as 2 in a bool tensor (gloo's SUM adds the bytes); count it as true,
        # as NCCL's uint8 SUM would, but remark on it because torch.equal and comparisons see the raw byte.
        raw = got.view(torch.uint8)
        if int(raw.max()) > 1:
            _REMARKS.append(f"{what}bool result holds bytes {raw.tolist()}")
        equal = torch.equal(raw != 0, want)
    else:
        equal = got.dtype == want.dtype and torch.equal(got, want)
    if not equal:
        raise WrongResult(f"{what}expected {want.tolist()}, got {got.tolist()}")


# ---------------------------------------------------------------------------------------------------------------
# Cases: each runs one collective on the group under test and checks this rank's result.
# ---------------------------------------------------------------------------------------------------------------


def _all_reduce(c: Ctx, dtype: torch.dtype, op: str, async_op: bool = False) -> None:
    ins = [_values(r, N, dtype) for r in range(c.world)]
    t = ins[c.rank].to(c.device, copy=True)
    work = dist.all_reduce(t, op=_torch_op(op), group=c.group, async_op=async_op)
    if async_op:
        work.wait()
    _check(t, _reduce_ref(ins, op))


def _reduce(c: Ctx, dtype: torch.dtype, op: str) -> None:
    ins = [_values(r, N, dtype) for r in range(c.world)]
    t = ins[c.rank].to(c.device, copy=True)
    dist.reduce(t, dst=0, op=_torch_op(op), group=c.group)
    if c.rank == 0:  # only the destination's buffer is specified
        _check(t, _reduce_ref(ins, op))


def _reduce_scatter(c: Ctx, dtype: torch.dtype, op: str) -> None:
    ins = [[_values(r, N, dtype, salt=j) for j in range(c.world)] for r in range(c.world)]
    out = torch.zeros(N, dtype=dtype, device=c.device)
    dist.reduce_scatter(out, [t.to(c.device, copy=True) for t in ins[c.rank]], op=_torch_op(op), group=c.group)
    _check(out, _reduce_ref([ins[r][c.rank] for r in range(c.world)], op))


# torch 2.13's names (it deprecates the older ones, warning on every call); older torch has only those.
_RS_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_AG_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_tensor(c: Ctx, dtype: torch.dtype, op: str, async_op: bool = False) -> None:
    ins = [_values(r, N * c.world, dtype) for r in range(c.world)]
    out = torch.zeros(N, dtype=dtype, device=c.device)
    work = _RS_SINGLE(out, ins[c.rank].to(c.device, copy=True), op=_torch_op(op), group=c.group, async_op=async_op)
    if async_op:
        work.wait()
    chunk = slice(c.rank * N, (c.rank + 1) * N)
    _check(out, _reduce_ref([t[chunk] for t in ins], op))


def _all_gather(c: Ctx, dtype: torch.dtype) -> None:
    outs = [torch.zeros(N, dtype=dtype, device=c.device) for _ in range(c.world)]
    dist.all_gather(outs, _values(c.rank, N, dtype).to(c.device, copy=True), group=c.group)
    for r, o in enumerate(outs):
        _check(o, _values(r, N, dtype), f"from rank {r}: ")


def _all_gather_into_tensor(c: Ctx, dtype: torch.dtype, async_op: bool = False) -> None:
    out = torch.zeros(N * c.world, dtype=dtype, device=c.device)
    work = _AG_SINGLE(out, _values(c.rank, N, dtype).to(c.device, copy=True), group=c.group, async_op=async_op)
    if async_op:
        work.wait()
    _check(out, torch.cat([_values(r, N, dtype) for r in range(c.world)]))


def _all_to_all(c: Ctx, dtype: torch.dtype) -> None:
    # chunk j of rank r's input goes to rank j; salt makes every (sender, receiver) chunk distinct.
    ins = [_values(c.rank, N, dtype, salt=j).to(c.device, copy=True) for j in range(c.world)]
    outs = [torch.zeros(N, dtype=dtype, device=c.device) for _ in range(c.world)]
    dist.all_to_all(outs, ins, group=c.group)
    for r, o in enumerate(outs):
        _check(o, _values(r, N, dtype, salt=c.rank), f"from rank {r}: ")


def _split(sender: int, receiver: int, even: bool) -> int:
    """Elements ``sender`` sends to ``receiver`` in the all_to_all_single cases."""
    return N if even else sender + 2 * receiver + 1


def _all_to_all_single(c: Ctx, dtype: torch.dtype, even: bool, async_op: bool = False) -> None:
    w = c.world
    send = [_split(c.rank, j, even) for j in range(w)]
    recv = [_split(j, c.rank, even) for j in range(w)]
    chunks = [_values(c.rank, send[j], dtype, salt=10 * j) for j in range(w)]
    out = torch.zeros(sum(recv), dtype=dtype, device=c.device)
    work = dist.all_to_all_single(
        out,
        torch.cat(chunks).to(c.device, copy=True),
        output_split_sizes=None if even else recv,
        input_split_sizes=None if even else send,
        group=c.group,
        async_op=async_op,
    )
    if async_op:
        work.wait()
    _check(out, torch.cat([_values(j, recv[j], dtype, salt=10 * c.rank) for j in range(w)]))


def _broadcast(c: Ctx, dtype: torch.dtype) -> None:
    src = c.world - 1  # not rank 0, so a backend that ignores src is caught
    t = _values(c.rank, N, dtype).to(c.device, copy=True)
    dist.broadcast(t, src=src, group=c.group)
    _check(t, _values(src, N, dtype))


def _gather(c: Ctx, dtype: torch.dtype) -> None:
    dst = c.world - 1
    outs = [torch.zeros(N, dtype=dtype, device=c.device) for _ in range(c.world)] if c.rank == dst else None
    dist.gather(_values(c.rank, N, dtype).to(c.device, copy=True), outs, dst=dst, group=c.group)
    for r, o in enumerate(outs or []):
        _check(o, _values(r, N, dtype), f"from rank {r}: ")


def _scatter(c: Ctx, dtype: torch.dtype) -> None:
    src = c.world - 1
    ins = [_values(src, N, dtype, salt=j).to(c.device, copy=True) for j in range(c.world)] if c.rank == src else None
    out = torch.zeros(N, dtype=dtype, device=c.device)
    dist.scatter(out, ins, src=src, group=c.group)
    _check(out, _values(src, N, dtype, salt=c.rank))


def _barrier(c: Ctx) -> None:
    dist.barrier(group=c.group)


def _send_recv(c: Ctx, dtype: torch.dtype) -> None:
    # Ring: send to the next rank, receive from the previous; even ranks send first so blocking calls pair up.
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    out = torch.zeros(N, dtype=dtype, device=c.device)
    payload = _values(c.rank, N, dtype).to(c.device, copy=True)
    g = c.group
    if c.rank % 2 == 0:
        dist.send(payload, group_dst=nxt, group=g)
        dist.recv(out, group_src=prv, group=g)
    else:
        dist.recv(out, group_src=prv, group=g)
        dist.send(payload, group_dst=nxt, group=g)
    _check(out, _values(prv, N, dtype))


def _isend_irecv(c: Ctx, dtype: torch.dtype) -> None:
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    out = torch.zeros(N, dtype=dtype, device=c.device)
    works = [dist.isend(_values(c.rank, N, dtype).to(c.device, copy=True), group_dst=nxt, group=c.group),
             dist.irecv(out, group_src=prv, group=c.group)]
    for w in works:
        w.wait()
    _check(out, _values(prv, N, dtype))


def _batch_isend_irecv(c: Ctx, dtype: torch.dtype) -> None:
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    out = torch.zeros(N, dtype=dtype, device=c.device)
    ops = [dist.P2POp(dist.isend, _values(c.rank, N, dtype).to(c.device, copy=True), group=c.group, group_peer=nxt),
           dist.P2POp(dist.irecv, out, group=c.group, group_peer=prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _check(out, _values(prv, N, dtype))


ReducingCase = Callable[[Ctx, torch.dtype, str], None]
PlainCase = Callable[[Ctx, torch.dtype], None]

REDUCING: dict[str, ReducingCase] = {
    "all_reduce": _all_reduce,
    "all_reduce(async_op)": lambda c, d, o: _all_reduce(c, d, o, async_op=True),
    "reduce": _reduce,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "reduce_scatter_tensor(async_op)": lambda c, d, o: _reduce_scatter_tensor(c, d, o, async_op=True),
}
PLAIN: dict[str, PlainCase] = {
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_gather_into_tensor(async_op)": lambda c, d: _all_gather_into_tensor(c, d, async_op=True),
    "all_to_all": _all_to_all,
    "all_to_all_single(even)": lambda c, d: _all_to_all_single(c, d, even=True),
    "all_to_all_single(uneven)": lambda c, d: _all_to_all_single(c, d, even=False),
    "all_to_all_single(uneven,async_op)": lambda c, d: _all_to_all_single(c, d, even=False, async_op=True),
    "broadcast": _broadcast,
    "gather": _gather,
    "scatter": _scatter,
    "send/recv": _send_recv,
    "isend/irecv": _isend_irecv,
    "batch_isend_irecv": _batch_isend_irecv,
}


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------


def _outcome(fn: Callable[[], None]) -> tuple[str, str]:
    """Run one case on this rank; return its status and a detail (wrong values, or a remark on odd ones)."""
    _REMARKS.clear()
    try:
        fn()
    except WrongResult as e:
        return "wrong result", str(e)
    except Exception as e:  # the point of the probe is to record whatever the backend raises
        lines = str(e).strip().splitlines() or [type(e).__name__]
        return f"error: {lines[0]}", ""
    return "ok", "; ".join(_REMARKS)


def _merge(per_rank: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """One status for the cell: any error beats a wrong result, which beats ok (lowest rank first)."""
    for prefix in ("error", "wrong result", "ok"):
        for rank, (status, detail) in enumerate(per_rank):
            if status.startswith(prefix) and (detail or prefix != "ok"):
                return status, f"rank {rank}: {detail}" if detail else ""
    return "ok", ""


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:
    # torch 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor (now *_single); the probe still calls
    # the old names on purpose, since that is what user code calls.
    warnings.filterwarnings("ignore", category=FutureWarning)
    world = args.world_size
    timeout = datetime.timedelta(seconds=args.timeout)
    device = torch.device(args.device, rank) if args.device != "cpu" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timeout)
    # Outcomes are compared over gloo so that the comparison never depends on the backend under test. Its
    # timeout is longer: a rank that failed early waits here while its peer sits out the case's timeout.
    control = dist.new_group(backend="gloo", timeout=max(4 * timeout, datetime.timedelta(seconds=60)))
    ctx = Ctx(rank, world, dist.group.WORLD, device)
    matrix: dict[str, dict[str, dict[str, str]]] = {}
    notes: dict[str, str] = {}

    def record(op: str, dtype: str, red: str, fn: Callable[[], None]) -> None:
        mine = _outcome(fn)
        per_rank: list[Any] = [None] * world
        dist.all_gather_object(per_rank, mine, group=control)
        status, detail = _merge(per_rank)
        matrix.setdefault(op, {}).setdefault(dtype, {})[red] = status
        if detail:
            notes[f"{op}/{dtype}/{red}"] = detail
        if len({s for s, _ in per_rank}) > 1:
            # The ranks disagree, so one may have left a half-finished collective behind: use a fresh group.
            ctx.group = dist.new_group(backend=args.backend, timeout=timeout)

    start = time.monotonic()
    only = set(args.ops.split(",")) if args.ops else None
    for op, case in REDUCING.items():
        if only and op not in only:
            continue
        for dname, dtype in DTYPES.items():
            for red in REDUCE_OPS:
                record(op, dname, red, lambda: case(ctx, dtype, red))  # noqa: B023 - called at once, in this iteration
    for op, plain in PLAIN.items():
        if only and op not in only:
            continue
        for dname, dtype in DTYPES.items():
            record(op, dname, NONE, lambda: plain(ctx, dtype))  # noqa: B023 - called at once, in this iteration
    if not only or "barrier" in only:
        record("barrier", NONE, NONE, lambda: _barrier(ctx))

    if rank == 0:
        result = {
            "meta": {"backend": args.backend, "device": args.device, "world_size": world,
                     "torch": torch.__version__, "seconds": round(time.monotonic() - start, 1)},
            "matrix": matrix,
            "notes": notes,
        }
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1, sort_keys=False)
        print(summarize(result))
    dist.barrier(group=control)
    dist.destroy_process_group()


def _compress(cells: list[tuple[str, str]]) -> str:
    """``[(dtype, redop)]`` -> ``"float32,float64{SUM,MAX} int8"``; a bare dtype means every reduce op."""
    by_dtype: dict[str, list[str]] = {}
    for dtype, red in cells:
        by_dtype.setdefault(dtype, []).append(red)
    by_reds: dict[tuple[str, ...], list[str]] = {}
    for dtype, reds in by_dtype.items():
        full = reds == [NONE] or len(reds) == len(REDUCE_OPS)
        by_reds.setdefault(() if full else tuple(reds), []).append(dtype)
    return " ".join(",".join(dts) + (f"{{{','.join(reds)}}}" if reds else "") for reds, dts in by_reds.items())


def summarize(result: dict[str, Any]) -> str:
    """Human summary: ops with identical outcomes share a paragraph listing what passes and each failure."""
    meta = result["meta"]
    lines = [f"{meta['backend']} on {meta['device']}, world size {meta['world_size']}, torch {meta['torch']}, "
             f"{meta['seconds']} s of collectives"]
    paragraphs: dict[str, list[str]] = {}
    for op, by_dtype in result["matrix"].items():
        groups: dict[str, list[tuple[str, str]]] = {}
        for dtype, by_red in by_dtype.items():
            for red, status in by_red.items():
                groups.setdefault(status, []).append((dtype, red))
        ok = groups.pop("ok", [])
        body = [f"  ok: {_compress(ok) if ok else 'nothing'}" + ("" if groups else "  (all)")]
        body += [f"  {status}: {_compress(cells)}" for status, cells in groups.items()]
        paragraphs.setdefault("\n".join(body), []).append(op)
    for body, ops in paragraphs.items():
        lines.append(", ".join(ops))
        lines.append(body)
    if result["notes"]:
        lines.append(f"notes ({len(result['notes'])}, first 5; all in the JSON):")
        lines += [f"  {k}: {v}" for k, v in list(result["notes"].items())[:5]]
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend to probe (default gloo)")
    parser.add_argument("--device", default="cpu", help="device type of the tensors: cpu or cuda")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--json", help="write the matrix to this path")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a stuck collective fails")
    parser.add_argument("--ops", default="", help="comma-separated subset of op names (default: all)")
    args = parser.parse_args(argv)
    # Threads would only compete for the few cores the ranks share.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(args, _free_port()), nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
