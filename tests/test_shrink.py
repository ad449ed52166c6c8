"""Surviving a lost rank in place: ``dist.shrink_group`` on xccl's world, on every vendor (docs/elastic.md).

Four plain processes (a :class:`~xccl.testing.RankPool`, not torchrun, whose agent would kill the survivors) train a
small DDP model; the last rank is SIGKILLed between steps. Every survivor gets :class:`~xccl.PeerFailure` naming the
same lost rank (``err.ranks``), calls ``dist.shrink_group(list(err.ranks))``, rebuilds DDP on the new world and
trains on: the weights are identical on every survivor and equal a 3-rank reference computed here from the state
the survivors started from, and the new world is xccl's (its collectives go through xccl's dispatch and recorder).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import xccl
from xccl.testing import RankPool, all_here

TIMEOUT = 6.0  # short, for the loss the test provokes; long enough for ranks of a loaded machine to meet
ROWS = 12  # divisible by 4 and by 3: every rank's share of a step's batch is equal before and after the shrink
STEPS_BEFORE, STEPS_AFTER = 3, 4
LR = 0.1


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch: the same on every rank, split by rank."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 2, generator=g)


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, size: int) -> float:
    x, y = _batch(step)
    xs, ys = x.chunk(size)[rank], y.chunk(size)[rank]
    loss = nn.functional.mse_loss(model(xs), ys)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def _lose(victim: int, path: str) -> list[int]:
    """A collective on the world, then ``victim`` dies; every survivor returns what its next collective's
    PeerFailure names (``err.ranks``)."""
    xccl.all_reduce(torch.ones(1))
    if dist.get_rank() == victim:
        _die(path)
    try:
        xccl.all_reduce(torch.ones(1))
    except xccl.PeerFailure as err:
        return list(err.ranks)
    raise AssertionError(f"rank {victim} was killed, yet the collective after it completed")


def _die(path: str) -> None:
    Path(path).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def body_shrink_and_train_on(victim: int, path: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    all_here("body_shrink_and_train_on")
    w = xccl.get_world()
    module = _module()
    model = DDP(module)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    for step in range(STEPS_BEFORE):
        _step(model, opt, step, w.rank, w.world_size)
    comms_before = [(c.ranks, c.memory_mb) for c in xccl.runtime.communicators()]
    if w.rank == victim:
        _die(path)  # between steps: no survivor can finish the next one
    try:
        _step(model, opt, STEPS_BEFORE, w.rank, w.world_size)
        return {"error": "no error"}
    except xccl.PeerFailure as err:
        faulted, lost = time.time(), list(err.ranks)
    # The old DDP's reducer keeps hooks on the parameters, mid-iteration: drop it before training on without it
    # (shrink_group collects what the dropped objects left in reference cycles).
    del model
    opt.zero_grad(set_to_none=True)  # the lost step's gradients, partly reduced: the step in flight is lost
    new_world = dist.shrink_group(lost)
    shrunk = time.time()
    model = DDP(module)  # on the new world; broadcasts rank 0's weights, as at any DDP start
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    start = [p.detach().clone() for p in module.parameters()]
    nw = xccl.get_world()
    first = None
    for step in range(STEPS_BEFORE + 1, STEPS_BEFORE + 1 + STEPS_AFTER):
        _step(model, opt, step, nw.rank, nw.world_size)
        first = first or time.time()
    # The new world is xccl's: an op the vendor lacks still runs (Sophgo: reduce_scatter is emulated), and the
    # recorder saw the shrink.
    out = torch.empty(2)
    xccl.reduce_scatter_tensor(out, torch.ones(2 * nw.world_size))
    from xccl.collectives._flight import recorder
    ring = recorder()
    notes = [e.note for e in ring.entries() if e.op == "shrink_group"] if ring is not None else []
    return {
        "lost": lost, "faulted": faulted, "shrunk": shrunk, "first_step": first,
        "is_world": new_world is dist.group.WORLD, "rank": dist.get_rank(), "size": dist.get_world_size(),
        "xccl_world": (nw.rank, nw.world_size), "backend": str(dist.get_backend()),
        "start": start, "final": [p.detach().clone() for p in module.parameters()],
        "reduce_scatter": out.tolist(), "notes": notes, "comms_before": comms_before,
        "comms_after": [(c.ranks, c.memory_mb) for c in xccl.runtime.communicators()],
    }


def _reference(start: list[torch.Tensor]) -> list[torch.Tensor]:
    """3 ranks averaging gradients of equal shares = one process on the whole batch (mean losses)."""
    module = _module()
    with torch.no_grad():
        for p, s in zip(module.parameters(), start, strict=True):
            p.copy_(s)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    for step in range(STEPS_BEFORE + 1, STEPS_BEFORE + 1 + STEPS_AFTER):
        _step(module, opt, step, 0, 1)
    return [p.detach() for p in module.parameters()]


@pytest.mark.parametrize("vendor", ["cpu", "ascend"])
def test_survivors_shrink_the_world_and_train_on(tmp_path: Path, vendor: str) -> None:
    path = tmp_path / "death"
    env = {} if vendor == "cpu" else {"XCCL_SIMULATE": vendor}
    if vendor == "ascend":
        env["HCCL_EXEC_TIMEOUT"] = str(int(TIMEOUT))
    with RankPool(4, {"timeout": TIMEOUT, "fallback": "emulate"}, env=env, start_method="forkserver",
                  start_timeout=120) as pool:
        outs = pool.run(body_shrink_and_train_on, 3, str(path), timeout=TIMEOUT + 90)
    assert outs[3].raised("RankDied"), str(outs[3])
    reports = []
    for r, o in enumerate(outs[:3]):
        assert o.ok, f"rank {r}: {o}"
        reports.append(o.value)
    died = float(path.read_text())
    for r, rep in enumerate(reports):
        assert rep.get("lost") == [3], f"rank {r}: {rep}"
        assert rep["is_world"] and rep["rank"] == r and rep["size"] == 3 and rep["xccl_world"] == (r, 3), rep
        assert rep["backend"].startswith("xccl_"), rep
        assert rep["reduce_scatter"] == [3.0, 3.0], rep
        assert len(rep["notes"]) == 1 and "excluded [3]" in rep["notes"][0], rep["notes"]
        assert rep["faulted"] - died < TIMEOUT + 5, rep
        # The old world's communicators are gone: what is left is the new world's, as many as the old world had
        # (the world's; DDP uses it), so the device memory they hold is the new world's, not the old one's on top.
        before, after = rep["comms_before"], rep["comms_after"]
        assert {ranks for ranks, _ in before} == {(0, 1, 2, 3)} and {ranks for ranks, _ in after} == {(0, 1, 2)}, rep
        assert len(after) == len(before) and [mb for _, mb in after] == [mb for _, mb in before], rep
        if vendor == "ascend":
            assert all(mb for _, mb in after), after  # HCCL's 2 x HCCL_BUFFSIZE each
    ref = _reference(reports[0]["start"])
    for r, rep in enumerate(reports):
        for a, b in zip(rep["start"], reports[0]["start"], strict=True):
            assert torch.equal(a, b), f"rank {r} started the shrunk world from other weights"
        for a, b in zip(rep["final"], reports[0]["final"], strict=True):
            assert torch.equal(a, b), f"rank {r} ended with other weights than rank 0"
        for a, b in zip(rep["final"], ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    took = max(rep["first_step"] for rep in reports) - died
    print(f"\n{vendor}: kill -> first step on the shrunk world {took:.2f} s (collective timeout {TIMEOUT:g} s)")


# ------------------------------------------------------------------------------- the vendors' placement, renumbered


def body_lose_rank_1(path: str) -> dict[str, Any]:
    """Rank 1 dies; the survivors (old 0, 2, 3) become 0, 1, 2 and report what the vendor sees of the new world."""
    all_here("body_lose_rank_1")
    w = xccl.get_world()
    before = xccl.comm_name()
    xccl.all_reduce(torch.ones(1))
    if w.rank == 1:
        _die(path)
    try:
        xccl.all_reduce(torch.ones(1))
        return {"error": "no error"}
    except xccl.PeerFailure as err:
        lost = list(err.ranks)
    dist.shrink_group(lost)
    t = torch.ones(1)
    xccl.all_reduce(t)
    out: dict[str, Any] = {"lost": lost, "rank": dist.get_rank(), "sum": float(t), "comm": xccl.comm_name(),
                           "before": before}
    if w.plugin == "ascend":
        from xccl_ascend._ranktable import load_hccl

        table = load_hccl(os.environ["RANK_TABLE_FILE"])
        out["table"] = [(d.rank_id, d.device_id) for s in table.servers for d in s.devices]
    return out


def _survivors_of_rank_1(tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run :func:`body_lose_rank_1` on 4 ranks; the reports of old ranks 0, 2 and 3, each checked to be new rank
    0, 1 and 2 of a working world of 3 that lost rank 1."""
    with RankPool(4, {"timeout": TIMEOUT}, env=env, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_lose_rank_1, str(tmp_path / "death"), timeout=TIMEOUT + 90)
    assert outs[1].raised("RankDied"), str(outs[1])
    reports = []
    for new, old in enumerate([0, 2, 3]):
        rep = outs[old].value
        assert outs[old].ok and rep["lost"] == [1] and rep["rank"] == new and rep["sum"] == 3.0, str(outs[old])
        reports.append(rep)
    return reports


