"""Simulated Sophgo worlds of 2 and 4 ranks: every public collective against a reference each rank computes.

The ranks run the plugin's own code path (chip map, CHIP_MAP, set_device, ProcessGroupSCCLOptions, the ``sccl``
process group) with simulated chips, over real gloo process groups in a :class:`~xccl.testing.RankPool`.
Bodies are module-level functions run on every rank; each raises AssertionError on a wrong value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.runtime import vendor_group

SIM = {"XCCL_SIMULATE": "sophgo"}
F32, BF16, I32, I64, F64, BOOL = torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.float64, torch.bool

# ---------------------------------------------------------------------------------------------------------------
# Helpers run on the ranks
# ---------------------------------------------------------------------------------------------------------------


def _me() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank-dependent values that stay exact in every dtype used here (small integers; bool alternates)."""
    base = torch.arange(numel) % 5 + rank + 1
    if dtype is BOOL:
        return (base + rank) % 2 == 0
    return base.to(dtype)


def _reduce_ref(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """Reference reduction in rank order, in float64/int64 so that the reference itself does not round."""
    dtype = tensors[0].dtype
    wide = [t.to(torch.float64 if dtype.is_floating_point else torch.int64) for t in tensors]
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = {
        "sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
    }[op]
    acc = wide[0].clone()
    for t in wide[1:]:
        acc = combine(acc, t)
    if op == "avg":
        acc = acc / len(wide) if dtype.is_floating_point else torch.div(acc, len(wide), rounding_mode="trunc")
    return acc.to(dtype) if dtype is not BOOL else acc.bool()


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()} ({got.dtype}), want {want.tolist()} ({want.dtype})")


_OPS = {"sum": xccl.ReduceOp.SUM, "product": xccl.ReduceOp.PRODUCT, "min": xccl.ReduceOp.MIN,
        "max": xccl.ReduceOp.MAX, "avg": xccl.ReduceOp.AVG}

# ---------------------------------------------------------------------------------------------------------------
# Bodies: one per public collective
# ---------------------------------------------------------------------------------------------------------------


def all_reduce(dtype: torch.dtype, op: str, async_op: bool = False) -> None:
    rank, n = _me()
    t = _data(rank, 6, dtype)
    work = xccl.all_reduce(t, _OPS[op], async_op=async_op)
    if async_op:
        work.wait()
    _same(t, _reduce_ref([_data(r, 6, dtype) for r in range(n)], op), f"all_reduce {op}")


def reduce(dtype: torch.dtype, op: str) -> None:
    rank, n = _me()
    t = _data(rank, 5, dtype)
    xccl.reduce(t, dst=n - 1, op=_OPS[op])
    if rank == n - 1:
        _same(t, _reduce_ref([_data(r, 5, dtype) for r in range(n)], op), f"reduce {op}")


def broadcast(dtype: torch.dtype) -> None:
    rank, n = _me()
    src = 1 % n
    t = _data(rank, 7, dtype)
    xccl.broadcast(t, src=src)
    _same(t, _data(src, 7, dtype), "broadcast")


def all_gather(dtype: torch.dtype) -> None:
    rank, n = _me()
    outs = [torch.empty(3, dtype=dtype) for _ in range(n)]
    xccl.all_gather(outs, _data(rank, 3, dtype))
    for r, o in enumerate(outs):
        _same(o, _data(r, 3, dtype), f"all_gather[{r}]")


def all_gather_into_tensor(dtype: torch.dtype) -> None:
    rank, n = _me()
    out = torch.empty(n * 4, dtype=dtype)
    xccl.all_gather_into_tensor(out, _data(rank, 4, dtype))
    _same(out, torch.cat([_data(r, 4, dtype) for r in range(n)]), "all_gather_into_tensor")


def reduce_scatter(dtype: torch.dtype, op: str) -> None:
    rank, n = _me()
    ins = [_data(rank + 10 * j, 3, dtype) for j in range(n)]
    out = torch.empty(3, dtype=dtype)
    xccl.reduce_scatter(out, ins, _OPS[op])
    _same(out, _reduce_ref([_data(r + 10 * rank, 3, dtype) for r in range(n)], op), f"reduce_scatter {op}")


