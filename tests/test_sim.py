"""Tests of xccl.plugin._sim: simulated vendor backends, run as real two-process gloo worlds (no mocks).

Spawning a rank costs about two seconds (importing torch), so one spawn of two ranks runs every distributed check
in ``CHECKS``; each pytest test then reports one check's outcome on both ranks. Three simulated backends are
registered in the workers:

* ``sccl``: a Sophgo-like profile (manifest B3) with a chip-map options check; it is the default group;
* ``simall``: everything allowed, to prove that every entry point delegates to gloo and gives the right result;
* ``simnone``: everything refused with a message naming the ``Backend`` method, to prove that every entry point
  (eager and functional) reaches the gate, and reaches it under the right method name.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

import xccl.plugin._sim as sim
from xccl.plugin._sim import NATIVE_OP_KEYS, REDUCE_OP_NAMES, SimProfile, SimulatedVendorError

WORLD = 2
ALL_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                        torch.int32, torch.int64, torch.bool})
#: Seconds after which a collective stuck on a desynchronised peer fails instead of hanging the run.
PG_TIMEOUT = datetime.timedelta(seconds=30)
SPAWN_DEADLINE_S = 120.0


# ---------------------------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ChipMapOptions:
    """Stands in for ``torch_tpu.ProcessGroupSCCLOptions`` (manifest B2)."""

    chip_map: list[int] = field(default_factory=list)


def check_chip_map(options: object | None, group_rank: int, group_size: int) -> None:
    """The SCCL creator's checks: options are mandatory, and a non-empty chip map covers the group."""
    if not isinstance(options, ChipMapOptions):
        raise TypeError("createProcessGroupSCCL(): incompatible function arguments (pg_options is mandatory)")
    if options.chip_map and len(options.chip_map) < group_size:
        raise RuntimeError(f"chip_map has {len(options.chip_map)} entries, fewer than the group size {group_size}")


SCCL = SimProfile(
    backend="sccl",
    vendor_name="ProcessGroupSCCL",
    native_ops={
        "allreduce": None, "allgather": None, "_allgather_base": None, "alltoall_base": None, "broadcast": None,
        "reduce": None, "gather": None, "scatter": None, "barrier": None, "send": None, "recv": None,
        "reduce_scatter": "ProcessGroupSCCL does not support reduce_scatter",
    },
    dtypes=ALL_DTYPES - {torch.float64},
    reduce_ops=frozenset({"sum", "product", "min", "max"}),
    uneven_all_to_all=False,
    check_options=check_chip_map,
)
SIMALL = SimProfile("simall", "ProcessGroupALL", dict.fromkeys(NATIVE_OP_KEYS), ALL_DTYPES, REDUCE_OP_NAMES, True)
SIMNONE = SimProfile("simnone", "ProcessGroupNONE", {k: f"simnone lacks {k}" for k in NATIVE_OP_KEYS}, ALL_DTYPES,
                     REDUCE_OP_NAMES, True)


# ---------------------------------------------------------------------------------------------------------------
# Entry points: each runs one torch.distributed call on ``group`` and checks the result.
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    """One rank's view of the worlds under test."""

    rank: int
    sccl: dist.ProcessGroup
    simall: dist.ProcessGroup
    simnone: dist.ProcessGroup
    control: dist.ProcessGroup


def vals(rank: int, n: int = 4, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    """Rank-specific, position-specific values, small enough for every dtype."""
    return ((torch.arange(n) + 3 * rank + salt) % 5 + 1).to(dtype)


def ep_all_reduce(c: Ctx, g: dist.ProcessGroup) -> None:
    t = vals(c.rank)
    dist.all_reduce(t, group=g)
    torch.testing.assert_close(t, vals(0) + vals(1))


def ep_all_reduce_async(c: Ctx, g: dist.ProcessGroup) -> None:
    t = vals(c.rank)
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g, async_op=True)
    work.wait()
    torch.testing.assert_close(t, torch.maximum(vals(0), vals(1)))


