"""``xccl bench``'s cases: per op, the buffers, the xccl call and the plain ``torch.distributed`` call.

Sizes follow nccl-tests (docs/cli.md, ``xccl bench``). The raw call is what ``torch.distributed`` alone would run
for the same result, on the vendor's own group (for xccl's uneven ops, the plain ``torch.distributed`` way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

import xccl

from ._bench_config import BenchError

__all__ = ["Case", "build_case"]


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


def build_case(
    op: str,
    nbytes: int,
    dtype: torch.dtype,
    n: int,
    rank: int,
    device: torch.device,
    raw_group: Any = None,
    xccl_group: Any = None,
) -> Case:
    """The buffers and calls for ``op`` moving about ``nbytes`` (rounded to what the op's layout allows).

    ``raw_group`` is the vendor's own group the raw ``torch.distributed`` calls run on (the world's group is
    xccl's, under which a raw call would be dispatched by xccl too); ``xccl_group`` the group of xccl's calls
    (``None``: the world; the raw group, which xccl adopts, to compare the two on one communicator).
    """
    g, xg = raw_group, xccl_group
    e = dtype.itemsize
    elems = max(1, nbytes // e)
    per = max(1, elems // n)  # one rank's chunk for the evenly split ops

    def z(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    def zs(count: int) -> list[torch.Tensor]:
        return [z(count) for _ in range(n)]

    def same(count: int, *args: Any, raw: Callable[..., Any] | None = None) -> Case:
        """``op`` called alike through xccl and ``raw`` (default: torch.distributed's function of that name)."""
        xfn, rfn = getattr(xccl, op), raw or getattr(dist, op)
        return Case(count * e, count, lambda: xfn(*args, group=xg), lambda: rfn(*args, group=g),
                    f"dist.{rfn.__name__}", [a for a in args if not isinstance(a, int)])

    if op == "all_reduce":
        return same(elems, z(elems))
    if op in ("broadcast", "reduce"):
        return same(elems, z(elems), 0)
    if op == "all_gather_into_tensor":
        return same(per * n, z(per * n), z(per), raw=getattr(dist, "all_gather_single", dist.all_gather_into_tensor))
    if op == "all_gather":
        return same(per * n, zs(per), z(per))
    if op == "reduce_scatter_tensor":
        return same(per * n, z(per), z(per * n), raw=getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor))
    if op == "reduce_scatter":
        return same(per * n, z(per), zs(per))
    if op == "all_to_all_single":
        return same(per * n, z(per * n), z(per * n))
    if op == "all_to_all":
        return same(per * n, zs(per), zs(per))
    if op in ("gather", "scatter"):
        return same(per * n, z(per), zs(per) if rank == 0 else None, 0)
    u = max(1, elems // (n * (n + 1) // 2))  # the uneven ops' unit: rank j holds u*(j+1), near ``elems`` in all
    if op in ("all_to_all_single_uneven", "all_to_all_v"):
        # rank i sends unit*(1 + (i+j) % n) elements to rank j: symmetric, so sends and receives match per rank.
        matrix = [[u * (1 + (i + j) % n) for j in range(n)] for i in range(n)]
        isz, osz = matrix[rank], [row[rank] for row in matrix]
        out, inp = z(sum(osz)), z(sum(isz))
        if op == "all_to_all_v":
            run = lambda: xccl.all_to_all_v(out, inp, matrix, group=xg)  # noqa: E731
        else:
            run = lambda: xccl.all_to_all_single(out, inp, osz, isz, group=xg)  # noqa: E731
        return Case(sum(isz) * e, sum(isz), run, lambda: dist.all_to_all_single(out, inp, osz, isz, group=g),
                    "dist.all_to_all_single with splits", [out, inp])
    sizes = [u * (j + 1) for j in range(n)]
    if op == "all_gather_into_tensor_uneven":
        out, inp = z(sum(sizes)), z(sizes[rank])
        # torch.distributed has no uneven all_gather into a tensor (gloo's list all_gather refuses uneven
        # sizes); the plain way is an all_to_all_single that sends this rank's rows to every peer.
        # The input repeated for every peer is built per call, as an emulation of the op would have to.
        return Case(sum(sizes) * e, sum(sizes), lambda: xccl.all_gather_into_tensor_uneven(out, inp, sizes, group=xg),
                    lambda: dist.all_to_all_single(out, inp.repeat(n), sizes, [sizes[rank]] * n, group=g),
                    "dist.all_to_all_single (own rows to every peer)", [out, inp])
    if op == "reduce_scatter_tensor_uneven":
        out, inp = z(sizes[rank]), z(sum(sizes))
        chunks = list(torch.split(inp, sizes))
        return Case(sum(sizes) * e, sum(sizes), lambda: xccl.reduce_scatter_tensor_uneven(out, inp, sizes, group=xg),
                    lambda: dist.reduce_scatter(out, chunks, group=g), "dist.reduce_scatter with uneven chunks",
                    [out, inp, chunks])
    if op == "sendrecv":
        send, recv = z(elems), z(elems)
        nxt, prv = (rank + 1) % n, (rank - 1) % n

        def ring(isend: Callable[..., Any], irecv: Callable[..., Any]) -> Callable[[], None]:
            def call() -> None:
                works = [irecv(recv, prv), isend(send, nxt)]
                for w in works:
                    w.wait()

            return call

        return Case(elems * e, elems, ring(partial(xccl.isend, group=xg), partial(xccl.irecv, group=xg)),
                    ring(partial(dist.isend, group=g), partial(dist.irecv, group=g)), "dist.isend/irecv", [send, recv])
    if op == "all_reduce_coalesced":
        ts = [z(max(1, elems // 2)), z(max(1, elems - elems // 2))]
        count = sum(x.numel() for x in ts)
        return Case(count * e, count, lambda: xccl.all_reduce_coalesced(ts, group=xg),
                    lambda: [dist.all_reduce(x, group=g) for x in ts], "dist.all_reduce per tensor", [ts])
    if op == "all_gather_coalesced":
        ins = [z(max(1, per // 2)), z(max(1, per - per // 2))]
        outs_l = [[torch.empty_like(x) for x in ins] for _ in range(n)]
        return Case(per * n * e, per * n, lambda: xccl.all_gather_coalesced(outs_l, ins, group=xg),
                    lambda: [dist.all_gather([row[i] for row in outs_l], x, group=g) for i, x in enumerate(ins)],
                    "dist.all_gather per tensor", [outs_l, ins])
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

        return Case(elems * e * (n - 1), elems * (n - 1),
                    fan_in(partial(xccl.recv, group=xg), partial(xccl.send, group=xg)),
                    fan_in(partial(dist.recv, group=g), partial(dist.send, group=g)), "dist.recv without src", [t])
    if op in ("barrier", "monitored_barrier"):
        return same(0)
    raise BenchError(f"unknown op {op!r}")
