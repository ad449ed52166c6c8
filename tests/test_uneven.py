"""Uneven collectives with torch_npu's semantics, and their split-size validation.

``all_gather_into_tensor_uneven(output, input, output_split_sizes)``: rank ``i`` contributes
``output_split_sizes[i]`` rows. ``reduce_scatter_tensor_uneven(output, input, input_split_sizes, op)``: rank ``i``
receives the reduction of rows ``input_split_sizes[i]``. ``all_to_all_v(output, input, send_count_matrix)``:
``matrix[i][j]`` elements go from rank i to rank j, the same matrix on every rank (``all_to_all_vc``).

Edge cases (zero-sized splits, a rank that sends nothing, trailing dimensions, no split sizes, split sizes given
as a tensor) run on gloo natively (``cpu``) and through the emulations (``gloo-emulated``), each against a
reference every rank computes. Bad split sizes must raise ``InvalidArgument`` on every rank before anything is
sent, and leave the group usable.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl

POOLS = ({"vendor": "cpu", "fallback": "emulate"}, {"vendor": "gloo-emulated", "fallback": "emulate"})
SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX


def data(tag: str, rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Group rank ``rank``'s input for ``tag``, the same on every rank that asks."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{tag}|{rank}".encode()))
    if dtype.is_floating_point:
        return (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    return torch.randint(-50, 50, tuple(shape), generator=gen, dtype=dtype)


def _wait(ret: Any, a: bool) -> None:
    if a:
        ret.wait()
    elif ret is not None:
        raise AssertionError(f"a blocking call returned {ret!r}")


# ----------------------------------------------------------------------------------------------- semantics


def body_edge_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every edge case, sync and async: ``{case: (result, reference)}``. World size 2."""
    n, r = dist.get_world_size(), dist.get_rank()
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for a in (False, True):
        for dtype in (torch.float32, torch.int64):
            sfx = f"{dtype}|{'async' if a else 'sync'}"
            for sizes, trail in (([0, 3], (2, 3)), ([2, 1], ()), ([0, 0], (4,))):
                tag = f"ag|{sizes}|{trail}|{dtype}"
                xs = [data(tag, j, (sizes[j], *trail), dtype) for j in range(n)]
                res = torch.empty(sum(sizes), *trail, dtype=dtype)
                _wait(xccl.all_gather_into_tensor_uneven(res, xs[r], sizes, None, a), a)
                out[f"ag_uneven {sizes} {trail}|{sfx}"] = (res, torch.cat(xs))

                for name, op in (("sum", SUM), ("max", MAX)):
                    tag = f"rs|{sizes}|{trail}|{dtype}|{name}"
                    xs = [data(tag, j, (sum(sizes), *trail), dtype) for j in range(n)]
                    res = torch.empty(sizes[r], *trail, dtype=dtype)
                    _wait(xccl.reduce_scatter_tensor_uneven(res, xs[r], sizes, op, None, a), a)
                    chunks = torch.stack([x.split(sizes)[r] for x in xs])
                    ref = chunks.sum(0) if name == "sum" else chunks.amax(0)
                    out[f"rs_uneven {sizes} {trail} {name}|{sfx}"] = (res, ref)

            # No split sizes: the even collectives' semantics.
            xs = [data(f"ag-none|{dtype}", j, (2, 3), dtype) for j in range(n)]
            res = torch.empty(2 * n, 3, dtype=dtype)
            _wait(xccl.all_gather_into_tensor_uneven(res, xs[r], None, None, a), a)
            out[f"ag_uneven no sizes|{sfx}"] = (res, torch.cat(xs))
            xs = [data(f"rs-none|{dtype}", j, (2 * n, 3), dtype) for j in range(n)]
            res = torch.empty(2, 3, dtype=dtype)
            _wait(xccl.reduce_scatter_tensor_uneven(res, xs[r], None, SUM, None, a), a)
            out[f"rs_uneven no sizes|{sfx}"] = (res, torch.stack([x.split(2)[r] for x in xs]).sum(0))

            # Split sizes as a tensor, as torch_npu users often pass them.
            sizes = [3, 1]
            xs = [data(f"ag-tensor|{dtype}", j, (sizes[j],), dtype) for j in range(n)]
            res = torch.empty(sum(sizes), dtype=dtype)
            _wait(xccl.all_gather_into_tensor_uneven(res, xs[r], torch.tensor(sizes), None, a), a)
            out[f"ag_uneven tensor sizes|{sfx}"] = (res, torch.cat(xs))

            # all_to_all_v: a rank that sends nothing, zero entries, the all-zero matrix, and a matrix whose row
            # and column 0 are uniform while rank 1's are not (the two ranks must still pick the same kernel).
            for m in ([[0, 2], [3, 0]], [[0, 0], [4, 1]], [[0, 0], [0, 0]], [[1, 1], [1, 2]], [[2, 2], [2, 2]]):
                tag = f"a2av|{m}|{dtype}"
                xs = [data(tag, j, (sum(m[j]),), dtype) for j in range(n)]
                res = torch.empty(sum(row[r] for row in m), dtype=dtype)
                _wait(xccl.all_to_all_v(res, xs[r], m, None, a), a)
                out[f"all_to_all_v {m}|{sfx}"] = (res, torch.cat([x.split(m[j])[r] for j, x in enumerate(xs)]))

                # The same exchange through all_to_all_single with split sizes, on rows of 2.
                xs = [data(tag + "rows", j, (sum(m[j]), 2), dtype) for j in range(n)]
                col = [row[r] for row in m]
                res = torch.empty(sum(col), 2, dtype=dtype)
                _wait(xccl.all_to_all_single(res, xs[r], col, m[r], None, a), a)
                out[f"all_to_all_single {m}|{sfx}"] = (res, torch.cat([x.split(m[j])[r] for j, x in enumerate(xs)]))
    return out