def reduce_scatter_tensor(dtype: torch.dtype, op: str, async_op: bool = False) -> None:
    rank, n = _me()
    inp = _data(rank, 4 * n, dtype)
    out = torch.empty(4, dtype=dtype)
    work = xccl.reduce_scatter_tensor(out, inp, _OPS[op], async_op=async_op)
    if async_op:
        work.wait()
    want = _reduce_ref([_data(r, 4 * n, dtype)[4 * rank: 4 * rank + 4] for r in range(n)], op)
    _same(out, want, f"reduce_scatter_tensor {op}")


def all_to_all(dtype: torch.dtype, uneven: bool) -> None:
    rank, n = _me()
    # chunk (i -> j) has size 1 + (i + j) % 3 when uneven, 2 otherwise.
    size = (lambda i, j: 1 + (i + j) % 3) if uneven else (lambda i, j: 2)
    ins = [_data(100 * rank + j, size(rank, j), dtype) for j in range(n)]
    outs = [torch.empty(size(j, rank), dtype=dtype) for j in range(n)]
    xccl.all_to_all(outs, ins)
    for j, o in enumerate(outs):
        _same(o, _data(100 * j + rank, size(j, rank), dtype), f"all_to_all[{j}]")


def all_to_all_single(dtype: torch.dtype, uneven: bool) -> None:
    rank, n = _me()
    size = (lambda i, j: 1 + (i + 2 * j) % 3) if uneven else (lambda i, j: 2)
    isz, osz = [size(rank, j) for j in range(n)], [size(j, rank) for j in range(n)]
    inp = torch.cat([_data(100 * rank + j, isz[j], dtype) for j in range(n)]).reshape(-1, 1).repeat(1, 2)
    out = torch.empty(sum(osz), 2, dtype=dtype)
    xccl.all_to_all_single(out, inp, osz if uneven else None, isz if uneven else None)
    want = torch.cat([_data(100 * j + rank, osz[j], dtype) for j in range(n)]).reshape(-1, 1).repeat(1, 2)
    _same(out, want, "all_to_all_single")


def gather(dtype: torch.dtype) -> None:
    rank, n = _me()
    dst = n - 1
    lst = [torch.empty(3, dtype=dtype) for _ in range(n)] if rank == dst else None
    xccl.gather(_data(rank, 3, dtype), lst, dst=dst)
    if lst is not None:
        for r, t in enumerate(lst):
            _same(t, _data(r, 3, dtype), f"gather[{r}]")


def scatter(dtype: torch.dtype) -> None:
    rank, n = _me()
    out = torch.empty(3, dtype=dtype)
    lst = [_data(50 + r, 3, dtype) for r in range(n)] if rank == 0 else None
    xccl.scatter(out, lst, src=0)
    _same(out, _data(50 + rank, 3, dtype), "scatter")


def barrier() -> None:
    xccl.barrier()


def send_recv(dtype: torch.dtype, nonblocking: bool) -> None:
    rank, n = _me()
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(5, dtype=dtype)
    if nonblocking:
        works = [xccl.isend(_data(rank, 5, dtype), right), xccl.irecv(got, left)]
        for w in works:
            w.wait()
    elif rank % 2 == 0:  # even ranks send first, odd ranks receive first: no cycle of blocked sends
        xccl.send(_data(rank, 5, dtype), right)
        xccl.recv(got, left)
    else:
        xccl.recv(got, left)
        xccl.send(_data(rank, 5, dtype), right)
    _same(got, _data(left, 5, dtype), "recv")


def all_gather_into_tensor_uneven(dtype: torch.dtype) -> None:
    rank, n = _me()
    sizes = [1 + r % 3 for r in range(n)]
    out = torch.empty(sum(sizes), 2, dtype=dtype)
    mine = _data(rank, sizes[rank], dtype).reshape(-1, 1).repeat(1, 2)
    xccl.all_gather_into_tensor_uneven(out, mine, sizes)
    want = torch.cat([_data(r, sizes[r], dtype) for r in range(n)]).reshape(-1, 1).repeat(1, 2)
    _same(out, want, "all_gather_into_tensor_uneven")


