"""Rank bodies for a mixed-vendor world (tests/test_mixed.py, benchmarks/mixed.py): every collective on the world
against the value every rank can compute for itself, the links' bytes, the island's emulation parts.

Every rank's input is a function of its rank, so each rank knows what every collective must give.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

import xccl
from xccl.collectives._flight import FLIGHT
from xccl.collectives._groups import state_of
from xccl.collectives._mixed import MixedGroup

__all__ = ["collectives", "fault", "links_of_reduce_scatter", "refusals", "sub_groups", "time_all_reduce", "world_map"]


def _x(rank: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + rank


def _sum(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(ts).sum(0)


def world_map() -> tuple[str, list[tuple[str, list[int]]], list[str]]:
    """This rank's plugin, the islands (plugin, ranks) and every rank's plugin, as the world's map says."""
    w = xccl.get_world()
    m = w.map
    if m is None:
        raise RuntimeError("no world map")
    return w.plugin, [(i.plugin, list(i.ranks)) for i in m.islands], list(m.plugins)


def collectives() -> list[str]:
    """Every collective on the world, through ``torch.distributed`` (xccl's c10d group) and ``xccl.*``; the
    names of those whose result differs from the reference (empty: all equal)."""
    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.shape != want.shape or not torch.allclose(got, want):
            bad.append(name)

    for size in (8, 7, 1):  # divisible by the island size (hierarchical), not (through the leaders), tiny
        t = _x(r, size)
        dist.all_reduce(t)
        check(f"all_reduce sum {size}", t, _sum([_x(q, size) for q in range(n)]))
        t = _x(r, size)
        xccl.all_reduce(t, op=dist.ReduceOp.MAX)
        check(f"xccl.all_reduce max {size}", t, _x(n - 1, size))
        t = _x(r, size)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(f"all_reduce avg {size}", t, _sum([_x(q, size) for q in range(n)]) / n)
    full = [_x(q, 4 * n) for q in range(n)]
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, full[r])
    check("reduce_scatter_tensor", out, _sum(full)[4 * r:4 * r + 4])
    out = torch.empty(4)
    dist.reduce_scatter(out, list(full[r].view(n, 4).unbind(0)))
    check("reduce_scatter", out, _sum(full)[4 * r:4 * r + 4])
    got = torch.empty(3 * n)
    dist.all_gather_into_tensor(got, _x(r, 3))
    check("all_gather_into_tensor", got, torch.cat([_x(q, 3) for q in range(n)]))
    lst = [torch.empty(3) for _ in range(n)]
    dist.all_gather(lst, _x(r, 3))
    check("all_gather", torch.stack(lst), torch.stack([_x(q, 3) for q in range(n)]))
    for root in range(n):
        t = _x(r, 5)
        dist.broadcast(t, src=root)
        check(f"broadcast from {root}", t, _x(root, 5))
    t = _x(r, 5)
    dist.reduce(t, dst=n - 1)
    check("reduce", t, _sum([_x(q, 5) for q in range(n)]) if r == n - 1 else _x(r, 5))
    inp = _x(r, 2 * n)
    out = torch.empty(2 * n)
    dist.all_to_all_single(out, inp)
    check("all_to_all_single", out, torch.cat([_x(q, 2 * n)[2 * r:2 * r + 2] for q in range(n)]))
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, list(inp.view(n, 2).unbind(0)))
    check("all_to_all", torch.cat(outs), torch.cat([_x(q, 2 * n)[2 * r:2 * r + 2] for q in range(n)]))
    gl = [torch.empty(3) for _ in range(n)] if r == 0 else None
    # xccl.gather, not dist.gather: torch_npu replaces dist.gather on the Ascend ranks (its patch, reproduced by
    # the simulation), so the islands would call different collectives.
    xccl.gather(_x(r, 3), gl, dst=0)
    if gl is not None:
        check("gather", torch.stack(gl), torch.stack([_x(q, 3) for q in range(n)]))
    t = torch.empty(3)
    dist.scatter(t, [_x(q, 3) for q in range(n)] if r == 1 else None, src=1)
    check("scatter", t, _x(r, 3))
    t = torch.empty(4)
    if r % 2 == 0:
        dist.send(_x(r, 4), dst=r + 1)
    else:
        dist.recv(t, src=r - 1)
        check("send/recv", t, _x(r - 1, 4))
    dist.barrier()
    return bad