@pytest.fixture(scope="module")
def edge_results(rank_pools: Any) -> list[list[dict[str, tuple[torch.Tensor, torch.Tensor]]]]:
    return [rank_pools.get(2, **kw).run_ok(body_edge_cases) for kw in POOLS]


def test_edge_cases_match_the_reference_natively_and_emulated(edge_results: Any) -> None:
    for kw, per_rank in zip(POOLS, edge_results, strict=True):
        for rank, results in enumerate(per_rank):
            for case, (got, want) in results.items():
                what = f"{kw['vendor']} rank {rank} {case}"
                if got.dtype.is_floating_point and " sum|" in case:
                    # Two ranks: one addition, in an order the backend picks; either way within an ulp.
                    torch.testing.assert_close(got, want.to(got.dtype), rtol=2 * torch.finfo(got.dtype).eps,
                                               atol=0.0, msg=lambda m, w=what: f"{w}: {m}")
                else:
                    assert got.shape == want.shape and torch.equal(got, want.to(got.dtype)), f"{what}:\n{got}\n{want}"


def test_emulated_results_equal_native_ones(edge_results: Any) -> None:
    native, emulated = edge_results
    for rank, (nat, emu) in enumerate(zip(native, emulated, strict=True)):
        assert nat.keys() == emu.keys()
        for case in nat:
            # Bitwise: with two ranks even a float sum is one addition, the same in every order.
            assert torch.equal(nat[case][0], emu[case][0]), f"rank {rank} {case}: {nat[case][0]} vs {emu[case][0]}"


# ------------------------------------------------------------------------------------------------ validation