def reduce_scatter_tensor_uneven(dtype: torch.dtype, op: str) -> None:
    rank, n = _me()
    sizes = [1 + r % 3 for r in range(n)]
    inp = _data(rank, sum(sizes), dtype)
    out = torch.empty(sizes[rank], dtype=dtype)
    xccl.reduce_scatter_tensor_uneven(out, inp, sizes, _OPS[op])
    lo = sum(sizes[:rank])
    want = _reduce_ref([_data(r, sum(sizes), dtype)[lo: lo + sizes[rank]] for r in range(n)], op)
    _same(out, want, "reduce_scatter_tensor_uneven")


def all_to_all_v(dtype: torch.dtype) -> None:
    rank, n = _me()
    matrix = [[(i + 2 * j) % 3 + 1 for j in range(n)] for i in range(n)]
    inp = torch.cat([_data(100 * rank + j, matrix[rank][j], dtype) for j in range(n)])
    out = torch.empty(sum(row[rank] for row in matrix), dtype=dtype)
    xccl.all_to_all_v(out, inp, matrix)
    _same(out, torch.cat([_data(100 * i + rank, matrix[i][rank], dtype) for i in range(n)]), "all_to_all_v")


# (id, body, args): every public collective, with SCCL's gaps covered by emulation.
CASES: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
    *[(f"all_reduce-{op}-{str(dt)[6:]}", all_reduce, (dt, op))
      for op in ("sum", "product", "min", "max", "avg") for dt in (F32, I64)],
    ("all_reduce-sum-bfloat16", all_reduce, (BF16, "sum")),
    ("all_reduce-max-bool", all_reduce, (BOOL, "max")),
    ("all_reduce-async", all_reduce, (F32, "sum", True)),
    ("reduce-sum", reduce, (F32, "sum")),
    # float64, which SCCL moves as int64 but cannot reduce: gathered, reduced by xccl in rank order (exact).
    *[(f"all_reduce-{op}-float64", all_reduce, (F64, op)) for op in ("sum", "max", "avg", "product")],
    ("reduce-sum-float64", reduce, (F64, "sum")),
    ("reduce-avg-int32", reduce, (I32, "avg")),
    *[(f"broadcast-{str(dt)[6:]}", broadcast, (dt,)) for dt in (F32, I64, BOOL, F64)],
    ("all_gather", all_gather, (F32,)),
    ("all_gather-float64", all_gather, (F64,)),
    ("all_gather_into_tensor", all_gather_into_tensor, (BF16,)),
    ("all_gather_into_tensor-float64", all_gather_into_tensor, (F64,)),
    *[(f"reduce_scatter_tensor-{op}-{str(dt)[6:]}", reduce_scatter_tensor, (dt, op))
      for op in ("sum", "max", "avg") for dt in (F32, I64, F64)],
    ("reduce_scatter_tensor-product", reduce_scatter_tensor, (I32, "product")),
    ("reduce_scatter_tensor-min-bool", reduce_scatter_tensor, (BOOL, "min")),
    ("reduce_scatter_tensor-async", reduce_scatter_tensor, (F32, "sum", True)),
    ("reduce_scatter-sum", reduce_scatter, (F32, "sum")),
    ("reduce_scatter-avg-float64", reduce_scatter, (F64, "avg")),
    ("all_to_all-even", all_to_all, (F32, False)),
    ("all_to_all-uneven", all_to_all, (I64, True)),
    ("all_to_all_single-even", all_to_all_single, (F32, False)),
    ("all_to_all_single-uneven", all_to_all_single, (BF16, True)),
    ("all_to_all_single-uneven-float64", all_to_all_single, (F64, True)),
    ("gather", gather, (F32,)),
    ("scatter", scatter, (I32,)),
    ("barrier", barrier, ()),
    ("send_recv", send_recv, (F32, False)),
    ("isend_irecv", send_recv, (F64, True)),
    ("all_gather_into_tensor_uneven", all_gather_into_tensor_uneven, (F32,)),
    ("reduce_scatter_tensor_uneven", reduce_scatter_tensor_uneven, (F32, "sum")),
    ("all_to_all_v", all_to_all_v, (I32,)),
]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("body", "args"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_collective_matches_reference(rank_pools: Any, world_size: int, body: Callable[..., None],
                                      args: tuple[Any, ...]) -> None:
    rank_pools.get(world_size, env=SIM).run_ok(body, *args)


# ---------------------------------------------------------------------------------------------------------------
# The simulated world: the plugin's own path, and SCCL's rules enforced
# ---------------------------------------------------------------------------------------------------------------


def world_facts() -> dict[str, Any]:
    from xccl_sophgo._sdk import current_simulated_chip

    from xccl.plugin._sim import simulated_backend_of

    world = xccl.get_world()
    return {
        "plugin": world.plugin, "simulate": world.simulate, "backend": world.backend, "pg": dist.get_backend(),
        "profile": simulated_backend_of().vendor_name,  # type: ignore[union-attr]
        "device": str(world.device), "chip": current_simulated_chip(), "CHIP_MAP": os.environ["CHIP_MAP"],
        "chip_map": list(dist.group.WORLD.pg_options.chip_map),  # type: ignore[union-attr]
        "comm_name": xccl.comm_name(),
    }


def test_world_runs_the_plugin_path(rank_pools: Any) -> None:
    facts = rank_pools.get(4, env=SIM).run_ok(world_facts)
    for rank, f in enumerate(facts):
        assert (f["plugin"], f["simulate"], f["backend"], f["profile"]) == ("sophgo", True, "sccl", "ProcessGroupSCCL")
        assert f["pg"] == "xccl_sccl"  # the world's group is xccl's, over the simulated SCCL group
        # No map given: the board's C2C ring of 4 chips (Sophgo's [1,0,2,3] walked from chip 0), not the identity.
        ring = [0, 1, 3, 2]
        assert (f["device"], f["chip"], f["CHIP_MAP"], f["chip_map"]) == ("cpu", ring[rank], "0,1,3,2", ring)
    assert len({f["comm_name"] for f in facts}) == 1
    assert facts[0]["comm_name"].startswith("sccl:") and facts[0]["comm_name"].endswith(":0,1,3,2")


def sub_group(ranks: list[int]) -> dict[str, Any] | None:
    rank, _ = _me()
    group = xccl.new_group(ranks)
    if rank not in ranks:
        return None
    t = torch.full((3,), float(rank + 1))
    xccl.all_reduce(t, group=group)
    _same(t, torch.full((3,), float(sum(r + 1 for r in ranks))), "sub-group all_reduce")
    out = torch.empty(2)
    xccl.reduce_scatter_tensor(out, torch.arange(2.0 * len(ranks)), group=group)
    idx = sorted(ranks).index(rank)
    _same(out, torch.arange(2.0 * idx, 2.0 * idx + 2) * len(ranks), "sub-group reduce_scatter_tensor")
    return {"chip_map": list(group.pg_options.chip_map), "comm_name": xccl.comm_name(group)}


def test_sub_groups_get_the_nodes_chip_map(rank_pools: Any) -> None:
    """Ranks 1 and 3 drive chips 1 and 2 of the ring [0, 1, 3, 2], which are not linked: the members' chips are no
    ring, and SCCL runs a ring. Every group gets the node's whole map, as Sophgo's own code gives it."""
    pool = rank_pools.get(4, env=SIM)
    # Given out of order: torch orders a group's ranks ascending.
    facts = pool.run_ok(sub_group, [3, 1])
    assert facts[0] is None and facts[2] is None
    assert facts[1]["chip_map"] == facts[3]["chip_map"] == [0, 1, 3, 2]
    # The name still says the members' chips, in group-rank order.
    assert facts[1]["comm_name"] == facts[3]["comm_name"] and facts[1]["comm_name"].endswith(":1,2")
    other = pool.run_ok(sub_group, [0, 2])  # chips 0 and 3: not linked either
    assert other[0]["chip_map"] == [0, 1, 3, 2] and other[0]["comm_name"] != facts[1]["comm_name"]


def device_mesh_2x2() -> list[float]:
    """DeviceMesh builds its groups with torch.distributed.new_group: xccl's creator gives them the node's map."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank, _ = _me()
    out = []
    for dim in ("dp", "tp"):
        group = mesh.get_group(dim)
        assert list(group.pg_options.chip_map) == [0, 1, 3, 2], (dim, group.pg_options.chip_map)
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=group)
        out.append(t[0].item())
    return out


def test_device_mesh_groups_on_the_node_map(rank_pools: Any) -> None:
    """A 2 x 2 mesh on the ring [0, 1, 3, 2]: the dp groups {0, 2} and {1, 3} are chips 0, 3 and 1, 2 (not
    linked)."""
    sums = rank_pools.get(4, env=SIM).run_ok(device_mesh_2x2)
    assert sums == [[4.0, 3.0], [6.0, 3.0], [4.0, 7.0], [6.0, 7.0]]


#: The hardware check of sub-group chip maps (docs/vendors/sophgo.md), run here in simulation.
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sophgo_tp_dp.py"


def tp_dp_example() -> dict[str, Any]:
    """examples/sophgo_tp_dp.py's check on this world: TP groups of half the world, DP groups across them."""
    import runpy

    check = runpy.run_path(str(EXAMPLE))["check"]
    lines = check(xccl.get_world())
    maps = {g.group_name: list(g.pg_options.chip_map) for g in dist.distributed_c10d._world.pg_map
            if g is not dist.group.WORLD and hasattr(g, "pg_options")}
    return {"lines": lines, "maps": sorted(set(map(tuple, maps.values())))}


@pytest.mark.parametrize("world_size", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_tp_dp_example(rank_pools: Any, world_size: int) -> None:
    """Every group gets the node's map: on 8 ranks of the ring [0, 2, 6, 7, 3, 1, 5, 4] the TP groups of 4 drive
    chips 0, 2, 6, 7 (7 and 0 not linked) and the DP pairs chips 0 and 3, ...; on 4 ranks of [0, 1, 3, 2] the DP
    pairs drive chips 0, 3 and 1, 2 (not linked). 8 ranks are slow on a small machine."""
    ring = {4: (0, 1, 3, 2), 8: (0, 2, 6, 7, 3, 1, 5, 4)}[world_size]
    tp = world_size // 2
    out = rank_pools.get(world_size, env=SIM).run_ok(tp_dp_example, timeout=240)
    for rank, o in enumerate(out):
        first = rank - rank % tp
        assert [line.split(" ok")[0] for line in o["lines"]] == [
            f"rank {rank}: tp group {list(range(first, first + tp))}",
            f"rank {rank}: dp group {list(range(rank % tp, world_size, tp))}",
        ], o
        assert o["maps"] == [ring], o  # every group of the node, world and sub-groups: the node's map


def direct(call: str) -> None:
    """Call torch.distributed directly on the simulated sccl group (the vendor's own, not xccl's, which would
    emulate these): ops SCCL lacks must raise."""
    _, n = _me()
    if "sccl" not in _RAW:
        _RAW["sccl"] = vendor_group()
    g = _RAW["sccl"]
    x = torch.ones(2 * n)
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls: dict[str, Callable[[], Any]] = {
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty(2), list(x.split(2)), group=g),
        "reduce_scatter_tensor": lambda: rs_single(torch.empty(2), x, group=g),
        "all_to_all": lambda: dist.all_to_all(list(torch.empty(2 * n).split(2)), list(x.split(2)), group=g),
        "all_to_all_single-uneven": lambda: dist.all_to_all_single(
            torch.empty(2 * n), x, [1] * (n - 1) + [n + 1], [n + 1] + [1] * (n - 1), group=g),
        "all_reduce-float64": lambda: dist.all_reduce(x.double(), group=g),
        "all_reduce-avg": lambda: dist.all_reduce(x, dist.ReduceOp.AVG, group=g),
        "all_reduce-premul_sum": lambda: dist.all_reduce(x, dist._make_nccl_premul_sum(2.0), group=g),
        "reduce-bxor": lambda: dist.reduce(x.int(), 0, dist.ReduceOp.BXOR, group=g),
        "all_reduce-band": lambda: dist.all_reduce(x.int(), dist.ReduceOp.BAND, group=g),
    }
    calls[call]()


#: The vendor's own group of each pool process, made once (every rank makes it at its first call).
_RAW: dict[str, Any] = {}


DIRECT = {
    "reduce_scatter": "ProcessGroupSCCL does not support reduce_scatter",
    # c10d's base class names getBackendName(), "SCCL" (ProcessGroupSCCL.hpp:23,65-66).
    "reduce_scatter_tensor": "Backend SCCL does not support _reduce_scatter_base",
    "all_to_all": "Backend SCCL does not support alltoall",
    "all_to_all_single-uneven": "ignores all_to_all_single split sizes",
    "all_reduce-float64": "Invalid scalar type",
    # toSCCLReduceOp, ProcessGroupSCCL.cpp:361-375: one message per op it does not map.
    "all_reduce-avg": "Cannot use ReduceOp.AVG with SCCL",
    "all_reduce-premul_sum": "Cannot use ReduceOp.PREMUL_SUM with SCCL",
    "reduce-bxor": "Cannot use ReduceOp.BXOR with SCCL",
    "all_reduce-band": "Cannot use ReduceOp.BAND with SCCL",
}


@pytest.mark.parametrize(("call", "message"), list(DIRECT.items()), ids=list(DIRECT))
def test_ops_sccl_lacks_raise_on_the_process_group(rank_pools: Any, call: str, message: str) -> None:
    outs = rank_pools.get(2, env=SIM).run(direct, call)
    for out in outs:
        assert out.raised("SimulatedVendorError") and out.raised(RuntimeError), str(out)
        assert message in out.message, str(out)


def refused_by_xccl(what: str) -> None:
    if what == "all_reduce-int16":
        xccl.all_reduce(torch.ones(3, dtype=torch.int16))
    elif what == "all_reduce-band":
        xccl.all_reduce(torch.ones(3, dtype=I32), xccl.ReduceOp.BAND)


@pytest.mark.parametrize(("what", "error", "text"), [
    # SCCL does not even move int16; the message carries the table's note (its hint).
    ("all_reduce-int16", "UnsupportedCollective", "dtype int16 is not supported (the table's note: torch-tpu"),
    ("all_reduce-band", "UnsupportedCollective", "reduce op 'band' is not supported"),
])
def test_xccl_refuses_before_communicating(rank_pools: Any, what: str, error: str, text: str) -> None:
    for out in rank_pools.get(2, env=SIM).run(refused_by_xccl, what):
        assert out.raised(error) and text in out.message, str(out)


def unequal_all_gather(api: str) -> list[tuple[str, str]]:
    """A list all_gather of tensors whose shapes differ per rank: SCCL's kernel gathers equal sizes only, so the
    plugin's kernel raises ConstraintViolation (ProcessGroupSCCL.cpp, manifest B3) and the fallback policy decides.

    Returns the warnings raised (category, message); raises AssertionError on a wrong result.
    """
    import warnings

    rank, n = _me()
    gather = xccl.all_gather if api == "xccl" else dist.all_gather
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # warned once, however often called
            outs = [torch.full((1 + r, 2), -1.0) for r in range(n)]
            gather(outs, torch.full((1 + rank, 2), float(rank + 1)))
            for r, got in enumerate(outs):
                _same(got, torch.full((1 + r, 2), float(r + 1)), f"{api} all_gather from rank {r}")
    return [(w.category.__name__, str(w.message)) for w in caught if str(w.message).startswith("xccl:")]


def unequal_all_gather_refused() -> str:
    """Under fallback="error" the plugin's ConstraintViolation reaches the caller before any rank communicates."""
    rank, n = _me()
    try:
        xccl.all_gather([torch.empty(1 + r) for r in range(n)], torch.ones(1 + rank))
    except xccl.ConstraintViolation as exc:
        t = torch.ones(2)
        xccl.all_reduce(t)  # nothing was sent: the group is in step
        _same(t, torch.full((2,), float(n)), "all_reduce after the refusal")
        return f"{exc.constraint}: {exc}"
    raise AssertionError("no ConstraintViolation under fallback='error'")


@pytest.mark.parametrize(("world_size", "api"), [(2, "xccl"), (4, "torch")])
def test_unequal_all_gather_warns_then_emulates(rank_pools: Any, world_size: int, api: str) -> None:
    for caught in rank_pools.get(world_size, env=SIM).run_ok(unequal_all_gather, api):
        # Once per world (no other test of this pool breaks the constraint). The fallback's own building block,
        # all_gather_into_tensor_uneven, is emulated on SCCL too and may warn as such (once per world as well).
        refusals = [message for category, message in caught if category == "ConstraintFallbackWarning"]
        assert len(refusals) == 1, caught
        assert "constraint 'equal sizes'" in refusals[0] and "fallback='error'" in refusals[0], refusals
        assert "via all_gather_into_tensor_uneven" in refusals[0], refusals


def test_unequal_all_gather_emulates_silently(rank_pools: Any) -> None:
    for caught in rank_pools.get(2, env=SIM, fallback="emulate").run_ok(unequal_all_gather, "xccl"):
        assert caught == [], caught


def test_unequal_all_gather_refused_under_error(rank_pools: Any, rank_table: Path) -> None:
    pool = rank_pools.get(2, env={"RANK_TABLE_FILE": str(rank_table)}, vendor="sophgo", simulate=True,
                          fallback="error")
    for text in pool.run_ok(unequal_all_gather_refused):
        assert text.startswith("equal sizes:") and "equal-sized tensors only" in text, text


def make_group_directly(how: str) -> None:
    """Create sccl groups with torch.distributed itself: the simulated creator checks options as SCCL does."""
    from xccl_sophgo._sdk import SimulatedSCCLOptions

    rank, n = _me()
    opts = SimulatedSCCLOptions()
    opts.chip_map = {"short": [rank], "wrong-chip": list(range(n))[::-1], "empty": []}.get(how, [])
    dist.new_group(list(range(n)), backend="sccl", pg_options=None if how == "none" else opts)


@pytest.mark.parametrize(("how", "error", "text"), [
    ("none", "TypeError", "SCCL cannot be created without options"),
    ("short", "RuntimeError", "has 1 entries but the group has 2 ranks"),
    ("empty", "RuntimeError", "chip_map is empty"),
    ("wrong-chip", "RuntimeError", "selected chip"),
])
def test_sccl_creator_checks_options(rank_pools: Any, how: str, error: str, text: str) -> None:
    for out in rank_pools.get(2, env=SIM).run(make_group_directly, how):
        assert out.raised(error) and text in out.message, str(out)


# ---------------------------------------------------------------------------------------------------------------
# A world placed by a rank table, with fallback="error"
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rank_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xccl_sophgo._ranktable import generate_sophgo

    from xccl.plugin import dump

    path = tmp_path_factory.mktemp("sophgo") / "rank_table.json"
    dump(generate_sophgo([[6, 2]]), path)
    assert json.loads(path.read_text())["node_list"][0]["device_list"][1]["device_id"] == "2"
    return path


def strict_world() -> dict[str, Any]:
    facts = world_facts()
    t = torch.ones(4)
    xccl.all_reduce(t)
    _same(t, torch.full((4,), 2.0), "all_reduce")
    try:
        xccl.reduce_scatter_tensor(torch.empty(2), torch.ones(4))
    except xccl.UnsupportedCollective as exc:
        facts["reduce_scatter"] = str(exc)
    return facts


def test_rank_table_world_with_fallback_error(rank_pools: Any, rank_table: Path) -> None:
    pool = rank_pools.get(2, env={"RANK_TABLE_FILE": str(rank_table)}, vendor="sophgo", simulate=True,
                          fallback="error")
    facts = pool.run_ok(strict_world)
    assert [f["chip"] for f in facts] == [6, 2]
    assert all(f["CHIP_MAP"] == "6,2" and f["chip_map"] == [6, 2] for f in facts)
    assert facts[0]["comm_name"].endswith(":6,2")
    for f in facts:
        assert "reduce_scatter_tensor is not supported on sophgo" in f["reduce_scatter"]
        assert "fallback policy is 'error'" in f["reduce_scatter"]
