"""Ascend in simulation, at 2 and 4 real ranks: every public collective (uneven ones included) against a reference
each rank computes, HCCL's refusals, communicator names and ``hccl_config``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import xccl_ascend
from xccl_ascend._simprofile import SimHcclOptions

import xccl
from xccl.plugin import simulated_backend_of
from xccl.runtime import vendor_group

SIM = {"XCCL_SIMULATE": "ascend"}
R = xccl.ReduceOp


def make(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, so float sums are exact."""
    gen = torch.Generator().manual_seed(1000 * rank + salt)
    t = torch.randint(-4, 5, shape, generator=gen)
    return t > 0 if dtype == torch.bool else t.to(dtype)


def reduce_ref(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    if ts[0].dtype == torch.bool:
        stack = torch.stack(ts)
        return stack.any(0) if op in ("sum", "max") else stack.all(0)
    acc = ts[0].double() if ts[0].is_floating_point() else ts[0].long()
    for t in ts[1:]:
        t = t.double() if t.is_floating_point() else t.long()
        acc = {"sum": acc + t, "avg": acc + t, "product": acc * t, "min": torch.minimum(acc, t),
               "max": torch.maximum(acc, t)}[op]
    if op == "avg":
        acc = acc / len(ts) if acc.is_floating_point() else torch.div(acc, len(ts), rounding_mode="trunc")
    return acc.to(ts[0].dtype)


class Checker:
    def __init__(self) -> None:
        self.fails: list[str] = []

    def __call__(self, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        ok = (
            torch.allclose(got.double(), want.double(), rtol=1e-2 if got.dtype == torch.bfloat16 else 1e-6)
            if got.is_floating_point() else torch.equal(got, want)
        )
        if not ok or got.dtype != want.dtype:
            self.fails.append(f"{name}: got {got.tolist()} ({got.dtype}), want {want.tolist()} ({want.dtype})")


def body_collectives() -> list[str]:
    """Every public collective on the simulated HCCL world; returns the mismatches."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    check = Checker()
    if xccl.get_world().backend != "hccl" or dist.get_backend() != "xccl_hccl" or simulated_backend_of() is None:
        return [f"backend {dist.get_backend()!r}, simulated {simulated_backend_of()}"]

    for dt in (torch.float32, torch.bfloat16, torch.int32, torch.int8):
        ins = [make(i, (3, 2), dt) for i in range(n)]
        for op in ("sum", "product", "min", "max", "avg"):
            if dt == torch.bfloat16 and op == "product":
                continue  # CANN: no prod over bfloat16 on A2/A3, refused (test_ascend_dtypes.py)
            t = ins[r].clone()
            xccl.all_reduce(t, getattr(R, op.upper()))
            check(f"all_reduce {dt} {op}", t, reduce_ref(ins, op))
    t = make(r, (4,), torch.float32)
    xccl.all_reduce(t, dist._make_nccl_premul_sum(2.0))
    check("all_reduce premul_sum", t, 2 * reduce_ref([make(i, (4,), torch.float32) for i in range(n)], "sum"))
    bools = [make(i, (6,), torch.bool) for i in range(n)]
    for op in ("sum", "product", "max", "min"):
        t = bools[r].clone()
        xccl.all_reduce(t, getattr(R, op.upper()))
        check(f"all_reduce bool {op}", t, reduce_ref(bools, op))

    for dt in (torch.float64, torch.bool, torch.bfloat16):  # HCCL moves float64 and bool
        ins = [make(i, (2, 3), dt, 1) for i in range(n)]
        outs = [torch.empty_like(ins[0]) for _ in range(n)]
        xccl.all_gather(outs, ins[r])
        check(f"all_gather {dt}", torch.stack(outs), torch.stack(ins))
        big = torch.empty((2 * n, 3), dtype=dt)
        xccl.all_gather_into_tensor(big, ins[r])
        check(f"all_gather_into_tensor {dt}", big, torch.cat(ins))

    for dt, op in ((torch.float32, "sum"), (torch.float32, "avg"), (torch.int64, "max"), (torch.bool, "sum")):
        ins = [make(i, (2 * n, 2), dt, 2) for i in range(n)]
        full = reduce_ref(ins, op)
        out = torch.empty((2, 2), dtype=dt)
        xccl.reduce_scatter_tensor(out, ins[r], getattr(R, op.upper()))
        check(f"reduce_scatter_tensor {dt} {op}", out, full[2 * r : 2 * r + 2])
        out = torch.empty((2, 2), dtype=dt)
        xccl.reduce_scatter(out, list(ins[r].chunk(n)), getattr(R, op.upper()))
        check(f"reduce_scatter {dt} {op}", out, full[2 * r : 2 * r + 2])

    # Equal sizes: gloo's list all_to_all (under the simulation) refuses unequal ones, HCCL's takes them.
    ins = [[make(i, (2,), torch.float32, 10 * j) for j in range(n)] for i in range(n)]  # i sends ins[i][j] to j
    outs = [torch.empty(2) for _ in range(n)]
    xccl.all_to_all(outs, ins[r])
    check("all_to_all", torch.cat(outs), torch.cat([ins[i][r] for i in range(n)]))
    flat = [make(i, (2 * n,), torch.int32, 3) for i in range(n)]
    out = torch.empty(2 * n, dtype=torch.int32)
    xccl.all_to_all_single(out, flat[r])
    check("all_to_all_single", out, torch.cat([flat[i][2 * r : 2 * r + 2] for i in range(n)]))
    split = [[(i + j) % 3 for j in range(n)] for i in range(n)]  # rank i sends split[i][j] rows to j
    src = [make(i, (sum(split[i]), 2), torch.float32, 4) for i in range(n)]
    out = torch.empty((sum(split[i][r] for i in range(n)), 2))
    xccl.all_to_all_single(out, src[r], [split[i][r] for i in range(n)], split[r])
    want = torch.cat([src[i].split(split[i])[r] for i in range(n)])
    check("all_to_all_single uneven", out, want)

    t = make(r, (5,), torch.int64, 5)
    xccl.broadcast(t, src=n - 1)
    check("broadcast", t, make(n - 1, (5,), torch.int64, 5))
    t = make(r, (5,), torch.float32, 6)
    xccl.reduce(t, dst=0, op=R.MAX)
    if r == 0:
        check("reduce", t, reduce_ref([make(i, (5,), torch.float32, 6) for i in range(n)], "max"))
    lst = [torch.empty(3) for _ in range(n)] if r == 0 else None
    xccl.gather(make(r, (3,), torch.float32, 7), lst, dst=0)
    if lst is not None:
        check("gather", torch.stack(lst), torch.stack([make(i, (3,), torch.float32, 7) for i in range(n)]))
    t = torch.empty(3)
    xccl.scatter(t, [make(j, (3,), torch.float32, 8) for j in range(n)] if r == 0 else None, src=0)
    check("scatter", t, make(r, (3,), torch.float32, 8))
    xccl.barrier()
    got = torch.empty(4)
    works = [xccl.isend(make(r, (4,), torch.float32, 9), (r + 1) % n), xccl.irecv(got, (r - 1) % n)]
    for work in works:
        work.wait()
    check("isend/irecv ring", got, make((r - 1) % n, (4,), torch.float32, 9))
    if r < 2:
        t = make(r, (2,), torch.float32, 11)
        if r == 0:
            xccl.send(t, 1)
        else:
            xccl.recv(t, 0)
            check("send/recv", t, make(0, (2,), torch.float32, 11))
    check.fails += body_uneven(async_op=False) + body_uneven(async_op=True)
    return check.fails


def body_uneven(async_op: bool) -> list[str]:
    """The uneven collectives (torch_npu's extras) on the simulated world, sync or async."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    check = Checker()
    sizes = [1, 3, 1, 0][:n] if n > 2 else [1, 3]  # uneven, and a rank with no rows at 4 ranks
    ins = [make(i, (sizes[i], 3), torch.float32, 20) for i in range(n)]
    out = torch.empty((sum(sizes), 3))
    work = xccl.all_gather_into_tensor_uneven(out, ins[r], sizes, async_op=async_op)
    if async_op:
        work.wait()
    check(f"all_gather_into_tensor_uneven async={async_op}", out, torch.cat(ins))

    for dt, op in ((torch.float32, "sum"), (torch.int32, "max"), (torch.float32, "avg")):
        full_in = [make(i, (sum(sizes), 2), dt, 21) for i in range(n)]
        full = reduce_ref(full_in, op)
        out = torch.empty((sizes[r], 2), dtype=dt)
        work = xccl.reduce_scatter_tensor_uneven(out, full_in[r], sizes, getattr(R, op.upper()), async_op=async_op)
        if async_op:
            work.wait()
        lo = sum(sizes[:r])
        check(f"reduce_scatter_tensor_uneven {dt} {op} async={async_op}", out, full[lo : lo + sizes[r]])

    matrix = [[(3 * i + j) % 4 for j in range(n)] for i in range(n)]  # elements from rank i to rank j
    sends = [make(i, (sum(matrix[i]),), torch.bfloat16, 22) for i in range(n)]
    out = torch.empty(sum(row[r] for row in matrix), dtype=torch.bfloat16)
    work = xccl.all_to_all_v(out, sends[r], matrix, async_op=async_op)
    if async_op:
        work.wait()
    check(f"all_to_all_v async={async_op}", out, torch.cat([sends[i].split(matrix[i])[r] for i in range(n)]))
    return check.fails


def body_refusals() -> dict[str, str]:
    """What HCCL cannot do fails before communicating, with a typed error."""
    out: dict[str, str] = {}
    for name, call in {
        "band": lambda: xccl.all_reduce(torch.ones(2, dtype=torch.int32), R.BAND),
        "uint16 sum": lambda: xccl.all_reduce(torch.ones(2, dtype=torch.uint16)),
        "premul_sum int": lambda: xccl.all_reduce(torch.ones(2, dtype=torch.int32), dist._make_nccl_premul_sum(2.0)),
        # On the vendor's own group, HCCL's refusal; through xccl, a typed one before anything is sent.
        "raw recv_anysource": lambda: vendor_group().recv_anysource([torch.ones(1)], 0),
        "recv without src": lambda: xccl.recv(torch.ones(1)),
    }.items():
        try:
            call()
            out[name] = "ran"
        except Exception as exc:  # the test compares types and messages
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def body_comm_names() -> dict[str, Any]:
    """Communicator names: identical on every rank, stable, unique per group."""
    w = xccl.get_world()
    world = xccl.comm_name()
    names = {"world": world, "again": xccl.comm_name()}
    for lo in range(0, w.world_size, 2):  # every rank creates every group
        group = xccl.new_group([lo, lo + 1])
        if lo <= w.rank <= lo + 1:
            names["pair"] = xccl.comm_name(group)
    return names


def body_hccl_config() -> dict[str, Any]:
    """``hccl_config`` reaches the group's Options; a bad value fails as HCCL's TORCH_CHECK would."""
    xccl_ascend.set_hccl_config({"group_name": "tp_sim", "hccl_buffer_size": 200}, ranks=[0, 1])
    try:
        group = xccl.new_group([0, 1])
    finally:
        xccl_ascend.set_hccl_config(None, ranks=[0, 1])
    report: dict[str, Any] = {}
    if dist.get_rank() < 2:
        report["config"] = group.pg_options.hccl_config
        report["name"] = xccl.comm_name(group)
        report["torch_name"] = group.group_name  # the native HCCL group is created with the same group id
    try:
        dist.new_group(backend="hccl", pg_options=SimHcclOptions({"group_name": 123}))
        report["bad"] = "created"
    except RuntimeError as exc:
        report["bad"] = str(exc)
    return report


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_collective_matches_reference(rank_pools: Any, world_size: int) -> None:
    outs = rank_pools.get(world_size, env=SIM).run_ok(body_collectives, timeout=180)
    assert outs == [[]] * world_size, outs


def test_refusals_are_hccls(rank_pools: Any) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_refusals)
    assert outs[0] == outs[1]
    r = outs[0]
    assert r["band"].startswith("UnsupportedCollective: all_reduce is not supported on ascend: reduce op 'band'")
    assert r["uint16 sum"].startswith("UnsupportedCollective: all_reduce is not supported on ascend: dtype uint16")
    assert r["premul_sum int"].startswith("UnsupportedCollective")
    assert r["raw recv_anysource"] == "SimulatedVendorError: ProcessGroupHCCL does not support recv"
    assert r["recv without src"].startswith("UnsupportedCollective: recv_any_source is not supported on ascend")


@pytest.mark.parametrize("world_size", [2, 4])
def test_comm_names_unique_per_group(rank_pools: Any, world_size: int) -> None:
    outs = rank_pools.get(world_size, env=SIM).run_ok(body_comm_names)
    assert all(o["world"] == outs[0]["world"] == o["again"] for o in outs)
    pairs = [o["pair"] for o in outs]
    assert pairs[0] == pairs[1] and outs[0]["world"] not in pairs
    if world_size == 4:
        assert pairs[2] == pairs[3] and pairs[0] != pairs[2]


def test_hccl_config_reaches_the_group(rank_pools: Any) -> None:
    outs = rank_pools.get(2, env=SIM).run_ok(body_hccl_config)
    for o in outs:
        assert o["config"] == {"group_name": "tp_sim", "hccl_buffer_size": 200}
        # group_name is HCCL's hcclUdi; torch_npu names the communicator "group_name_" + torch's group name.
        assert o["name"] == f"group_name_{o['torch_name']}" != "tp_sim"
        assert o["bad"] == "Value type of group_name should be string."