def body_sophgo_shrink() -> tuple[str, str, float]:
    try:
        dist.shrink_group([1 - dist.get_rank()])  # the other rank: torch refuses excluding oneself first
        said = "shrunk"
    except xccl.UnsupportedCollective as exc:
        said = f"{exc.op}: {exc.detail}"
    t = torch.ones(1)
    xccl.all_reduce(t)  # the world is untouched
    return said, str(dist.get_world_size()), float(t)


def test_sophgo_refuses_an_in_place_shrink_before_tearing_anything_down(rank_pools: Any) -> None:
    """SCCL has no timeout, no error path and no abort (sophgo/torch-tpu@fe9b478): a collective with a dead chip
    wedges the TPU stream, so its recovery is a restart. dist.shrink_group says so on every rank, and the world it
    was asked to shrink still works."""
    outs = rank_pools.get(2, vendor="sophgo", simulate=True).run_ok(body_sophgo_shrink, timeout=120)
    for said, size, total in outs:
        assert said.startswith("shrink_group: SCCL cannot survive a lost chip in place: it has no timeout"), said
        assert "Nothing was torn down: restart the job and resume" in said and (size, total) == ("2", 2.0), outs


def test_ascend_survivors_get_their_rank_table(tmp_path: Path) -> None:
    from xccl_ascend._ranktable import generate_hccl

    from xccl.plugin import dump

    table = tmp_path / "rank_table.json"
    dump(generate_hccl([4, 5, 6, 7], ["10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7"]), table)
    env = {"XCCL_SIMULATE": "ascend", "RANK_TABLE_FILE": str(table), "HCCL_CONNECT_TIMEOUT": "300",
           "HCCL_EXEC_TIMEOUT": str(int(TIMEOUT))}
    for rep in _survivors_of_rank_1(tmp_path, env):
        # The survivors' table: ranks renumbered 0..2, each on the device the old rank had.
        assert rep["table"] == [(0, 4), (1, 6), (2, 7)], rep["table"]