def ep_all_reduce_coalesced(c: Ctx, g: dist.ProcessGroup) -> None:
    ts = [vals(c.rank), vals(c.rank, 3, salt=1)]
    dist.all_reduce_coalesced(ts, group=g)
    torch.testing.assert_close(ts[1], vals(0, 3, salt=1) + vals(1, 3, salt=1))


def ep_all_gather(c: Ctx, g: dist.ProcessGroup) -> None:
    outs = [torch.zeros(4) for _ in range(WORLD)]
    dist.all_gather(outs, vals(c.rank), group=g)
    torch.testing.assert_close(outs, [vals(r) for r in range(WORLD)])


def ep_all_gather_into_tensor(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4 * WORLD)
    dist.all_gather_into_tensor(out, vals(c.rank), group=g)
    torch.testing.assert_close(out, torch.cat([vals(r) for r in range(WORLD)]))


def ep_all_gather_base(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4 * WORLD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated alias; still an entry point users call
        dist._all_gather_base(out, vals(c.rank), group=g)
    torch.testing.assert_close(out, torch.cat([vals(r) for r in range(WORLD)]))


def ep_reduce_scatter(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4)
    dist.reduce_scatter(out, [vals(c.rank, salt=j) for j in range(WORLD)], group=g)
    torch.testing.assert_close(out, sum(vals(r, salt=c.rank) for r in range(WORLD)))


def ep_reduce_scatter_tensor(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4)
    dist.reduce_scatter_tensor(out, vals(c.rank, 4 * WORLD), group=g)
    torch.testing.assert_close(out, sum(vals(r, 4 * WORLD) for r in range(WORLD))[4 * c.rank: 4 * c.rank + 4])


def ep_reduce_scatter_base(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist._reduce_scatter_base(out, vals(c.rank, 4 * WORLD), group=g)
    torch.testing.assert_close(out, sum(vals(r, 4 * WORLD) for r in range(WORLD))[4 * c.rank: 4 * c.rank + 4])


def ep_all_to_all(c: Ctx, g: dist.ProcessGroup) -> None:
    outs = [torch.zeros(4) for _ in range(WORLD)]
    dist.all_to_all(outs, [vals(c.rank, salt=10 * j) for j in range(WORLD)], group=g)
    torch.testing.assert_close(outs, [vals(r, salt=10 * c.rank) for r in range(WORLD)])


def ep_all_to_all_single(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4 * WORLD)
    dist.all_to_all_single(out, torch.cat([vals(c.rank, salt=10 * j) for j in range(WORLD)]), group=g)
    torch.testing.assert_close(out, torch.cat([vals(r, salt=10 * c.rank) for r in range(WORLD)]))


def ep_all_to_all_single_uneven(c: Ctx, g: dist.ProcessGroup) -> None:
    def n(src: int, dst: int) -> int:  # elements src sends to dst
        return 1 + src + 2 * dst

    send = [n(c.rank, j) for j in range(WORLD)]
    recv = [n(j, c.rank) for j in range(WORLD)]
    out = torch.zeros(sum(recv))
    data = torch.cat([vals(c.rank, send[j], salt=10 * j) for j in range(WORLD)])
    dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=send, group=g)
    torch.testing.assert_close(out, torch.cat([vals(j, recv[j], salt=10 * c.rank) for j in range(WORLD)]))


def ep_broadcast(c: Ctx, g: dist.ProcessGroup) -> None:
    t = vals(c.rank)
    dist.broadcast(t, group_src=1, group=g)
    torch.testing.assert_close(t, vals(1))


def ep_reduce(c: Ctx, g: dist.ProcessGroup) -> None:
    t = vals(c.rank)
    dist.reduce(t, group_dst=1, op=dist.ReduceOp.PRODUCT, group=g)
    if c.rank == 1:
        torch.testing.assert_close(t, vals(0) * vals(1))


def ep_gather(c: Ctx, g: dist.ProcessGroup) -> None:
    outs = [torch.zeros(4) for _ in range(WORLD)] if c.rank == 0 else None
    dist.gather(vals(c.rank), outs, group_dst=0, group=g)
    if outs is not None:
        torch.testing.assert_close(outs, [vals(r) for r in range(WORLD)])


def ep_scatter(c: Ctx, g: dist.ProcessGroup) -> None:
    out = torch.zeros(4)
    dist.scatter(out, [vals(0, salt=j) for j in range(WORLD)] if c.rank == 0 else None, group_src=0, group=g)
    torch.testing.assert_close(out, vals(0, salt=c.rank))


def ep_barrier(c: Ctx, g: dist.ProcessGroup) -> None:
    dist.barrier(group=g)


def ep_send_recv(c: Ctx, g: dist.ProcessGroup) -> None:
    peer = 1 - c.rank
    out = torch.zeros(4)
    if c.rank == 0:
        dist.send(vals(0), group_dst=peer, group=g)
        dist.recv(out, group_src=peer, group=g)
    else:
        dist.recv(out, group_src=peer, group=g)
        dist.send(vals(1), group_dst=peer, group=g)
    torch.testing.assert_close(out, vals(peer))


def ep_isend_irecv(c: Ctx, g: dist.ProcessGroup) -> None:
    peer = 1 - c.rank
    out = torch.zeros(4)
    works = [dist.isend(vals(c.rank), group_dst=peer, group=g), dist.irecv(out, group_src=peer, group=g)]
    for w in works:
        w.wait()
    torch.testing.assert_close(out, vals(peer))


def ep_batch_isend_irecv(c: Ctx, g: dist.ProcessGroup) -> None:
    peer = 1 - c.rank
    out = torch.zeros(4)
    ops = [dist.P2POp(dist.isend, vals(c.rank), group=g, group_peer=peer),
           dist.P2POp(dist.irecv, out, group=g, group_peer=peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    torch.testing.assert_close(out, vals(peer))


def ep_funcol_all_reduce(c: Ctx, g: dist.ProcessGroup) -> None:
    out = funcol.all_reduce(vals(c.rank), "sum", g)
    torch.testing.assert_close(funcol.wait_tensor(out), vals(0) + vals(1))


def ep_funcol_all_gather(c: Ctx, g: dist.ProcessGroup) -> None:
    out = funcol.all_gather_tensor(vals(c.rank), 0, g)
    torch.testing.assert_close(funcol.wait_tensor(out), torch.cat([vals(r) for r in range(WORLD)]))


def ep_funcol_reduce_scatter(c: Ctx, g: dist.ProcessGroup) -> None:
    out = funcol.reduce_scatter_tensor(vals(c.rank, 4 * WORLD), "sum", 0, g)
    want = sum(vals(r, 4 * WORLD) for r in range(WORLD))[4 * c.rank: 4 * c.rank + 4]
    torch.testing.assert_close(funcol.wait_tensor(out), want)


def ep_funcol_all_to_all_single(c: Ctx, g: dist.ProcessGroup) -> None:
    data = torch.cat([vals(c.rank, salt=10 * j) for j in range(WORLD)])
    out = funcol.all_to_all_single(data, [4] * WORLD, [4] * WORLD, g)
    torch.testing.assert_close(funcol.wait_tensor(out), torch.cat([vals(r, salt=10 * c.rank) for r in range(WORLD)]))


def ep_funcol_broadcast(c: Ctx, g: dist.ProcessGroup) -> None:
    out = funcol.broadcast(vals(c.rank), 1, g)
    torch.testing.assert_close(funcol.wait_tensor(out), vals(1))


EntryPoint = Callable[[Ctx, dist.ProcessGroup], None]

#: Entry point -> (the call, the Backend methods its gate may name). Point-to-point ops name send on the rank
#: that sends first and recv on the other.
ENTRY_POINTS: dict[str, tuple[EntryPoint, tuple[str, ...]]] = {
    "all_reduce": (ep_all_reduce, ("allreduce",)),
    "all_reduce(async_op)": (ep_all_reduce_async, ("allreduce",)),
    "all_reduce_coalesced": (ep_all_reduce_coalesced, ("allreduce_coalesced",)),
    "all_gather": (ep_all_gather, ("allgather",)),
    "all_gather_into_tensor": (ep_all_gather_into_tensor, ("_allgather_base",)),
    "_all_gather_base": (ep_all_gather_base, ("_allgather_base",)),
    "reduce_scatter": (ep_reduce_scatter, ("reduce_scatter",)),
    "reduce_scatter_tensor": (ep_reduce_scatter_tensor, ("_reduce_scatter_base",)),
    "_reduce_scatter_base": (ep_reduce_scatter_base, ("_reduce_scatter_base",)),
    "all_to_all": (ep_all_to_all, ("alltoall",)),
    "all_to_all_single": (ep_all_to_all_single, ("alltoall_base",)),
    "all_to_all_single(uneven)": (ep_all_to_all_single_uneven, ("alltoall_base",)),
    "broadcast": (ep_broadcast, ("broadcast",)),
    "reduce": (ep_reduce, ("reduce",)),
    "gather": (ep_gather, ("gather",)),
    "scatter": (ep_scatter, ("scatter",)),
    "barrier": (ep_barrier, ("barrier",)),
    "send/recv": (ep_send_recv, ("send", "recv")),
    "isend/irecv": (ep_isend_irecv, ("send",)),
    "batch_isend_irecv": (ep_batch_isend_irecv, ("send",)),
    "funcol.all_reduce": (ep_funcol_all_reduce, ("allreduce",)),
    # The functional single-tensor gathers and scatters are coalesced calls of one tensor in C++.
    "funcol.all_gather_tensor": (ep_funcol_all_gather, ("allgather_into_tensor_coalesced",)),
    "funcol.reduce_scatter_tensor": (ep_funcol_reduce_scatter, ("reduce_scatter_tensor_coalesced",)),
    "funcol.all_to_all_single": (ep_funcol_all_to_all_single, ("alltoall_base",)),
    "funcol.broadcast": (ep_funcol_broadcast, ("broadcast",)),
}


# ---------------------------------------------------------------------------------------------------------------
# Checks run in the workers
# ---------------------------------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Ctx], None]] = {}


def check(name: str) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    """Register a distributed check under ``name``."""

    def deco(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        CHECKS[name] = fn
        return fn

    return deco


def expect_refusal(call: Callable[[], object], message: str) -> SimulatedVendorError:
    """Run ``call`` and require the simulated vendor to refuse it with exactly ``message``."""
    with pytest.raises(SimulatedVendorError) as info:
        call()
    assert str(info.value) == message, f"refused with {str(info.value)!r}, expected {message!r}"
    assert isinstance(info.value, RuntimeError)  # what the vendor's TORCH_CHECK raises
    return info.value


def _delegates(name: str) -> Callable[[Ctx], None]:
    return lambda c: ENTRY_POINTS[name][0](c, c.simall)


def _gated(name: str) -> Callable[[Ctx], None]:
    def run(c: Ctx) -> None:
        fn, keys = ENTRY_POINTS[name]
        with pytest.raises(SimulatedVendorError) as info:
            fn(c, c.simnone)
        assert info.value.op in keys, f"{name} reached the gate as {info.value.op!r}, expected one of {keys}"
        assert str(info.value) == f"simnone lacks {info.value.op}"

    return run


for _name in ENTRY_POINTS:
    CHECKS[f"delegates:{_name}"] = _delegates(_name)
    CHECKS[f"gated:{_name}"] = _gated(_name)


@check("backend names")
def _names(c: Ctx) -> None:
    assert dist.get_backend() == "sccl"
    assert dist.get_backend(c.simall) == "simall"
    assert c.sccl.name() == "sccl"
    assert isinstance(c.sccl, sim.SimulatedProcessGroup)
    assert sim.simulated_backend_of() is SCCL
    assert sim.simulated_backend_of(c.simall) is SIMALL
    assert sim.simulated_backend_of(c.control) is None
    assert dist.get_backend(c.control) == "gloo"
    assert c.sccl.pg_options == ChipMapOptions([0, 1])


@check("sccl: supported ops compute")
def _sccl_ok(c: Ctx) -> None:
    t = vals(c.rank, dtype=torch.bfloat16)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    torch.testing.assert_close(t, torch.minimum(vals(0), vals(1)).to(torch.bfloat16))
    flags = torch.tensor([True, False, c.rank == 0, False])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.tolist() == [True, False, True, False]
    ep_all_to_all_single(c, c.sccl)  # even splits: SCCL computes these right
    ep_send_recv(c, c.sccl)


@check("sccl: missing ops raise the vendor's messages")
def _sccl_missing(c: Ctx) -> None:
    expect_refusal(lambda: ep_reduce_scatter(c, c.sccl), "ProcessGroupSCCL does not support reduce_scatter")
    expect_refusal(lambda: ep_reduce_scatter_tensor(c, c.sccl), "Backend sccl does not support _reduce_scatter_base")
    expect_refusal(lambda: ep_all_to_all(c, c.sccl), "Backend sccl does not support alltoall")
    expect_refusal(lambda: ep_all_reduce_coalesced(c, c.sccl), "Backend sccl does not support allreduce_coalesced")
    # The functional (compiled-graph) all_gather is a one-tensor allgather_into_tensor_coalesced, which SCCL lacks.
    expect_refusal(lambda: ep_funcol_all_gather(c, c.sccl),
                   "Backend sccl does not support allgather_into_tensor_coalesced")
    # The op check comes first, as on the vendor: a missing op fails whatever the dtype.
    expect_refusal(lambda: dist.reduce_scatter(torch.zeros(2, dtype=torch.float64),
                                               [torch.zeros(2, dtype=torch.float64)] * WORLD),
                   "ProcessGroupSCCL does not support reduce_scatter")


@check("sccl: bad dtype raises")
def _sccl_dtype(c: Ctx) -> None:
    msg = "ProcessGroupSCCL: Invalid scalar type torch.float64"
    expect_refusal(lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64)), msg)
    expect_refusal(lambda: dist.broadcast(torch.ones(2, dtype=torch.float64), group_src=0), msg)
    expect_refusal(lambda: dist.all_gather_into_tensor(torch.zeros(4, dtype=torch.float64),
                                                       torch.ones(2, dtype=torch.float64)), msg)


@check("sccl: bad reduce op raises")
def _sccl_reduce_op(c: Ctx) -> None:
    supported = "(supported: max, min, product, sum)"
    for op, name in ((dist.ReduceOp.AVG, "AVG"), (dist.ReduceOp.BXOR, "BXOR"),
                     (dist._make_nccl_premul_sum(2.0), "PREMUL_SUM")):
        expect_refusal(lambda op=op: dist.all_reduce(torch.ones(2), op=op),
                       f"ProcessGroupSCCL: unsupported reduce op ReduceOp.{name} {supported}")
    expect_refusal(lambda: dist.reduce(torch.ones(2), group_dst=0, op=dist.ReduceOp.AVG),
                   f"ProcessGroupSCCL: unsupported reduce op ReduceOp.AVG {supported}")
    expect_refusal(lambda: funcol.all_reduce(torch.ones(2), "avg", c.sccl),
                   f"ProcessGroupSCCL: unsupported reduce op ReduceOp.AVG {supported}")


@check("sccl: uneven all_to_all_single raises")
def _sccl_uneven(c: Ctx) -> None:
    with pytest.raises(SimulatedVendorError, match="ProcessGroupSCCL ignores all_to_all_single split sizes"):
        ep_all_to_all_single_uneven(c, c.sccl)


@check("sccl: options check fires in the creator")
def _sccl_options(c: Ctx) -> None:
    with pytest.raises(RuntimeError, match="chip_map has 1 entries, fewer than the group size 2"):
        dist.new_group(backend="sccl", pg_options=ChipMapOptions([0]))
    with pytest.raises(TypeError, match="pg_options is mandatory"):
        dist.new_group(backend="sccl")
    # Both ranks failed alike, so torch's group bookkeeping stays in step and the next group works.
    sub = dist.new_group([0], backend="sccl", pg_options=ChipMapOptions([3]))
    if c.rank == 0:
        t = torch.ones(2)
        dist.all_reduce(t, group=sub)
        assert dist.get_backend(sub) == "sccl"
        torch.testing.assert_close(t, torch.ones(2))


@check("premul_sum is emulated where the profile allows it")
def _premul(c: Ctx) -> None:
    t = vals(c.rank)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0), group=c.simall)
    torch.testing.assert_close(t, 2 * (vals(0) + vals(1)))
    src = vals(c.rank, 4 * WORLD)
    out = torch.zeros(4)
    dist.reduce_scatter_tensor(out, src, op=dist._make_nccl_premul_sum(0.5), group=c.simall)
    torch.testing.assert_close(out, 0.5 * sum(vals(r, 4 * WORLD) for r in range(WORLD))[4 * c.rank: 4 * c.rank + 4])
    torch.testing.assert_close(src, vals(c.rank, 4 * WORLD))  # the input is left alone
    # Integers are not emulated: gloo's own refusal comes through.
    with pytest.raises(RuntimeError, match=r"Cannot use ReduceOp\.PREMUL_SUM with Gloo"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0), group=c.simall)


