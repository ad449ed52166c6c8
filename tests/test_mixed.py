"""Mixed-vendor worlds (issue 25, docs/mixed.md): 2 simulated-Ascend + 2 simulated-Sophgo ranks in one world.

One module-scoped pool for the world's map, every collective against the reference, the links' bytes and the
Sophgo island's emulation; fresh small pools only for the refusals at init.
"""

from __future__ import annotations

import re

import mixed_bodies as B
import pytest

from xccl.collectives._islands import islands_of
from xccl.testing._pool import RankPool
from xccl.testing._stacks import training_steps

_ASCEND_SOPHGO = {0: {"XCCL_SIMULATE": "ascend"}, 1: {"XCCL_SIMULATE": "ascend"},
                  2: {"XCCL_SIMULATE": "sophgo"}, 3: {"XCCL_SIMULATE": "sophgo"}}
_CPU_SOPHGO = {2: {"XCCL_SIMULATE": "sophgo"}, 3: {"XCCL_SIMULATE": "sophgo"}}


@pytest.fixture(scope="module")
def mixed():
    with RankPool(4, env={"XCCL_HETEROGENEOUS": "1", "XCCL_TRACE": "1"}, rank_env=_ASCEND_SOPHGO) as pool:
        yield pool


def test_every_rank_gets_the_same_world_map(mixed):
    got = mixed.run_ok(B.world_map)
    assert [g[0] for g in got] == ["ascend", "ascend", "sophgo", "sophgo"]
    assert all(g[1:] == got[0][1:] for g in got)
    assert got[0][1] == [("ascend", [0, 1]), ("sophgo", [2, 3])]


def test_every_collective_equals_the_reference_across_islands(mixed):
    assert mixed.run_ok(B.collectives, timeout=120) == [[], [], [], []]