# ------------------------------------------------------------------------------------- a second loss, subgroups


def body_lose_two_in_turn(paths: list[str]) -> dict[str, Any]:
    """Rank 3 dies, the world shrinks to 3; then (new) rank 1 dies, and it shrinks to 2: the second loss is named by
    its new rank, which needs the liveness facts carried over to the new world."""
    all_here("body_lose_two_in_turn")
    w = xccl.get_world()
    seen = []
    for victim, path in zip((3, 1), paths, strict=True):
        xccl.all_reduce(torch.ones(1))
        if dist.get_rank() == victim:
            _die(path)
        try:
            xccl.all_reduce(torch.ones(1))
            return {"error": "no error"}
        except xccl.PeerFailure as err:
            seen.append(list(err.ranks))
            dist.shrink_group(list(err.ranks))
    t = torch.ones(1)
    xccl.all_reduce(t)
    return {"seen": seen, "old": w.rank, "rank": dist.get_rank(), "size": dist.get_world_size(), "sum": float(t)}


def test_a_second_loss_is_named_by_its_new_rank_and_shrunk_again(tmp_path: Path) -> None:
    paths = [str(tmp_path / "death3"), str(tmp_path / "death1")]
    with RankPool(4, {"timeout": TIMEOUT}, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_lose_two_in_turn, paths, timeout=2 * TIMEOUT + 120)
    assert outs[3].raised("RankDied") and outs[1].raised("RankDied"), [str(o) for o in outs]
    for new, old in enumerate([0, 2]):
        rep = outs[old].value
        assert outs[old].ok, str(outs[old])
        assert rep["seen"] == [[3], [1]] and rep["rank"] == new and rep["size"] == 2 and rep["sum"] == 2.0, rep


