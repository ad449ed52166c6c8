#!/usr/bin/env python3
"""Settle on Ascend hardware what the graph column assumes about TorchAir and GE (issue 20, item 6).

Run under torchrun on one host with 2 NPUs (or simulated, where it must agree with the table)::

    torchrun --standalone --nproc-per-node 2 scripts/probe_torchair.py --json torchair.json
    XCCL_SIMULATE=ascend torchrun --standalone --nproc-per-node 2 scripts/probe_torchair.py

It compiles, with TorchAir's own backend (``torchair.get_npu_backend()``; ``xccl_ascend.sim_npu_backend()`` in
simulation) and no xccl graph form in between:

* every standard ``_c10d_functional`` collective for every dtype, and compares what GE accepted (compiled, ran and
  gave the eager result) with the Ascend graph column (native, cast in the graph, refused). ``conservative``
  means GE took a dtype the column casts or refuses (TorchAir's bundled IR prototypes lag CANN: the column could
  list it natively); ``WRONG`` means GE refused a dtype the column claims natively;
* ``xccl.send``/``recv`` with TorchAir's own backend, which must fail with ``UnsupportedCollective`` naming
  ``xccl.compile`` (the converters xccl registers through ``torchair.register_fx_node_ge_converter``);
* a send/recv ring and a bfloat16 average through ``xccl.compile``, which must give the eager result (GE keeps the
  program order under StableRDFS without xccl's order joins; graph send/recv need CANN 8.6.0).

Rank 0 prints a table and writes ``--json``; every rank exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import xccl
from xccl.plugin import Level, Mode

F = torch.ops._c10d_functional
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
          torch.uint8, torch.bool)
#: op name -> (the functional call on a tensor of the group, the matching eager call).
OPS: dict[str, tuple[Callable[[torch.Tensor, str], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {}


def _op(name: str) -> Callable[..., Any]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        OPS[name] = (fn, getattr(sys.modules[__name__], f"_eager_{name}"))
        return fn

    return register


def _eager_all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.MAX if x.dtype == torch.bool else dist.ReduceOp.SUM)
    return y


def _eager_all_gather_into_tensor(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0] * dist.get_world_size(),))
    dist.all_gather_into_tensor(out, x)
    return out


def _eager_broadcast(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    dist.broadcast(y, src=0)
    return y


def _eager_all_to_all_single(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


def _eager_reduce_scatter_tensor(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // dist.get_world_size(),))
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.MAX if x.dtype == torch.bool else dist.ReduceOp.SUM)
    return out


@_op("all_reduce")
def _all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    return F.wait_tensor(F.all_reduce(x, "max" if x.dtype == torch.bool else "sum", group))  # type: ignore[no-any-return]


@_op("all_gather_into_tensor")
def _all_gather(x: torch.Tensor, group: str) -> torch.Tensor:
    return F.wait_tensor(F.all_gather_into_tensor(x, dist.get_world_size(), group))  # type: ignore[no-any-return]


@_op("reduce_scatter_tensor")
def _reduce_scatter(x: torch.Tensor, group: str) -> torch.Tensor:
    red = "max" if x.dtype == torch.bool else "sum"
    return F.wait_tensor(F.reduce_scatter_tensor(x, red, dist.get_world_size(), group))  # type: ignore[no-any-return]


@_op("broadcast")
def _broadcast(x: torch.Tensor, group: str) -> torch.Tensor:
    return F.wait_tensor(F.broadcast(x, 0, group))  # type: ignore[no-any-return]


@_op("all_to_all_single")
def _all_to_all(x: torch.Tensor, group: str) -> torch.Tensor:
    splits = [x.shape[0] // dist.get_world_size()] * dist.get_world_size()
    return F.wait_tensor(F.all_to_all_single(x, splits, splits, group))  # type: ignore[no-any-return]


def _backend(world: Any) -> Callable[..., Any]:
    if world.simulate:
        import xccl_ascend

        return xccl_ascend.sim_npu_backend()
    import torch_npu  # noqa: F401, TID251 - installs the lazy torchair module
    import torchair  # noqa: TID251

    return torchair.get_npu_backend()  # type: ignore[no-any-return]


def _inner(exc: BaseException) -> BaseException:
    while getattr(exc, "inner_exception", None) is not None or exc.__cause__ is not None:
        exc = getattr(exc, "inner_exception", None) or exc.__cause__  # type: ignore[assignment]
    return exc


def _try(fn: Callable[[], Any]) -> tuple[Any, str]:
    try:
        return fn(), ""
    except Exception as exc:
        inner = _inner(exc)
        return None, f"{type(inner).__name__}: {inner}"


def _input(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    r, n = dist.get_rank(), dist.get_world_size()
    if dtype == torch.bool:
        return (torch.arange(2 * n) % (r + 2) == 0).to(device)
    return (torch.arange(2 * n) + r).to(dtype).to(device)


def _column(op: str, dtype: torch.dtype) -> str:
    res = xccl.capabilities().resolve(op, mode=Mode.GRAPH, dtype=dtype, reduce_op="max" if dtype == torch.bool and op
                                      in ("all_reduce", "reduce_scatter_tensor") else ("sum" if "reduce" in op else None))
    if res.level is Level.UNSUPPORTED:
        return "refused"
    return f"cast to {str(res.cast).removeprefix('torch.')}" if res.cast is not None else "native"


def probe_dtypes(world: Any, ops: list[str], dtypes: list[torch.dtype]) -> dict[str, dict[str, dict[str, str]]]:
    group = dist.group.WORLD.group_name  # type: ignore[union-attr]
    out: dict[str, dict[str, dict[str, str]]] = {}
    for name in ops:
        fn, eager = OPS[name]
        for dtype in dtypes:
            if world.rank == 0:
                print(f"probing {name} {dtype}", file=sys.stderr, flush=True)
            torch._dynamo.reset()
            x = _input(dtype, world.device)
            compiled = torch.compile(lambda t, f=fn: f(t, group), backend=_backend(world), fullgraph=True)
            got, err = _try(lambda c=compiled, t=x: c(t.clone()))
            if not err and not torch.equal(got, eager(x)):
                err = "wrong result"
            column = _column(name, dtype)
            verdict = ("WRONG" if err and column == "native" else
                       "conservative" if not err and column != "native" else "agrees")
            out.setdefault(name, {})[str(dtype).removeprefix("torch.")] = {
                "ge": err.splitlines()[0][:300] if err else "accepted", "column": column, "verdict": verdict}
    return out


def _exchange(t: torch.Tensor) -> torch.Tensor:
    got = torch.empty_like(t)
    if dist.get_rank() % 2 == 0:
        xccl.send(t, (dist.get_rank() + 1) % dist.get_world_size())
        xccl.recv(got, (dist.get_rank() - 1) % dist.get_world_size())
    else:
        xccl.recv(got, (dist.get_rank() - 1) % dist.get_world_size())
        xccl.send(t, (dist.get_rank() + 1) % dist.get_world_size())
    return got


def _bf16_avg(t: torch.Tensor) -> torch.Tensor:
    xccl.all_reduce(t, op=dist.ReduceOp.AVG)
    return t


def probe_paths(world: Any) -> dict[str, str]:
    x = torch.arange(4.0, device=world.device) + dist.get_rank()
    b = x.to(torch.bfloat16)
    out = {}
    torch._dynamo.reset()
    _, err = _try(lambda: torch.compile(_exchange, backend=_backend(world), fullgraph=True)(x))
    ok = err.startswith("UnsupportedCollective") and "xccl.compile" in err
    out["get_npu_backend + xccl.send"] = "ok" if ok else f"FAILED: expected UnsupportedCollective, got {err[:300] or 'no error'}"
    for name, fn, arg in (("xccl.compile ring", _exchange, x), ("xccl.compile bfloat16 avg", _bf16_avg, b)):
        torch._dynamo.reset()
        got, err = _try(lambda f=fn, a=arg: xccl.compile(f, fullgraph=True)(a.clone()))
        good = not err and torch.equal(got, fn(arg.clone()))
        out[name] = "ok" if good else f"FAILED: {err[:300] or 'wrong result'}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--ops", default=",".join(OPS), help="collectives to probe (default: all)")
    parser.add_argument("--dtypes", default=",".join(str(d).removeprefix("torch.") for d in DTYPES),
                        help="dtypes to probe (default: all)")
    args = parser.parse_args(argv)
    world = xccl.init(vendor="ascend")
    chosen = [getattr(torch, d) for d in args.dtypes.split(",") if d]
    dtypes, paths = probe_dtypes(world, [o for o in args.ops.split(",") if o], chosen), probe_paths(world)
    failed = any(c["verdict"] == "WRONG" for row in dtypes.values() for c in row.values()) or any(
        v != "ok" for v in paths.values())
    if world.rank == 0:
        print(f"{'collective':24} {'dtype':10} {'GE':48} {'xccl graph column':18} verdict")
        for op, row in dtypes.items():
            for dtype, cell in row.items():
                print(f"{op:24} {dtype:10} {cell['ge'][:48]:48} {cell['column']:18} {cell['verdict']}")
        for name, verdict in paths.items():
            print(f"{name}: {verdict}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"simulated": world.simulate, "dtypes": dtypes, "paths": paths}, f, indent=1)
    dist.barrier()  # every rank reports the same verdict: let rank 0 finish writing before any exits
    xccl.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