def test_reduce_scatter_is_emulated_only_in_sophgos_island_and_crosses_with_1_over_k(mixed):
    numel = 4096
    got = mixed.run_ok(B.links_of_reduce_scatter, numel)
    assert all(g["ok"] for g in got)
    # Ascend's island runs its native reduce_scatter; Sophgo's emulates it (all_to_all_single + a local sum).
    assert [g["entries"] for g in got[:2]] == [[("reduce_scatter_tensor", [])]] * 2
    assert [g["entries"] for g in got[2:]] == [[("reduce_scatter_tensor", ["all_to_all_single"])]] * 2
    # Every byte enters the island's collective; 1/k of them (k = 2 ranks per island) cross between islands.
    assert all(g["island"] == numel * 4 and g["cross"] == numel * 4 // 2 for g in got)


def test_a_group_inside_one_island_is_the_vendors_and_one_across_is_composed(mixed):
    got = mixed.run_ok(B.sub_groups)
    assert got[0] == {"inside": {"composed": False, "value": 3.0}}
    assert got[1] == {"inside": {"composed": False, "value": 3.0}, "across": {"composed": True, "value": 5.0}}
    assert got[2] == {"across": {"composed": True, "value": 5.0}}
    assert got[3] == {}


@pytest.mark.parametrize("dst", [1, 2], ids=["root-on-ascend", "root-on-sophgo"])
def test_torch_gather_runs_across_islands_whatever_each_vendor_calls(mixed, dst):
    # torch_npu replaces dist.gather on the Ascend ranks (simulated): the islands make different calls, which the
    # group's gather composition matches (it used to wait for the timeout).
    got = mixed.run_ok(B.torch_gather, dst, timeout=60)
    n = len(got)
    assert got[dst] == [[float(r)] * 3 for r in range(n)]
    assert all(g is None for r, g in enumerate(got) if r != dst)


def test_islands_of_groups_ranks_by_plugin():
    m = islands_of([(2, "sophgo", "sccl", "b"), (0, "cpu", "gloo", "a"), (1, "sophgo", "sccl", "b")])
    assert [(i.plugin, i.ranks) for i in m.islands] == [("cpu", (0,)), ("sophgo", (1, 2))]
    assert m.mixed and m.island_of(2).backend == "sccl"
    assert m.split([2, 0, 1]) == ((2, 1), (0,))
    with pytest.raises(ValueError):
        islands_of([(1, "cpu", "gloo", "a")])


def _init_errors(rank_env: dict[int, dict[str, str]]) -> list[str]:
    """Each rank's InitError message, from a pool that must fail to start."""
    pool = RankPool(4, rank_env=rank_env, start_method="forkserver", start_timeout=60)
    with pytest.raises(RuntimeError) as info:
        pool.start()
    return re.findall(r"^rank \d: InitError: (.*)$", str(info.value), re.MULTILINE)


def test_without_the_switch_differing_vendors_stay_an_init_error():
    errors = _init_errors(_ASCEND_SOPHGO)
    assert len(errors) == 4
    assert all("They differ in plugin (XCCL_VENDOR" in e for e in errors)


def test_a_switch_set_on_some_ranks_only_is_an_init_error_naming_them():
    renv = {r: {**v, "XCCL_HETEROGENEOUS": "1" if r < 2 else "0"} for r, v in _ASCEND_SOPHGO.items()}
    errors = _init_errors(renv)
    assert len(errors) == 4
    for e in errors:
        assert "mixed-vendor switch (XCCL_HETEROGENEOUS" in e
        assert re.search(r"ranks \[0, 1\] on .* have ascend, hccl, on; ranks \[2, 3\] on .* have sophgo, sccl, off", e), e


@pytest.fixture(scope="module")
def cpu_sophgo():
    with RankPool(4, env={"XCCL_HETEROGENEOUS": "1"}, rank_env=_CPU_SOPHGO) as pool:
        yield pool


# cpu + Sophgo islands train in the second tier (15 s); the first trains the Ascend + Sophgo world, and checks
# the cpu + Sophgo one's collectives against the reference (test_cpu_and_sophgo_islands_give_the_reference).
@pytest.mark.parametrize("world", ["mixed", pytest.param("cpu_sophgo", marks=pytest.mark.slow)])
def test_ddp_and_fsdp2_train_as_the_single_process_reference(world, request):
    pool = request.getfixturevalue(world)
    got = pool.run_ok(training_steps, timeout=180)
    assert got == [{"ddp": {"ok": ""}, "fsdp2": {"ok": ""}}] * 4, got


def test_cpu_and_sophgo_islands_give_the_reference(cpu_sophgo):
    assert [g[1] for g in cpu_sophgo.run_ok(B.world_map)] == [[("cpu", [0, 1]), ("sophgo", [2, 3])]] * 4
    assert cpu_sophgo.run_ok(B.collectives, timeout=120) == [[], [], [], []]


# 12 s a case (4 ranks started fresh, a death, the survivors' errors): the second island in the second tier.
@pytest.mark.parametrize(("rank_env", "victim"), [(_ASCEND_SOPHGO, 1), pytest.param(_CPU_SOPHGO, 3, marks=pytest.mark.slow)],
                         ids=["ascend-island", "sophgo-island"])
def test_a_rank_killed_on_either_island_is_a_typed_error_on_every_survivor(rank_env, victim):
    # timeout=10: the host groups keep it, though Ascend's watchdog policy raises its island group's above
    # HCCL_EXEC_TIMEOUT (a peer's death is seen at once all the same: its connections close).
    with RankPool(4, {"timeout": 10}, env={"XCCL_HETEROGENEOUS": "1"}, rank_env=rank_env, start_method="forkserver",
                  start_timeout=60) as pool:
        outs = pool.run(B.fault, victim, timeout=60)
    assert outs[victim].raised("RankDied")
    for o in outs:
        if o.rank == victim:
            continue
        assert o.ok, str(o)
        assert "XcclError" in o.value["types"] and {"PeerFailure", "CollectiveTimeout"} & set(o.value["types"]), o
        assert o.value["op"] in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"), o.value
        assert o.value["after"] < 10 + 5, o.value


def test_islands_of_unequal_size_give_the_reference():
    # 1 Ascend + 3 cpu ranks: every composition takes the leaders' path or the host group.
    renv = {0: {"XCCL_SIMULATE": "ascend"}}
    with RankPool(4, env={"XCCL_HETEROGENEOUS": "1"}, rank_env=renv, start_method="forkserver",
                  start_timeout=60) as pool:
        assert [g[1] for g in pool.run_ok(B.world_map)] == [[("ascend", [0]), ("cpu", [1, 2, 3])]] * 4
        assert pool.run_ok(B.collectives, timeout=120) == [[], [], [], []]


def test_an_island_part_refused_by_the_policy_fails_on_every_rank_before_communicating():
    # fallback="error": Sophgo's island could only emulate reduce_scatter, so the mixed group refuses it on every
    # rank (Ascend's too, whose own part is native); all_reduce takes the leaders' path (reduce + broadcast).
    with RankPool(4, {"fallback": "error"}, env={"XCCL_HETEROGENEOUS": "1"}, rank_env=_ASCEND_SOPHGO,
                  start_method="forkserver", start_timeout=60) as pool:
        got = pool.run_ok(B.refusals, timeout=60)
    for g in got:
        kind, message = g["reduce_scatter_tensor"]
        assert kind == "UnsupportedCollective" and "sophgo's island cannot do its part" in message, g
        assert g["all_reduce ok"], g


def test_caps_group_shows_the_derived_table(capsys):
    from xccl.tools.cli import main

    assert main(["caps", "--group", "ascend:2,sophgo:2"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[1:])
    assert rows["reduce_scatter_tensor"] == "hierarchical (sophgo emulates reduce_scatter_tensor)"
    assert rows["all_gather_into_tensor"] == "hierarchical" and rows["all_to_all_single"] == "host-staged"
    assert main(["caps", "--group", "ascend:x"]) == 2


def test_graph_mode_on_a_group_spanning_islands_is_refused_alike_on_every_rank(mixed):
    # A compiled collective is lowered by each rank's own compiler (TorchAir turns it into an HCCL operator over
    # the whole group, which cannot reach the Sophgo ranks) and would take each island's own graph layers; the
    # composition runs only eagerly. Every rank refuses at trace time, so none is left waiting in a collective.
    got = mixed.run_ok(B.compiled, timeout=180)
    for g in got:
        for op in ("all_reduce", "reduce_scatter_tensor"):
            kind, message = g[op]
            assert kind == "UnsupportedCollective" and "spans islands" in message and "graph mode" in message, g
        assert g["eager all_reduce ok"], g


def test_fused_ops_on_a_group_spanning_islands_take_the_portable_path_and_equal_the_reference(mixed):
    # Ascend's ranks have native MC2 kernels, Sophgo's do not: on a group spanning both every rank must take the
    # portable version, whose collectives are composed across the islands.
    assert mixed.run_ok(B.fused, timeout=120) == [[], [], [], []]


# ------------------------------------------------------------------------------ a mixed group is its own kind


def body_async_returns_before_the_composition_completes(late: float) -> dict[str, object]:
    """Rank 3 enters an all_reduce ``late`` seconds after the others: their ``async_op=True`` call must return at
    once, not done, and its ``wait()`` completes it with the right sum."""
    import time

    import torch
    import torch.distributed as dist

    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if r == 3:
        time.sleep(late)
    t = torch.full((8,), float(r + 1))
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    returned, done = time.monotonic() - t0, work.is_completed()
    work.wait()
    return {"returned": returned, "done at return": done, "sum": t[0].item(), "want": n * (n + 1) / 2}


def body_a_groups_own_policy_governs_its_parts() -> dict[str, object]:
    """The world runs under the pool's fallback ("warn"); a group over the same ranks given its own ("error"):
    reduce_scatter_tensor, which Sophgo's island can only emulate, is refused there and runs on the world."""
    import torch
    import torch.distributed as dist

    import xccl
    from xccl.collectives._groups import register
    from xccl.collectives._state import PROCESS

    n = dist.get_world_size()
    strict = xccl.new_group(list(range(n)))
    register(strict, PROCESS.runtime, fallback="error")
    out: dict[str, object] = {}
    try:
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n), group=strict)
        out["strict"] = "ran"
    except Exception as exc:
        out["strict"] = [type(exc).__name__, str(exc)]
    got = torch.empty(2)
    dist.reduce_scatter_tensor(got, torch.ones(2 * n))
    out["world"] = got.tolist()
    return out


def test_async_op_on_a_mixed_group_returns_before_it_completes_and_wait_completes_it(mixed):
    got = mixed.run_ok(body_async_returns_before_the_composition_completes, 1.5, timeout=60)
    for g in got:
        assert g["sum"] == g["want"], g
    for g in got[:3]:  # those that did not wait for the late rank before calling
        assert g["returned"] < 0.5 and g["done at return"] is False, got


def test_a_mixed_groups_own_fallback_policy_governs_its_island_parts(mixed):
    for g in mixed.run_ok(body_a_groups_own_policy_governs_its_parts, timeout=60):
        kind, message = g["strict"]
        assert kind == "UnsupportedCollective" and "sophgo's island cannot do its part" in message, g
        assert g["world"] == [4.0, 4.0], g