def body_shrink_a_subgroup(path: str) -> dict[str, Any]:
    """A sub-group of ranks 1, 2, 3 loses rank 3: ranks 1 and 2 shrink it (group ranks, as torch's API takes);
    rank 0, outside it, is not involved, and the world is left as it is."""
    all_here("body_shrink_a_subgroup")
    sub = xccl.new_group([1, 2, 3])
    r = dist.get_rank()
    if r == 0:
        return {"rank": 0}
    xccl.all_reduce(torch.ones(1), group=sub)
    if r == 3:
        _die(path)
    try:
        xccl.all_reduce(torch.ones(1), group=sub)
        return {"error": "no error"}
    except xccl.PeerFailure as err:
        lost = list(err.ranks)  # global ranks
    new = dist.shrink_group([dist.get_group_rank(sub, g) for g in lost], group=sub)
    t = torch.ones(1)
    xccl.all_reduce(t, group=new)
    return {"rank": r, "lost": lost, "members": dist.get_process_group_ranks(new), "sum": float(t),
            "world": dist.get_world_size(), "old_gone": sub not in dist.distributed_c10d._world.pg_names}


def test_a_subgroup_shrinks_among_its_survivors(tmp_path: Path) -> None:
    with RankPool(4, {"timeout": TIMEOUT}, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_shrink_a_subgroup, str(tmp_path / "death"), timeout=TIMEOUT + 90)
    assert outs[3].raised("RankDied") and outs[0].ok, [str(o) for o in outs]
    for r in (1, 2):
        rep = outs[r].value
        assert outs[r].ok and rep["lost"] == [3] and rep["members"] == [1, 2] and rep["sum"] == 2.0, str(outs[r])
        assert rep["world"] == 4 and rep["old_gone"], rep


# ------------------------------------------------------------------------------------------------ bad input


def body_disagree(path: str) -> dict[str, Any]:
    """Rank 3 dies; ranks 0 and 1 exclude it, rank 2 (wrongly) excludes 1 as well: nobody meets a wrong world."""
    all_here("body_disagree")
    lost = _lose(3, path)
    if dist.get_rank() == 2:
        lost = [1, *lost]
    out: dict[str, Any] = {}
    try:
        dist.shrink_group([dist.get_rank()])
    except RuntimeError as exc:
        out["self"] = str(exc)
    try:
        dist.shrink_group(lost)
    except xccl.RendezvousTimeout as exc:
        out["timeout"] = str(exc)
    return out


def test_survivors_that_disagree_get_a_typed_error_naming_what_each_asked(tmp_path: Path) -> None:
    # Longer than the collective timeout: a survivor not talking to the lost rank asks only after waiting it out.
    env = {"XCCL_SETUP_TIMEOUT": str(int(TIMEOUT) + 4)}
    with RankPool(4, {"timeout": TIMEOUT}, env=env, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_disagree, str(tmp_path / "death"), timeout=TIMEOUT + 90)
    for r in (0, 1, 2):
        rep = outs[r].value
        assert outs[r].ok, str(outs[r])
        # torch's own check comes first: a rank never excludes itself.
        assert "is in the exclusion list" in rep["self"], rep
        assert "not every survivor came" in rep["timeout"], rep
    assert "rank 2 keeps [0,2]" in outs[0].value["timeout"], outs[0].value
    assert "keeps [0,1,2]" in outs[2].value["timeout"], outs[2].value