def links_of_reduce_scatter(numel: int) -> dict[str, Any]:
    """One reduce_scatter_tensor of ``numel`` floats per rank on the world: the bytes this rank put on each link,
    and the flight recorder's island entries (op and emulation parts) of the call."""
    n = dist.get_world_size()
    world = state_of()
    if not isinstance(world, MixedGroup):
        raise RuntimeError("the world is not a mixed group")
    parts = world.islands
    island, cross = parts.links.island, parts.links.cross
    out = torch.empty(numel // n)
    dist.reduce_scatter_tensor(out, torch.ones(numel))
    flight = FLIGHT.ring
    name = world.island_state.name
    entries = [(e.op, list(e.parts or [])) for e in (flight.entries() if flight is not None else [])
               if getattr(e.group, "name", None) == name and e.op == "reduce_scatter_tensor"]
    return {"island": parts.links.island - island, "cross": parts.links.cross - cross, "entries": entries[-1:],
            "ok": bool(torch.all(out == n))}


def fault(victim: int) -> dict[str, Any]:
    """``victim`` dies (SIGKILL); every other rank runs all_reduce on the world until it fails, and reports the
    error's class names and its op and group."""
    rank = dist.get_rank()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # the victim is gone before the survivors call
    t = torch.ones(1 << 12)
    started = time.monotonic()
    try:
        for _ in range(100_000):
            dist.all_reduce(t)
    except Exception as exc:
        return {"types": [c.__name__ for c in type(exc).__mro__], "op": getattr(exc, "op", None),
                "group": getattr(exc, "group", None), "after": time.monotonic() - started}
    return {"types": ["no error"]}


def time_all_reduce(sizes: list[int], warmup: int, iters: int) -> dict[str, Any]:
    """benchmarks/mixed.py: for each size (bytes), the hierarchical all_reduce on the world against one flat gloo
    all_reduce over every rank, interleaved round by round; per variant this rank's times (seconds) and the bytes
    it put into cross-island collectives per call."""
    world = state_of()
    if not isinstance(world, MixedGroup):
        raise RuntimeError("the world is not a mixed group")
    parts = world.islands
    flat = dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        times: dict[str, list[float]] = {"hierarchical": [], "flat gloo": []}
        cross: dict[str, int] = {}
        for i in range(warmup + iters):
            for name in (("hierarchical", "flat gloo") if i % 2 == 0 else ("flat gloo", "hierarchical")):
                dist.barrier(group=flat)
                before = parts.links.cross
                start = time.perf_counter()
                if name == "hierarchical":
                    dist.all_reduce(t)
                else:
                    dist.all_reduce(t, group=flat)
                took = time.perf_counter() - start
                # A flat all_reduce puts the whole tensor into the host (cross-island) collective.
                cross[name] = parts.links.cross - before if name == "hierarchical" else t.numel() * 4
                t.fill_(1.0)
                if i >= warmup:
                    times[name].append(took)
        out[str(nbytes)] = {"times": times, "cross": cross}
    return out


def sub_groups() -> dict[str, Any]:
    """A group inside one island ([0, 1]) and one across islands ([1, 2]), made by every rank: which is composed,
    and their all_reduce results on their members."""
    r = dist.get_rank()
    inside, across = xccl.new_group([0, 1]), xccl.new_group([1, 2])
    out: dict[str, Any] = {}
    for name, g, members in (("inside", inside, (0, 1)), ("across", across, (1, 2))):
        if r in members:
            t = torch.full((6,), float(r + 1))
            dist.all_reduce(t, group=g)
            out[name] = {"composed": isinstance(state_of(g), MixedGroup), "value": t[0].item()}
    return out


def refusals() -> dict[str, Any]:
    """Under ``fallback="error"``: what reduce_scatter_tensor raises on the world (Sophgo's island could only
    emulate its part), and whether all_reduce (which then takes the leaders' path) is still right."""
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    try:
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n))
        out["reduce_scatter_tensor"] = "ran"
    except Exception as exc:
        out["reduce_scatter_tensor"] = [type(exc).__name__, str(exc)]
    t = _x(r, 8)
    dist.all_reduce(t)
    out["all_reduce ok"] = bool(torch.allclose(t, _sum([_x(q, 8) for q in range(n)])))
    return out


def compiled() -> dict[str, Any]:
    """xccl's collectives inside ``torch.compile`` on the world (a group spanning islands): what each raises at
    trace time, and whether the world still runs its eager all_reduce right afterwards (no rank left waiting)."""
    import torch._dynamo

    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        xccl.all_reduce(t)
        return t * 1

    def reduce_scatter(t: torch.Tensor) -> torch.Tensor:
        o = torch.empty(t.numel() // n)
        xccl.reduce_scatter_tensor(o, t)
        return o

    for name, fn, size in (("all_reduce", all_reduce, 8), ("reduce_scatter_tensor", reduce_scatter, 2 * n)):
        torch._dynamo.reset()
        try:
            torch.compile(fn, backend="eager", fullgraph=True)(_x(r, size))
            out[name] = "ran"
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc)]
    t = _x(r, 8)
    dist.all_reduce(t)
    out["eager all_reduce ok"] = bool(torch.allclose(t, _sum([_x(q, 8) for q in range(n)])))
    return out


def fused() -> list[str]:
    """The fused matmul + collective ops on the world (a group spanning islands, where only Ascend has native
    kernels), at shapes and a dtype Ascend's MC2 kernels take (float16, k = 256): the names of those whose result
    differs from the unfused reference (empty: all equal)."""
    r, n = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    a_all = [torch.randn(4 * n, 256, generator=gen).div(16).half() for _ in range(n)]
    b = torch.randn(256, 8, generator=gen).div(16).half()
    bad: list[str] = []

    def close(got: torch.Tensor, want: torch.Tensor) -> bool:
        return got.shape == want.shape and bool(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2))

    rows = slice(r * 4, (r + 1) * 4)
    total = torch.stack([a.float() @ b.float() for a in a_all]).sum(0)
    if not close(xccl.mm_reduce_scatter(a_all[r], b), total[rows]):
        bad.append("mm_reduce_scatter")
    out, gathered = xccl.all_gather_mm(a_all[r][:4].contiguous(), b)
    want = torch.cat([a[:4] for a in a_all])
    if not (close(gathered, want) and close(out, want.float() @ b.float())):
        bad.append("all_gather_mm")
    if not close(xccl.mm_all_reduce(a_all[r], b), total):
        bad.append("mm_all_reduce")
    return bad


def torch_gather(dst: int) -> list[list[float]] | None:
    """``torch.distributed.gather`` from every rank: on the Ascend ranks it is torch_npu's replacement (its root's
    sizes broadcast first, then an all_gather), on the others torch's own (the group's gather)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((3,), float(rank))
    lst = [torch.empty(3) for _ in range(n)] if rank == dst else None
    dist.gather(t, lst, dst=dst)
    if lst is None:
        return None
    return [x.tolist() for x in lst]
