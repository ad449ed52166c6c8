"""Every public collective on the built-in cpu plugin, at 2 and 4 real gloo ranks, against a reference each rank
computes from the known inputs of every rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import xccl

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
R = xccl.ReduceOp


def make(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """The input rank ``rank`` contributes: deterministic, small integers so float sums are exact."""
    gen = torch.Generator().manual_seed(1000 * rank + salt)
    t = torch.randint(-4, 5, shape, generator=gen)
    if dtype == torch.bool:
        return t > 0
    return t.to(dtype)


def reduce_ref(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    acc = ts[0].clone()
    for t in ts[1:]:
        if op in ("sum", "avg", "premul_sum"):
            acc = acc + t
        elif op == "product":
            acc = acc * t
        elif op == "min":
            acc = torch.minimum(acc, t)
        elif op == "max":
            acc = torch.maximum(acc, t)
        elif op == "band":
            acc = acc & t
        elif op == "bor":
            acc = acc | t
        elif op == "bxor":
            acc = acc ^ t
    if op == "avg":
        acc = acc / len(ts) if acc.is_floating_point() else torch.div(acc, len(ts), rounding_mode="trunc")
    if op == "premul_sum":
        acc = acc * PREMUL
    return acc.to(ts[0].dtype)


PREMUL = 0.5


def _rop(op: str) -> object:
    """The ReduceOp for a name: premul_sum with its factor (a bare ReduceOp.PREMUL_SUM is refused, as torch does)."""
    return dist._make_nccl_premul_sum(PREMUL) if op == "premul_sum" else getattr(R, op.upper())


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Inputs are small integers, so every float result here is exact except averages, which divide once.
    if a.is_floating_point():
        return torch.allclose(a.float(), b.float(), rtol=1e-2 if a.dtype == torch.bfloat16 else 1e-6, atol=1e-6)
    return torch.equal(a, b)


def _ops_for(dtype: torch.dtype) -> list[str]:
    table = xccl.capabilities("cpu")
    return [op for op in ("sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul_sum")
            if table.supports("all_reduce", dtype=dtype, reduce_op=op)]


def body_all(dtypes: tuple[torch.dtype, ...], async_op: bool) -> list[str]:
    """Run every collective; return a list of failures (empty when all match the reference)."""
    w = xccl.get_world()
    n, r = w.world_size, w.rank
    fails: list[str] = []

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not same(got, want):
            fails.append(f"{name}: got {got.tolist()} want {want.tolist()}")

    def done(work: object) -> None:
        if async_op:
            work.wait()  # type: ignore[attr-defined]
        else:
            assert work is None

    for dt in dtypes:
        shape = (3, 2)
        inputs = [make(i, shape, dt) for i in range(n)]
        for op in _ops_for(dt):
            t = inputs[r].clone()
            done(xccl.all_reduce(t, _rop(op), async_op=async_op))
            check(f"all_reduce {dt} {op}", t, reduce_ref(inputs, op))
            t = inputs[r].clone()
            done(xccl.reduce(t, dst=n - 1, op=_rop(op), async_op=async_op))
            if r == n - 1:
                check(f"reduce {dt} {op}", t, reduce_ref(inputs, op))
            big = [make(i, (n * 2, 3), dt, salt=7) for i in range(n)]
            out = torch.empty((2, 3), dtype=dt)
            done(xccl.reduce_scatter_tensor(out, big[r], _rop(op), async_op=async_op))
            check(f"reduce_scatter_tensor {dt} {op}", out, reduce_ref(big, op)[2 * r : 2 * r + 2])
            out = torch.empty((2, 3), dtype=dt)
            done(xccl.reduce_scatter(out, list(big[r].chunk(n)), _rop(op), async_op=async_op))
            check(f"reduce_scatter {dt} {op}", out, reduce_ref(big, op)[2 * r : 2 * r + 2])
        # Data movement.
        outs = [torch.empty(shape, dtype=dt) for _ in range(n)]
        done(xccl.all_gather(outs, inputs[r], async_op=async_op))
        for i in range(n):
            check(f"all_gather {dt} [{i}]", outs[i], inputs[i])
        out = torch.empty((n * 3, 2), dtype=dt)
        done(xccl.all_gather_into_tensor(out, inputs[r], async_op=async_op))
        check(f"all_gather_into_tensor {dt}", out, torch.cat(inputs))
        t = inputs[r].clone()
        done(xccl.broadcast(t, src=n - 1, async_op=async_op))
        check(f"broadcast {dt}", t, inputs[n - 1])
        # all_to_all: rank i sends chunk j of its input to rank j.
        a2a_in = [make(i, (n * 2, 2), dt, salt=3) for i in range(n)]
        out = torch.empty((n * 2, 2), dtype=dt)
        done(xccl.all_to_all_single(out, a2a_in[r], async_op=async_op))
        check(f"all_to_all_single {dt}", out, torch.cat([a2a_in[i][2 * r : 2 * r + 2] for i in range(n)]))
        outs = [torch.empty((2, 2), dtype=dt) for _ in range(n)]
        done(xccl.all_to_all(outs, list(a2a_in[r].chunk(n)), async_op=async_op))
        for i in range(n):
            check(f"all_to_all {dt} [{i}]", outs[i], a2a_in[i][2 * r : 2 * r + 2])
        # Uneven all_to_all_single: rank i sends (i + j + 1) rows to rank j.
        rows = [[i + j + 1 for j in range(n)] for i in range(n)]
        uin = [make(i, (sum(rows[i]), 2), dt, salt=5) for i in range(n)]
        out = torch.empty((sum(rows[i][r] for i in range(n)), 2), dtype=dt)
        done(xccl.all_to_all_single(out, uin[r], [rows[i][r] for i in range(n)], rows[r], async_op=async_op))
        want = torch.cat([uin[i][sum(rows[i][:r]) : sum(rows[i][: r + 1])] for i in range(n)])
        check(f"all_to_all_single uneven {dt}", out, want)
        # gather / scatter with root n-1.
        root = n - 1
        lst = [torch.empty(shape, dtype=dt) for _ in range(n)] if r == root else None
        done(xccl.gather(inputs[r], lst, dst=root, async_op=async_op))
        if lst is not None:
            for i in range(n):
                check(f"gather {dt} [{i}]", lst[i], inputs[i])
        t = torch.empty(shape, dtype=dt)
        src_list = [make(root, shape, dt, salt=10 + i) for i in range(n)]
        done(xccl.scatter(t, src_list if r == root else None, src=root, async_op=async_op))
        check(f"scatter {dt}", t, make(root, shape, dt, salt=10 + r))
        # Ring of point-to-point: send to the right, receive from the left.
        right, left = (r + 1) % n, (r - 1) % n
        got = torch.empty(shape, dtype=dt)
        if async_op:
            works = [xccl.isend(inputs[r], right), xccl.irecv(got, left)]
            for wk in works:
                wk.wait()
        elif r % 2 == 0:
            xccl.send(inputs[r], right)
            xccl.recv(got, left)
        else:
            xccl.recv(got, left)
            xccl.send(inputs[r], right)
        check(f"send/recv ring {dt}", got, inputs[left])
    done(xccl.barrier(async_op=async_op))
    return fails


@pytest.mark.parametrize("world_size", [2, 4], ids=["2ranks", "4ranks"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_every_collective_matches_reference(rank_pools, world_size, async_op):
    pool = rank_pools.get(world_size)
    results = pool.run_ok(body_all, DTYPES, async_op, timeout=120)
    for rank, fails in enumerate(results):
        assert fails == [], f"rank {rank}: " + "\n".join(fails)


def body_subgroup() -> list[str]:
    """A subgroup of the last two ranks: collectives on it, then on the world."""
    w = xccl.get_world()
    members = [w.world_size - 2, w.world_size - 1]
    group = xccl.new_group(members)
    # Ranks passed in descending order: torch orders group ranks ascending, so group rank 0 is the lowest.
    rev = xccl.new_group(list(reversed(members)))
    fails = []
    if w.rank in members:
        t = torch.full((4,), float(w.rank))
        xccl.all_reduce(t, group=group)
        if not torch.equal(t, torch.full((4,), float(sum(members)))):
            fails.append(f"subgroup all_reduce {t.tolist()}")
        t = torch.full((2,), float(w.rank))
        xccl.broadcast(t, src=members[1], group=group)
        if not torch.equal(t, torch.full((2,), float(members[1]))):
            fails.append(f"subgroup broadcast {t.tolist()}")
        t = torch.full((2,), float(w.rank))
        xccl.broadcast(t, group=rev, group_src=0)
        if not torch.equal(t, torch.full((2,), float(members[0]))):
            fails.append(f"group_src=0 on a reversed group delivered {t.tolist()}, not rank {members[0]}'s data")
        name = xccl.comm_name(group)
        if name == xccl.comm_name() or name != xccl.comm_name(group):
            fails.append(f"comm name {name!r} not unique or not stable")
    t = torch.ones(1)
    xccl.all_reduce(t)
    if t.item() != w.world_size:
        fails.append("world all_reduce after subgroup")
    return fails


@pytest.mark.parametrize("world_size", [2, 4], ids=["2ranks", "4ranks"])
def test_subgroup(rank_pools, world_size):
    results = rank_pools.get(world_size).run_ok(body_subgroup)
    assert all(f == [] for f in results), results


def body_comm_names() -> tuple[str, str]:
    return xccl.comm_name(), xccl.comm_name(None)


def test_comm_name_same_on_every_rank(rank_pools):
    names = rank_pools.get(2).run_ok(body_comm_names)
    assert names[0] == names[1] and names[0][0] == names[0][1]
    assert names[0][0].startswith("gloo:")


# ------------------------------------------------------------------------------------------ bad input, typed


def _bad(case: str) -> None:
    w = xccl.get_world()
    n = w.world_size
    if case == "dtype mismatch":
        xccl.all_gather_into_tensor(torch.empty(n * 2), torch.ones(2, dtype=torch.int64))
    elif case == "wrong device":
        xccl.all_reduce(torch.ones(2, device="meta"))
    elif case == "output size":
        xccl.all_gather_into_tensor(torch.empty(n * 2 + 1), torch.ones(2))
    elif case == "rank outside group":
        xccl.broadcast(torch.ones(2), src=n)
    elif case == "unsupported op":
        xccl.all_reduce(torch.ones(2), op=R.BAND)  # gloo: bitwise ops on integers only
    elif case == "not a tensor":
        xccl.all_reduce([1.0, 2.0])  # type: ignore[arg-type]
    elif case == "non-contiguous":
        xccl.all_reduce(torch.ones(4, 4).t())
    elif case == "list length":
        xccl.all_gather([torch.empty(2)] * (n + 1), torch.ones(2))
    elif case == "send to self":
        xccl.send(torch.ones(2), w.rank)


BAD = {
    "dtype mismatch": xccl.InvalidArgument,
    "wrong device": xccl.InvalidArgument,
    "output size": xccl.InvalidArgument,
    "rank outside group": xccl.InvalidArgument,
    "unsupported op": xccl.UnsupportedCollective,
    "not a tensor": xccl.InvalidArgument,
    "non-contiguous": xccl.InvalidArgument,
    "list length": xccl.InvalidArgument,
    "send to self": xccl.InvalidArgument,
}


def body_after_bad() -> float:
    t = torch.ones(1)
    xccl.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_typed_on_every_rank_and_group_survives(rank_pools, case):
    pool = rank_pools.get(2)
    outs = pool.run(_bad, case, timeout=20)
    for o in outs:
        assert o.raised(BAD[case]), str(o)
        assert o.raised(xccl.XcclError)
        assert o.elapsed < 5
    assert pool.run_ok(body_after_bad) == [2.0, 2.0]


def test_capability_claims_of_cpu_are_true_for_every_dtype_and_op(rank_pools):
    """Every (dtype, reduce op) the cpu table calls native really runs natively on gloo, and vice versa."""
    outs = rank_pools.get(2).run_ok(_native_truth)
    assert outs[0] == [], outs[0]


def _native_truth() -> list[str]:
    import torch.distributed as dist

    from xccl.plugin._capabilities import ALL_DTYPES, ALL_REDUCE_OPS, Level

    table = xccl.capabilities("cpu")
    # A plain gloo group: what the backend itself can do (the world's group is xccl's, which would emulate).
    raw = dist.new_group(backend="gloo")
    bad = []
    for dt in ALL_DTYPES:
        for op in ALL_REDUCE_OPS:
            level = table.level("all_reduce", dtype=dt, reduce_op=op)
            t = make(xccl.get_world().rank, (3,), dt)
            try:
                rop = dist._make_nccl_premul_sum(2.0) if op == "premul_sum" else _rop(op)
                dist.all_reduce(t, rop, group=raw)
                works = True
            except (RuntimeError, ValueError, TypeError):
                works = False
            if works != (level is Level.NATIVE):
                bad.append(f"{dt} {op}: table says {level}, gloo {'runs it' if works else 'refuses'}")
    return bad