@check("registering again is idempotent")
def _idempotent(c: Ctx) -> None:
    sim.register_simulated_backend(SCCL)
    sim.register_simulated_backend(SIMALL)
    with pytest.raises(ValueError, match="already has a backend"):
        sim.register_simulated_backend(SimProfile("nccl", "X", {}, ALL_DTYPES, frozenset(), True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: build the groups, run every check, write ``{check: None | traceback}`` for the parent."""
    for profile in (SCCL, SIMALL, SIMNONE):
        sim.register_simulated_backend(profile)
    dist.init_process_group("sccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=PG_TIMEOUT, pg_options=ChipMapOptions([0, 1]))
    ctx = Ctx(rank, dist.group.WORLD, dist.new_group(backend="simall"), dist.new_group(backend="simnone"),
              dist.new_group(backend="gloo"))
    results: dict[str, str | None] = {}
    for name, fn in CHECKS.items():
        try:
            fn(ctx)
            results[name] = None
        except BaseException:  # report every failure, pytest's own included, and keep going
            results[name] = traceback.format_exc()
        # Resynchronise on plain gloo, so a check that failed on one rank only cannot shift the next one.
        dist.barrier(group=ctx.control)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Spawn the two ranks once, run every check, and return each rank's results."""
    out = tmp_path_factory.mktemp("sim")
    procs = mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=False,
                               start_method="forkserver")
    deadline = time.monotonic() + SPAWN_DEADLINE_S
    try:
        while not procs.join(timeout=0.5):
            if time.monotonic() > deadline:
                pytest.fail(f"the simulated world did not finish within {SPAWN_DEADLINE_S} s")
    finally:
        for p in procs.processes:  # only the ranks started above
            if p.is_alive():
                p.terminate()
                p.join()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("name", list(CHECKS))
def test_distributed(outcomes: list[dict[str, Any]], name: str) -> None:
    failures = [f"rank {r}:\n{res[name]}" for r, res in enumerate(outcomes) if res.get(name, "not run")]
    assert not failures, "\n".join(failures)


def test_register_refuses_builtin_names() -> None:
    for name in ("gloo", "nccl", "mpi"):
        with pytest.raises(ValueError, match="already has a backend"):
            sim.register_simulated_backend(SimProfile(name, "X", {}, ALL_DTYPES, frozenset(), True))


def test_register_refuses_bad_names() -> None:
    for name in ("SCCL", "cpu:sccl", ""):
        with pytest.raises(ValueError, match="lower-case identifier"):
            sim.register_simulated_backend(SimProfile(name, "X", {}, ALL_DTYPES, frozenset(), True))


def test_profile_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown native_ops keys"):
        SimProfile("x", "X", {"all_reduce": None}, ALL_DTYPES, frozenset(), True)
    with pytest.raises(ValueError, match="unknown reduce ops"):
        SimProfile("x", "X", {}, ALL_DTYPES, frozenset({"mean"}), True)


def test_profile_refusal_defaults_to_base_class_message() -> None:
    assert SCCL.refusal("allreduce") is None
    assert SCCL.refusal("reduce_scatter") == "ProcessGroupSCCL does not support reduce_scatter"
    assert SCCL.refusal("_reduce_scatter_base") == "Backend sccl does not support _reduce_scatter_base"
    assert sim.simulated_backend_of() is None  # nothing initialised in the pytest process