def body_abort(path: str) -> dict[str, Any]:
    """SHRINK_ABORT: the old world's backends are aborted instead of destroyed in order; the new world works."""
    all_here("body_abort")
    lost = _lose(3, path)
    dist.shrink_group(lost, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"sum": float(t), "size": dist.get_world_size()}


def test_shrink_abort_aborts_the_old_world_and_goes_on(tmp_path: Path) -> None:
    with RankPool(4, {"timeout": TIMEOUT}, start_method="forkserver", start_timeout=120) as pool:
        outs = pool.run(body_abort, str(tmp_path / "death"), timeout=TIMEOUT + 90)
    assert outs[3].raised("RankDied"), str(outs[3])
    for r in range(3):
        assert outs[r].ok and outs[r].value == {"sum": 3.0, "size": 3}, str(outs[r])


def body_not_xccls() -> dict[str, Any]:
    """A group that is not xccl's (plain gloo, made beside xccl's world) goes to torch's own shrink_group."""
    g = dist.new_group(backend="gloo")
    out: dict[str, Any] = {"installed": dist.shrink_group is dist.distributed_c10d.shrink_group}
    try:
        dist.shrink_group([1 - dist.get_rank()], group=g)
    except TypeError as exc:
        out["error"] = str(exc)
    dist.destroy_process_group(g)
    return out


def test_a_group_that_is_not_xccls_gets_torchs_shrink(rank_pools: Any) -> None:
    for r, out in enumerate(rank_pools.get(2, vendor="cpu").run_ok(body_not_xccls)):
        assert out["installed"], out
        assert "does not support shrinking operations" in out.get("error", ""), f"rank {r}: {out}"


@pytest.mark.slow  # four fresh interpreters (30-40 s on a loaded 2-core machine); the mechanism is tested above
@pytest.mark.parametrize("vendor", ["ascend", "sophgo"])
def test_the_example_runs_as_its_docstring_says(tmp_path: Path, vendor: str) -> None:
    """examples/lose_a_rank.py, four plain processes losing rank 1 (the first-hour command): on simulated Ascend
    with a rank table, the survivors shrink onto the table xccl wrote; on simulated Sophgo they are refused and
    exit 3 for a restart."""
    import socket
    import subprocess
    import sys

    from xccl_ascend._ranktable import generate_hccl

    from xccl.plugin import dump

    table = tmp_path / "rank_table.json"
    dump(generate_hccl([0, 1, 2, 3]), table)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    example = Path(__file__).resolve().parents[1] / "examples" / "lose_a_rank.py"
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    extra = {"HCCL_EXEC_TIMEOUT": "6", "HCCL_CONNECT_TIMEOUT": "300", "RANK_TABLE_FILE": str(table)}
    procs = [subprocess.Popen([sys.executable, str(example)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env={**base, "RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r),
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                              "XCCL_SIMULATE": vendor, "XCCL_TIMEOUT": "6",
                                              **(extra if vendor == "ascend" else {})})
             for r in range(4)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[1].returncode == 1, outs
    shrunk = str(table.with_suffix("")) + ".shrunk-0-2-3.json"
    for new, r in enumerate((0, 2, 3)):
        if vendor == "sophgo":
            assert procs[r].returncode == 3, (r, outs[r])
            assert re.search(r"lost \[1\] \(PeerFailure after [\d.]+ s\): .*restart the job", outs[r]), outs[r]
            continue
        assert re.search(rf"lost \[1\] \(PeerFailure after [\d.]+ s\): rank {new} of 3, all_reduce 3\.0, "
                         + re.escape(shrunk), outs[r]), outs[r]
