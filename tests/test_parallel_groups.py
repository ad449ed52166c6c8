"""xccl.parallel_groups: the Megatron layout (tp fastest, then dp, then pp), real groups at 4 and 8 ranks, and
errors for sizes that do not fit the world."""

from __future__ import annotations

import pytest
import torch

import xccl
from xccl import parallel_layout

# ----------------------------------------------------------------------------------------------- the layout


def test_megatron_layout_at_8_ranks():
    # Megatron-LM's documented example shape: tp groups are consecutive ranks, dp groups stride tp within a
    # pipeline stage, pp groups stride tp * dp.
    layout = parallel_layout(8, tp=2, pp=2, dp=2)
    assert layout["tp"] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout["dp"] == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout["pp"] == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_megatron_layout_16_ranks_tp2_pp4():
    # The example in Megatron-LM's initialize_model_parallel docstring (16 GPUs, tp=2, pp=4, dp=2).
    layout = parallel_layout(16, tp=2, pp=4)
    assert layout["tp"] == tuple((i, i + 1) for i in range(0, 16, 2))
    assert layout["dp"] == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15))
    assert layout["pp"] == ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))


@pytest.mark.parametrize(
    ("world", "tp", "pp", "dp"),
    [(8, 2, 2, 2), (8, 4, 2, 1), (8, 1, 2, 4), (8, 8, 1, 1), (12, 2, 3, 2), (6, 3, 1, 2), (1, 1, 1, 1)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"])
def test_every_rank_is_in_exactly_one_group_per_kind_and_groups_are_orthogonal(world, tp, pp, dp, order):
    layout = parallel_layout(world, tp=tp, pp=pp, dp=dp, order=order)
    for kind, size in (("tp", tp), ("pp", pp), ("dp", dp)):
        groups = layout[kind]
        assert len(groups) == world // size and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(world))
    # A TP group and a DP group share at most one rank (and so for every pair of kinds): the grid's lines.
    for a, b in (("tp", "dp"), ("tp", "pp"), ("dp", "pp")):
        for ga in layout[a]:
            for gb in layout[b]:
                assert len(set(ga) & set(gb)) <= 1
    # The fastest-varying kind of the order is made of consecutive ranks.
    fastest = order.split("-")[0]
    assert all(g == tuple(range(g[0], g[0] + len(g))) for g in layout[fastest])


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"tp": 2, "pp": 2, "dp": 3}, "= 12 ranks, but the world has 8"),
        ({"tp": 3}, "does not divide the world size 8"),
        ({"tp": 0}, "tp=0 must be at least 1"),
        ({"pp": -2}, "pp=-2 must be at least 1"),
        ({"dp": 0}, "dp=0 must be at least 1"),
        ({"tp": 2.0}, "must be a positive integer"),
        ({"tp": True}, "must be a positive integer"),
        ({"order": "tp-pp"}, "must name tp, dp and pp once each"),
    ],
    ids=["product", "not-divisible", "tp-zero", "pp-negative", "dp-zero", "float", "bool", "order"],
)
def test_bad_sizes_raise_invalid_argument_saying_what_fits(kwargs, phrase):
    with pytest.raises(xccl.InvalidArgument, match=phrase) as info:
        parallel_layout(8, **kwargs)
    assert isinstance(info.value, ValueError)  # torch.distributed code catching ValueError keeps working


def test_product_error_suggests_the_dp_that_fits():
    with pytest.raises(xccl.InvalidArgument, match=r"dp=2 fits"):
        parallel_layout(8, tp=2, pp=2, dp=4)


def test_parallel_groups_before_init_is_an_init_error():
    with pytest.raises(xccl.InitError, match=r"xccl\.init"):
        xccl.parallel_groups(tp=1)


# ------------------------------------------------------------------------------------------ real groups


def body_groups(tp: int, pp: int, dp: int | None) -> dict[str, object]:
    """Build the groups, prove each is the group it claims to be with an all_reduce, report what was built."""
    pg = xccl.parallel_groups(tp=tp, pp=pp, dp=dp)
    rank = xccl.get_world().rank
    out: dict[str, object] = {}
    for g in pg:
        t = torch.tensor([float(rank)])
        xccl.all_reduce(t, group=g.group)
        out[g.kind] = {
            "ranks": g.ranks, "rank": g.rank, "size": g.size, "comm": g.comm_name, "sum": t.item(),
            "again": xccl.comm_name(g.group),
        }
    mesh = pg.mesh
    out["mesh"] = {
        "names": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "same_groups": all(mesh.get_group(k) is pg[k].group for k in ("tp", "pp", "dp")),
    }
    out["layout"] = dict(pg.layout)
    return out


@pytest.mark.parametrize(
    ("world", "tp", "pp", "dp"),
    [(4, 2, 2, None), (4, 1, 2, 2), (8, 2, 2, 2), (8, 2, 1, None)],
    ids=["4:tp2-pp2", "4:pp2-dp2", "8:tp2-pp2-dp2", "8:tp2-dp4"],
)
def test_groups_are_real_and_laid_out_megatron_style(rank_pools, world, tp, pp, dp):
    outs = rank_pools.get(world).run_ok(body_groups, tp, pp, dp, timeout=120)
    layout = parallel_layout(world, tp=tp, pp=pp, dp=dp)
    names: dict[tuple[str, tuple[int, ...]], str] = {}
    for rank, out in enumerate(outs):
        assert out["layout"] == layout
        for kind in ("tp", "pp", "dp"):
            g = out[kind]
            (expected,) = [grp for grp in layout[kind] if rank in grp]
            assert g["ranks"] == expected and g["rank"] == expected.index(rank) and g["size"] == len(expected)
            # The all_reduce summed exactly the members' ranks: the group really is those ranks.
            assert g["sum"] == float(sum(expected)), (kind, rank, g)
            assert g["comm"] and g["comm"] == g["again"]
            # Every member of a group reports the same communicator name.
            assert names.setdefault((kind, expected), g["comm"]) == g["comm"], (kind, expected)
        assert out["mesh"] == {"names": ("pp", "dp", "tp"), "shape": (pp, world // (tp * pp), tp), "same_groups": True}
    # One name per group, never shared between two groups (two single-rank groups of one rank included).
    assert len(set(names.values())) == len(names) == sum(len(v) for v in layout.values())


def body_bad() -> None:
    xccl.parallel_groups(tp=3)


def body_world_sum() -> float:
    t = torch.ones(1)
    xccl.all_reduce(t)
    return t.item()


def test_bad_sizes_fail_alike_on_every_rank_before_any_group_is_created(rank_pools):
    pool = rank_pools.get(4)
    for o in pool.run(body_bad, timeout=30):
        assert o.raised(xccl.InvalidArgument) and "does not divide the world size 4" in o.message, str(o)
    assert pool.run_ok(body_world_sum) == [4.0] * 4