def bad_calls() -> dict[str, tuple[str, Callable[[], Any]]]:
    """Calls with bad split sizes or counts, the same mistake on every rank: ``{case: (message part, call)}``."""
    n, r = dist.get_world_size(), dist.get_rank()
    good = [1 + j for j in range(n)]
    rows = torch.ones(good[r], 3)
    total = torch.empty(sum(good), 3)

    def ag(sizes: Any, inp: torch.Tensor = rows, out: torch.Tensor = total) -> Callable[[], Any]:
        return lambda: xccl.all_gather_into_tensor_uneven(out, inp, sizes)

    def rs(sizes: Any, out: torch.Tensor = rows, inp: torch.Tensor = total) -> Callable[[], Any]:
        return lambda: xccl.reduce_scatter_tensor_uneven(out, inp, sizes)

    def a2a(osz: Any, isz: Any) -> Callable[[], Any]:
        return lambda: xccl.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n), osz, isz)

    m = [[1] * n for _ in range(n)]

    def a2av(matrix: Any, out: torch.Tensor | None = None, inp: torch.Tensor | None = None) -> Callable[[], Any]:
        return lambda: xccl.all_to_all_v(torch.empty(n) if out is None else out,
                                         torch.ones(n) if inp is None else inp, matrix)

    shared = torch.ones(n)
    cases = {
        "ag: sizes do not sum to output rows": ("sums to", ag([s + 1 for s in good])),
        "ag: a negative size": ("non-negative", ag([-1, *good[1:-1], good[-1] + 1 + good[0]])),
        "ag: one size too many": ("entries; the group has", ag([*good, 0])),
        "ag: one size too few": ("entries; the group has", ag(good[:-1])),
        "ag: float sizes": ("must hold integers", ag([float(s) for s in good])),
        "ag: bool sizes": ("must hold integers", ag([True] * n, torch.ones(1, 3), torch.empty(n, 3))),
        "ag: string sizes": ("must hold integers", ag([str(s) for s in good])),
        "ag: sizes not a sequence": ("sequence of integers", ag(3)),
        "ag: input rows differ from this rank's size": ("does not match", ag(good, torch.ones(good[r] + 1, 3))),
        "rs: sizes do not sum to input rows": ("sums to", rs([s + 1 for s in good])),
        "rs: a negative size": ("non-negative", rs([-1, *good[1:-1], good[-1] + 1 + good[0]])),
        "rs: wrong length": ("entries; the group has", rs([*good, 0])),
        "rs: float sizes": ("must hold integers", rs([s + 0.5 for s in good])),
        "rs: output rows differ from this rank's size": ("does not match", rs(good, torch.empty(good[r] + 1, 3))),
        "a2a: output sizes do not sum": ("sums to", a2a([3] * n, None)),
        "a2a: input sizes negative": ("non-negative", a2a(None, [-2] + [4] + [2] * (n - 2))),
        "a2a: wrong length": ("entries; the group has", a2a([2] * (n + 1), [2] * (n + 1))),
        "a2a: float sizes": ("must hold integers", a2a([2.0] * n, [2.0] * n)),
        "a2av: one row too many": (f"{n}x{n}", a2av([*m, [1] * n])),
        "a2av: a short row": (f"{n}x{n}", a2av([m[0][:-1], *m[1:]])),
        "a2av: a flat list": ("send_count_matrix", a2av([1] * n)),
        "a2av: a negative count": ("non-negative", a2av([[-1, 2, *[1] * (n - 2)], *m[1:]])),
        "a2av: a float count": ("must hold integers", a2av([[1.5] * n] * n)),
        "a2av: input differs from the row sum": ("row", a2av(m, None, torch.ones(n + 1))),
        "a2av: output differs from the column sum": ("column", a2av(m, torch.empty(n - 1), None)),
        "a2av: in place": ("in-place", a2av(m, shared, shared)),
    }
    return cases


def body_validation() -> dict[str, Any]:
    """Every bad call (each must raise InvalidArgument here), then an all_reduce that must still work."""
    outcome: dict[str, Any] = {}
    for case, (part, call) in bad_calls().items():
        try:
            call()
        except xccl.XcclError as exc:
            outcome[case] = (type(exc).__name__, isinstance(exc, ValueError), part in str(exc), str(exc))
        else:
            outcome[case] = ("no error",)
    t = torch.full((2,), float(dist.get_rank() + 1))
    xccl.all_reduce(t)
    outcome["after"] = t
    return outcome


@pytest.mark.parametrize("init", POOLS, ids=[kw["vendor"] for kw in POOLS])
def test_bad_split_sizes_raise_invalid_argument_on_every_rank_and_the_group_survives(
    rank_pools: Any, init: dict[str, str]
) -> None:
    outs = rank_pools.get(2, **init).run_ok(body_validation, timeout=60)
    for rank, out in enumerate(outs):
        assert torch.equal(out.pop("after"), torch.full((2,), 3.0)), f"rank {rank}: the group is broken"
        assert len(out) == 26
        for case, result in out.items():
            assert result[0] == "InvalidArgument", f"rank {rank} {case}: {result}"
            _, is_value_error, names_problem, message = result
            assert is_value_error, "InvalidArgument should also be a ValueError"
            assert names_problem, f"rank {rank} {case}: message does not say what is wrong: {message}"
