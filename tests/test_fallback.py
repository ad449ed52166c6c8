"""The fallback policy: ``xccl.init(..., fallback="warn" | "emulate" | "error")`` on a backend that lacks ops.

On the ``gloo-emulated`` test plugin every op that has an emulation is emulated. ``"warn"`` (the default) must warn
exactly once per (op, backend), naming the emulation and its traffic, at the caller's line; ``"emulate"`` must be
silent; ``"error"`` must raise ``UnsupportedCollective`` on every rank before any communication, leaving the group
usable.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl import Collective as C
from xccl.collectives._emulate import describe

#: What the warning for each emulated op must say: the emulation, and what it costs.
EXPECTED_TEXT = {
    "reduce_scatter_tensor": ("via all_to_all", "same bytes as a ring"),
    "reduce_scatter": ("via reduce_scatter_tensor",),
    "all_to_all": ("via all_to_all_single", "split sizes"),
    "all_to_all_single_uneven": ("via padding", "largest"),
    "all_gather_into_tensor_uneven": ("via padding", "largest split"),
    "reduce_scatter_tensor_uneven": ("via padding", "largest split"),
    "all_to_all_v": ("via all_to_all_single",),
    "send": ("via host_gloo", "host memory"),
    "recv": ("via host_gloo", "host memory"),
    "all_reduce": ("avg as sum then a local divide", "no extra traffic"),
    "all_gather": ("bool cast to uint8", "the same bytes on the wire"),
}
_WARNING = re.compile(r"^xccl: (\w+) is emulated on ([\w-]+): (.*)\. Pass fallback='emulate' .* fallback='error'")


def emulated_calls() -> dict[str, Callable[[], Any]]:
    """One call per op that gloo-emulated emulates, keyed by that op (every rank makes every call)."""
    n, r = dist.get_world_size(), dist.get_rank()
    counts = [[1 + (i * j) % 3 for j in range(n)] for i in range(n)]
    uneven = [1 + j % 2 for j in range(n)]
    peer = r ^ 1  # pairs (0, 1), (2, 3): even ranks send first

    def p2p() -> None:
        for step in ("send", "recv") if r % 2 == 0 else ("recv", "send"):
            if step == "send":
                xccl.send(torch.ones(2), peer)
            else:
                xccl.recv(torch.empty(2), peer)

    return {
        "reduce_scatter_tensor": lambda: xccl.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n)),
        "reduce_scatter": lambda: xccl.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(n)]),
        "all_to_all": lambda: xccl.all_to_all([torch.empty(2) for _ in range(n)], [torch.ones(2) for _ in range(n)]),
        "all_to_all_single_uneven": lambda: xccl.all_to_all_single(
            torch.empty(sum(row[r] for row in counts)), torch.ones(sum(counts[r])),
            [row[r] for row in counts], counts[r],
        ),
        "all_gather_into_tensor_uneven": lambda: xccl.all_gather_into_tensor_uneven(
            torch.empty(sum(uneven)), torch.ones(uneven[r]), uneven
        ),
        "reduce_scatter_tensor_uneven": lambda: xccl.reduce_scatter_tensor_uneven(
            torch.empty(uneven[r]), torch.ones(sum(uneven)), uneven
        ),
        "all_to_all_v": lambda: xccl.all_to_all_v(
            torch.empty(sum(row[r] for row in counts)), torch.ones(sum(counts[r])), counts
        ),
        "send": p2p,  # "recv" is warned/refused by the same exchange
        "all_reduce": lambda: xccl.all_reduce(torch.ones(3), xccl.ReduceOp.AVG),
        "all_gather": lambda: xccl.all_gather([torch.empty(2, dtype=torch.bool) for _ in range(n)],
                                              torch.ones(2, dtype=torch.bool)),
    }


def native_calls() -> None:
    """Ops gloo-emulated runs natively: they must never warn or raise."""
    n = dist.get_world_size()
    xccl.all_reduce(torch.ones(3))
    xccl.all_gather([torch.empty(2) for _ in range(n)], torch.ones(2))
    xccl.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n))
    xccl.broadcast(torch.ones(2), 0)
    xccl.barrier()


def _forget_plans(group: Any = None) -> None:
    # The warning is issued when a call shape is first planned; earlier bodies in this pool may have planned it.
    from xccl.collectives._groups import state_of as context

    context(group).plans.clear()


def _record(fn: Callable[[], None]) -> list[tuple[str, str, str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [(w.category.__name__, str(w.message), w.filename) for w in caught]


def body_warn() -> dict[str, Any]:
    """Each emulated op twice, native ops, then again with fresh plans, then on a new group."""
    from xccl.collectives._state import GROUPS

    GROUPS.warned.clear()
    _forget_plans()
    calls = emulated_calls()

    def twice() -> None:
        for _ in range(2):
            for call in calls.values():
                call()
        native_calls()

    first = _record(twice)
    _forget_plans()  # planned afresh, but already warned: once per (op, backend) means silence now
    again = _record(twice)
    group = xccl.new_group()
    subgroup = _record(lambda: xccl.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * dist.get_world_size()),
                                                          group=group))
    return {"fallback": xccl.get_world().fallback, "first": first, "again": again, "subgroup": subgroup}


def body_warn_through_torch() -> list[tuple[str, str, str]]:
    """Emulated calls that reach xccl through torch.distributed's wrappers: torch 2.13's deprecated names
    (``typing_extensions.deprecated`` puts a frame of its own between the user's line and torch), and the c10d
    path of ``dist.all_reduce``."""
    from xccl.collectives._state import GROUPS

    GROUPS.warned.clear()
    _forget_plans()
    n = dist.get_world_size()

    def calls() -> None:
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n))
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.AVG)

    return [w for w in _record(calls) if w[0] == "EmulationWarning"]


def body_emulate() -> list[tuple[str, str, str]]:
    from xccl.collectives._state import GROUPS

    GROUPS.warned.clear()
    _forget_plans()
    calls = emulated_calls()
    return _record(lambda: [call() for call in calls.values()] and None)


def body_error() -> dict[str, Any]:
    """Every emulated op on every rank, then on rank 0 alone, then a native all_reduce that must still work.

    Rank 0 calling alone proves that nothing communicated: had it, it would be waiting for a peer that has
    already moved on to the all_reduce, and the body would fail or time out.
    """
    r = dist.get_rank()
    calls = emulated_calls()

    def attempt(call: Callable[[], Any]) -> tuple[str, ...]:
        try:
            call()
        except xccl.UnsupportedCollective as exc:
            return (type(exc).__name__, exc.op, exc.backend, exc.detail)
        return ("no error",)

    every = {name: attempt(call) for name, call in calls.items()}
    alone = {name: attempt(call) for name, call in calls.items()} if r == 0 else {}
    t = torch.full((3,), float(r + 1))
    xccl.all_reduce(t)
    native_calls()
    return {"every": every, "alone": alone, "after": t}


# --------------------------------------------------------------------------------------------------- the tests


def test_emulate_is_silent(rank_pools: Any) -> None:
    for caught in rank_pools.get(2, vendor="gloo-emulated", fallback="emulate").run_ok(body_emulate):
        assert caught == [], f"fallback='emulate' warned: {caught}"


def test_warn_is_the_default_and_warns_once_per_op_naming_emulation_and_traffic(rank_pools: Any) -> None:
    for rank, out in enumerate(rank_pools.get(2, vendor="gloo-emulated").run_ok(body_warn)):
        assert out["fallback"] == "warn"
        by_op: dict[str, list[str]] = {}
        for category, message, filename in out["first"]:
            assert category == "EmulationWarning", f"rank {rank}: unexpected {category}: {message}"
            m = _WARNING.match(message)
            assert m, f"rank {rank}: warning not in the expected form: {message}"
            assert m.group(2) == "gloo-emulated"
            assert filename.endswith("test_fallback.py"), f"{m.group(1)}: warned at {filename}, not the caller"
            by_op.setdefault(m.group(1), []).append(m.group(3))
        assert sorted(by_op) == sorted(EXPECTED_TEXT), f"rank {rank}: warned for {sorted(by_op)}"
        for op, hows in by_op.items():
            assert len(hows) == 1, f"rank {rank}: {op} warned {len(hows)} times: {hows}"
            for phrase in EXPECTED_TEXT[op]:
                assert phrase in hows[0], f"rank {rank}: {op}'s warning lacks {phrase!r}: {hows[0]}"
        assert out["again"] == [], f"rank {rank}: warned again: {out['again']}"
        assert out["subgroup"] == [], f"rank {rank}: warned again on another group: {out['subgroup']}"


def test_warning_names_the_users_line_when_called_through_torch_distributed(rank_pools: Any) -> None:
    for rank, caught in enumerate(rank_pools.get(2, vendor="gloo-emulated").run_ok(body_warn_through_torch)):
        assert len(caught) == 2, f"rank {rank}: {caught}"
        for _, message, filename in caught:
            assert filename.endswith("test_fallback.py"), f"rank {rank}: {message!r} names {filename}"


def test_error_raises_on_every_rank_before_communicating_and_group_survives(rank_pools: Any) -> None:
    outs = rank_pools.get(2, vendor="gloo-emulated", fallback="error").run_ok(body_error)
    expected_ops = set(EXPECTED_TEXT) - {"recv"}
    for rank, out in enumerate(outs):
        for phase in ("every", "alone") if rank == 0 else ("every",):
            got = out[phase]
            assert set(got) == expected_ops
            for name, result in got.items():
                kind, *attrs = result
                assert kind == "UnsupportedCollective", f"rank {rank} {phase} {name}: {result}"
                op, backend, detail = attrs
                want_op = "send" if rank % 2 == 0 and name == "send" else "recv" if name == "send" else name
                assert (op, backend) == (want_op, "gloo-emulated"), f"rank {rank} {phase}: {attrs}"
                assert "fallback policy is 'error'" in detail and "fallback='warn'" in detail, detail
        assert torch.equal(out["after"], torch.full((3,), 3.0))


def test_error_message_names_the_emulation() -> None:
    table = xccl.capabilities("gloo-emulated")
    with pytest.raises(xccl.UnsupportedCollective, match=r"only emulated \(all_to_all\)") as info:
        table.require(C.REDUCE_SCATTER_TENSOR, dtype=torch.float32, reduce_op="sum", world_size=2,
                      allow_emulated=False)
    assert (info.value.op, info.value.backend) == ("reduce_scatter_tensor", "gloo-emulated")


def test_all_reduce_slice_warning_states_its_double_traffic() -> None:
    res = xccl.capabilities("gloo-emulated-ar").resolve(C.REDUCE_SCATTER_TENSOR, dtype=torch.float32, reduce_op="sum")
    assert "all_reduce + slice" in describe(C.REDUCE_SCATTER_TENSOR, res, torch.float32)
    assert "2x the bytes" in describe(C.REDUCE_SCATTER_TENSOR, res, torch.float32)


def test_unknown_policy_is_refused_before_anything_starts() -> None:
    with pytest.raises(xccl.InitError, match="fallback='sometimes'"):
        xccl.init(fallback="sometimes")  # type: ignore[arg-type]
