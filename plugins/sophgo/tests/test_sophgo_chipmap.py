"""The chip map: from the rank table (RANK_TABLE_FILE) or CHIP_MAP, checked against the C2C ring (the ring when none
is given); and every way a table is wrong.

``resolve_placement`` is what ``Runtime.place`` runs on hardware and in simulation; it is called here with the job
xccl would hand over and an explicit environment. Every malformed table must raise RankTableError naming the file, the JSON path of the field
and the problem.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from xccl_sophgo import _sdk as sdk_module
from xccl_sophgo import plugin
from xccl_sophgo._c2c import SG2260, board, vendor_chip_map
from xccl_sophgo._chipmap import Placement, resolve_placement
from xccl_sophgo._ranktable import generate_sophgo
from xccl_sophgo._runtime import SophgoRuntime
from xccl_sophgo._sdk import SimulatedSCCLOptions, SimulatedTpu, current_simulated_chip
from xccl_sophgo._simulation import check_sccl_options

import xccl
from xccl.plugin import Job, dump
from xccl.testing import RankPool

#: Sophgo's documented template (03_Tutorial.rst), verbatim.
TEMPLATE = Path(__file__).parent / "data" / "sophgo_template.json"
DEVICES = 8


def env(**values: object) -> dict[str, str]:
    return {k: str(v) for k, v in values.items()}


def placed(local_rank: int, values: dict[str, str]) -> Placement:
    """``resolve_placement`` for the job torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` in ``values``
    describe (what xccl hands the runtime), with the rest of ``values`` as the environment."""
    rest = dict(values)
    rank = int(rest.pop("RANK", local_rank))
    world = int(rest.pop("WORLD_SIZE", rank + 1))
    local_world = rest.pop("LOCAL_WORLD_SIZE", None)
    job = Job(rank, world, local_rank, None if local_world is None else int(local_world))
    return resolve_placement(job, DEVICES, rest)


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "rank_table.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Valid sources
# ---------------------------------------------------------------------------------------------------------------


def test_seed_template(tmp_path: Path) -> None:
    path = shutil.copy(TEMPLATE, tmp_path / "t.json")
    p = placed(1, env(RANK_TABLE_FILE=path, RANK=1, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2))
    assert (p.node_chips, p.chip, p.chip_map([0, 1])) == ((0, 1), 1, (0, 1))
    assert p.source == f"rank table {path}"


def test_generated_table_with_a_ring_order(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[0, 2, 6, 7, 3, 1, 5, 4]]), path)
    p = placed(2, env(RANK_TABLE_FILE=path, RANK=2, WORLD_SIZE=8, LOCAL_WORLD_SIZE=8))
    assert p.node_chips == (0, 2, 6, 7, 3, 1, 5, 4) and p.chip == 6
    assert p.chip_map([5, 1]) == (2, 1)  # group-rank order is ascending global rank


def test_generated_two_node_table(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[0, 1], [1, 0]]), path)
    p = placed(1, env(RANK_TABLE_FILE=path, RANK=3, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2))
    assert (p.node_chips, p.chip) == ((1, 0), 0)
    assert [p.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert p.chip_map(range(4)) == (0, 1, 1, 0)
    # The options: a node's own groups get that node's map; a group across nodes its members' chips.
    assert (p.group_chip_map([3]), p.group_chip_map([0, 1]), p.group_chip_map([1, 2])) == ((1, 0), (0, 1), (1, 1))


def test_rank_table_takes_precedence_over_chip_map(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[5, 4]]), path)
    p = placed(0, env(RANK_TABLE_FILE=path, CHIP_MAP="0,1", RANK=0, WORLD_SIZE=2))
    assert p.node_chips == (5, 4)


def test_chip_map_variable() -> None:
    p = placed(1, env(CHIP_MAP="3, 1", RANK=1, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2))
    assert (p.source, p.node_chips, p.chip, p.chip_map([0, 1])) == ("CHIP_MAP", (3, 1), 1, (3, 1))


def test_default_is_the_c2c_ring() -> None:
    """No map given: set_chip_map's [0, 1] for 1 or 2 ranks, else the board's ring (not the identity)."""
    p = placed(1, env(RANK=5, WORLD_SIZE=8, LOCAL_WORLD_SIZE=4))
    assert (p.source, p.node_chips, p.chip, p.replaced) == ("C2C ring", (0, 1, 3, 2), 1, None)
    assert p.chip_map([4, 5]) == (0, 1) and p.node_of(5) == 1
    p8 = placed(2, env(RANK=2, WORLD_SIZE=8, LOCAL_WORLD_SIZE=8))
    assert (p8.node_chips, p8.chip) == ((0, 2, 6, 7, 3, 1, 5, 4), 6)  # Sophgo's recommended eight-chip map
    assert placed(1, env(RANK=1, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2)).node_chips == (0, 1)
    # Without torchrun's variables: a single process on chip 0 (set_chip_map's [0, 1]).
    assert placed(0, {}).chip == 0


@pytest.mark.parametrize(("chip_map", "used"), [
    ("7,6,2,3", (7, 6, 2, 3)), ("1,0,2,3", (1, 0, 2, 3)), ("1,0,4,5", (1, 0, 4, 5)),  # the tutorial's examples
    ("2,3,7,6", (2, 3, 7, 6)),  # a rotation of a ring is one
    ("0,1,2,3", (0, 1, 3, 2)),  # 1-2 and 3-0 are not linked: replaced by the ring
    ("0,2,4,6", (0, 1, 3, 2)),
])
def test_given_map_is_checked_against_the_ring(chip_map: str, used: tuple[int, ...]) -> None:
    p = placed(0, env(CHIP_MAP=chip_map, RANK=0, WORLD_SIZE=4, LOCAL_WORLD_SIZE=4))
    given = tuple(int(c) for c in chip_map.split(","))
    assert (p.source, p.node_chips, p.replaced) == ("CHIP_MAP", used, None if used == given else given)


def test_two_and_one_ranks() -> None:
    two = env(RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2)
    assert placed(0, {**two, "CHIP_MAP": "6,2"}).node_chips == (6, 2)  # linked
    bad = placed(0, {**two, "CHIP_MAP": "0,3"})  # not linked: checked for 2 ranks too
    assert (bad.node_chips, bad.replaced) == ((0, 1), (0, 3))
    one = placed(0, env(CHIP_MAP="5", RANK=0, WORLD_SIZE=1, LOCAL_WORLD_SIZE=1))
    assert one.node_chips == (5,)  # one rank: taken as given


def test_no_ring_of_odd_size() -> None:
    with pytest.raises(xccl.InitError, match="no C2C ring of 3 chips"):
        placed(0, env(RANK=0, WORLD_SIZE=3, LOCAL_WORLD_SIZE=3))


def test_sg2260_board_as_documented() -> None:
    """Sophgo's topology figure: the ring 0-2-6-7-3-1-5-4 and the links 0-1, 2-3; the tutorial's maps are rings."""
    for ring in ([0, 2, 6, 7, 3, 1, 5, 4], [7, 6, 2, 3], [1, 0, 2, 3], [1, 0, 4, 5]):
        assert SG2260.is_ring(ring)
    assert SG2260.ring(8) == (0, 2, 6, 7, 3, 1, 5, 4)
    assert [SG2260.ring(n) for n in (3, 5, 7)] == [None, None, None]
    assert not SG2260.is_ring([0, 1, 2, 3]) and not SG2260.is_ring([0, 0]) and not SG2260.is_ring([0, 8])
    assert board(4).ring(4) == (0, 1, 3, 2) and board(2).ring(2) == (0, 1)
    assert vendor_chip_map(None, 2, SG2260) == (0, 1) and vendor_chip_map([3], 1, SG2260) == (3,)


def test_rank_table_map_replaced_on_its_node(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[7, 3, 5, 1]]), path)  # 3-5 and 1-7 are not linked
    p = placed(2, env(RANK_TABLE_FILE=path, RANK=2, WORLD_SIZE=4, LOCAL_WORLD_SIZE=4))
    assert (p.node_chips, p.replaced, p.chip) == ((0, 1, 3, 2), (7, 3, 5, 1), 3)
    assert p.chip_map(range(4)) == (0, 1, 3, 2)


@pytest.mark.parametrize(("values", "text"), [
    ({"CHIP_MAP": "[0, 1]"}, "looks like a Python list"),
    ({"CHIP_MAP": "0,0"}, "chip 0 appears twice"),
    ({"CHIP_MAP": "0,9"}, "chip 9 does not exist; this node has 8 TPUs"),
    ({"CHIP_MAP": "0"}, "maps 1 local ranks, but this node runs 2"),
    ({"CHIP_MAP": "0,a"}, "entry 1 ('a') is not a chip id"),
    ({"LOCAL_WORLD_SIZE": "16", "WORLD_SIZE": "16"}, "16 ranks on this node but only 8 TPUs"),
    ({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "2"}, "inconsistent"),
], ids=["list-literal", "duplicate", "no-such-chip", "too-short", "not-a-number", "too-many-ranks",
        "inconsistent"])
def test_bad_chip_map_or_job(values: dict[str, str], text: str) -> None:
    base = env(RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2)
    with pytest.raises(xccl.InitError) as info:
        placed(0, {**base, **values})
    assert text in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Malformed rank tables
# ---------------------------------------------------------------------------------------------------------------

Doc = Any


def _set(path: tuple[Any, ...], value: object) -> Callable[[Doc], Doc]:
    def mutate(doc: Doc) -> Doc:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc

    return mutate


def _drop(path: tuple[Any, ...]) -> Callable[[Doc], Doc]:
    def mutate(doc: Doc) -> Doc:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return doc

    return mutate


D0, D1 = ("node_list", 0, "device_list", 0), ("node_list", 0, "device_list", 1)

#: (id, mutation of the generated 2-rank table [[0, 1]] or raw file text, field, problem fragment)
MALFORMED: list[tuple[str, Callable[[Doc], Doc] | str, str, str]] = [
    ("missing-version", _drop(("version",)), "version", "is missing"),
    ("wrong-version", _set(("version",), "2.0"), "version", 'unsupported version "2.0"'),
    ("numeric-version", _set(("version",), 1.0), "version", "unsupported version 1.0"),
    ("missing-node-list", _drop(("node_list",)), "node_list", "is missing"),
    ("empty-node-list", _set(("node_list",), []), "node_list", "is empty"),
    ("missing-device-list", _drop(("node_list", 0, "device_list")), "node_list[0].device_list", "is missing"),
    ("empty-device-list", _set(("node_list", 0, "device_list"), []), "node_list[0].device_list", "is empty"),
    ("missing-device-id", _drop((*D1, "device_id")), "node_list[0].device_list[1].device_id", "is missing"),
    ("missing-rank", _drop((*D0, "rank")), "node_list[0].device_list[0].rank", "is missing"),
    ("duplicate-rank", _set((*D1, "rank"), "0"), "node_list[0].device_list[1].rank", "rank 0 is also given"),
    ("gap-in-ranks", _set((*D1, "rank"), "2"), "node_list[0].device_list[1].rank", "rank 1 is missing"),
    ("non-numeric-device-id", _set((*D0, "device_id"), "tpu0"), "node_list[0].device_list[0].device_id",
     '"tpu0" is not a number'),
    ("non-numeric-rank", _set((*D1, "rank"), "one"), "node_list[0].device_list[1].rank", '"one" is not a number'),
    ("device-id-out-of-range", _set((*D1, "device_id"), "8"), "node_list[0].device_list[1].device_id",
     "with 8 devices, device_id must be in [0, 7]"),
    ("negative-device-id", _set((*D0, "device_id"), "-1"), "node_list[0].device_list[0].device_id", "is negative"),
    ("duplicate-device-id", _set((*D1, "device_id"), "0"), "node_list[0].device_list[1].device_id",
     "may appear only once"),
    ("repeated-local-rank", _set((*D0, "local_rank"), "1"), "node_list[0].device_list[1].local_rank",
     "also the local_rank"),
    ("bad-device-ip", _set((*D0, "device_ip"), "localhost"), "node_list[0].device_list[0].device_ip",
     "is not an IPv4 address"),
    ("not-an-object", lambda doc: [doc], "$", "is an array"),
    ("invalid-json", '{"version": "1.0", "node_list": [', "$", "invalid JSON at line 1"),
    ("python-literal", "{'version': '1.0'}", "$", "invalid JSON"),
    ("world-size-mismatch", lambda doc: generate_sophgo([[0, 1, 2]]), "node_list",
     "lists 3 ranks, but this job has WORLD_SIZE=2"),
]


@pytest.mark.parametrize(("mutation", "field", "problem"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_rank_table(tmp_path: Path, mutation: Callable[[Doc], Doc] | str, field: str, problem: str) -> None:
    doc = mutation if isinstance(mutation, str) else mutation(copy.deepcopy(generate_sophgo([[0, 1]])))
    path = write(tmp_path, doc)
    with pytest.raises(xccl.RankTableError) as info:
        placed(0, env(RANK_TABLE_FILE=path, RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2))
    err = info.value
    assert (err.path, err.field) == (str(path), field), str(err)
    assert problem in err.problem, str(err)
    assert str(path) in str(err) and field in str(err)


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8"])
def test_unreadable_rank_table(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "table.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b'{"version": "\xff"}')
    with pytest.raises(xccl.RankTableError) as info:
        placed(0, env(RANK_TABLE_FILE=path, RANK=0, WORLD_SIZE=1))
    assert (info.value.path, info.value.field) == (str(path), "$")
    assert ("cannot read the file" if kind != "not-utf8" else "is not UTF-8") in info.value.problem


def test_table_disagreeing_with_local_rank(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[0, 1], [0, 1]]), path)
    with pytest.raises(xccl.RankTableError) as info:
        placed(0, env(RANK_TABLE_FILE=path, RANK=3, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2))
    assert info.value.field == "node_list[1].device_list[1].local_rank"
    assert "LOCAL_RANK=0" in info.value.problem


def test_table_disagreeing_with_local_world_size(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[0, 1, 2], [0]]), path)
    with pytest.raises(xccl.RankTableError) as info:
        placed(0, env(RANK_TABLE_FILE=path, RANK=0, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2))
    assert info.value.field == "node_list[0].device_list" and "has 3 devices" in info.value.problem


# ---------------------------------------------------------------------------------------------------------------
# The runtime in this process (simulated SDK; no process group needed for device setup and options)
# ---------------------------------------------------------------------------------------------------------------


def test_runtime_sets_chip_map_and_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    dump(generate_sophgo([[7, 6, 2, 3]]), path)
    for k, v in env(RANK_TABLE_FILE=path, CHIP_MAP="0,1,2,3").items():
        monkeypatch.setenv(k, v)
    runtime = SophgoRuntime(plugin, simulate=True)
    assert runtime.place(Job(2, 4, 2, 4)) == torch.device("cpu")
    assert current_simulated_chip() == 2
    import os

    assert os.environ["CHIP_MAP"] == "7,6,2,3"  # the rank table wins, published in Sophgo's format
    world = runtime.process_group_options(None)
    sub = runtime.process_group_options([3, 0])
    assert isinstance(world, SimulatedSCCLOptions) and world.chip_map == [7, 6, 2, 3]
    assert isinstance(sub, SimulatedSCCLOptions) and sub.chip_map == [7, 6, 2, 3]  # the node's map, whole


def test_runtime_replaces_a_map_that_is_no_ring(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CHIP_MAP", "0,1,2,3")
    monkeypatch.delenv("RANK_TABLE_FILE", raising=False)
    runtime = SophgoRuntime(plugin, simulate=True)
    with caplog.at_level("WARNING", logger="xccl.sophgo"):
        runtime.place(Job(0, 4, 0, 4))
    import os

    assert os.environ["CHIP_MAP"] == "0,1,3,2"
    assert "chip map 0,1,2,3 from the CHIP_MAP is not a C2C ring" in caplog.text


def test_simulated_set_chip_map_reads_what_torch_tpu_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_tpu/tpu/utils.py:193-229: the node's size from LOCAL_WORLD_SIZE only (default 1), CHIP_MAP before the
    argument; the size the caller passes is not read."""
    sdk = SimulatedTpu()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("CHIP_MAP", raising=False)
    assert sdk.chip_map(None, 4) == (0, 1)  # one rank as far as set_chip_map knows: [0, 1]
    assert sdk.chip_map([0, 1, 2, 3], 4) == (0, 1, 2, 3)  # and a given map unchecked
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert sdk.chip_map([0, 1, 2, 3], 1) == (0, 1, 3, 2)
    monkeypatch.setenv("CHIP_MAP", "7,6,2,3")
    assert sdk.chip_map([0, 1, 2, 3], 4) == (7, 6, 2, 3)


def test_runtime_tells_set_chip_map_the_nodes_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under mpirun no LOCAL_WORLD_SIZE exists: the runtime sets it (and clears CHIP_MAP) for the call only, so a
    map that is no ring is still replaced, then restores both."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK_TABLE_FILE", raising=False)
    monkeypatch.setenv("CHIP_MAP", "0,1,2,3")
    runtime = SophgoRuntime(plugin, simulate=True)
    runtime.place(Job(1, 4, 1, 4))
    import os

    assert (os.environ["CHIP_MAP"], current_simulated_chip()) == ("0,1,3,2", 1)
    assert "LOCAL_WORLD_SIZE" not in os.environ


#: Tensor parallelism 4 x data parallelism 2 on the eight-chip ring [0, 2, 6, 7, 3, 1, 5, 4].
TP4 = ([0, 1, 2, 3], [4, 5, 6, 7])
DP2 = ([0, 4], [1, 5], [2, 6], [3, 7])


def test_tp4_and_dp2_groups_on_eight_ranks_get_maps_sccl_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks 0-3 drive chips 0, 2, 6, 7: 7 and 0 are not linked, so their own chips are no ring; 0 and 3 (ranks 0
    and 4) are not linked either. Each group gets the node's map, which the simulated creator takes. This process
    plays each of the eight ranks in turn (the simulated current chip follows)."""
    monkeypatch.setenv("CHIP_MAP", "")
    monkeypatch.delenv("RANK_TABLE_FILE", raising=False)
    runtime = SophgoRuntime(plugin, simulate=True)
    for rank in range(8):
        runtime.place(Job(rank, 8, rank, 8))
        for ranks in (*TP4, *DP2):
            if rank in ranks:
                options = runtime.process_group_options(ranks)
                assert list(options.chip_map) == [0, 2, 6, 7, 3, 1, 5, 4]
                check_sccl_options(options, ranks.index(rank), len(ranks))


@pytest.mark.parametrize(("chip_map", "group_rank", "size", "chip", "text"), [
    ([0, 2, 6, 7], 0, 4, 0, "is not a C2C ring in map order"),  # the members' chips of ranks 0-3
    ([0, 3], 0, 2, 0, "is not a C2C ring in map order"),
    ([0, 2, 6, 7, 3, 1, 5, 4], 0, 4, 5, None),  # the node's map: a ring holding chip 5
    ([0, 1, 3, 2], 1, 2, 6, "does not hold chip 6"),
    ([2, 6], 0, 2, 6, "selected chip 6"),  # one chip per rank: group rank 0 is chip 2
    ([0, 1, 0, 1], 2, 4, 0, None),  # two nodes (repeated chips): only this rank's entry
], ids=["members-of-tp4", "unlinked-pair", "node-map", "not-on-map", "wrong-entry", "two-nodes"])
def test_simulated_creator_reads_maps_as_inferred(chip_map: list[int], group_rank: int, size: int, chip: int,
                                                 text: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_module, "_current_chip", chip)
    options = SimulatedSCCLOptions()
    options.chip_map = chip_map
    if text is None:
        check_sccl_options(options, group_rank, size)
    else:
        with pytest.raises(RuntimeError, match=text):
            check_sccl_options(options, group_rank, size)


def test_simulated_chip_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XCCL_SOPHGO_SIM_DEVICES", "2")
    monkeypatch.setenv("CHIP_MAP", "1")
    monkeypatch.delenv("RANK_TABLE_FILE", raising=False)
    runtime = SophgoRuntime(plugin, simulate=True)
    runtime.place(Job(0, 1, 0, 1))
    assert current_simulated_chip() == 1
    monkeypatch.setenv("CHIP_MAP", "5")
    with pytest.raises(xccl.InitError, match="chip 5 does not exist; this node has 2 TPUs"):
        runtime.place(Job(0, 1, 0, 1))


def test_init_fails_on_every_rank_with_a_malformed_table(tmp_path: Path) -> None:
    doc = generate_sophgo([[0, 1]])
    doc["node_list"][0]["device_list"][1]["rank"] = "0"  # type: ignore[index]
    path = write(tmp_path, doc)
    pool = RankPool(2, {"vendor": "sophgo", "simulate": True}, {"RANK_TABLE_FILE": str(path)},
                    start_method="forkserver")
    with pytest.raises(RuntimeError) as info:
        pool.start()
    text = str(info.value)
    assert "rank 0: RankTableError" in text and "rank 1: RankTableError" in text
    assert f"rank table {path}: node_list[0].device_list[1].rank: rank 0 is also given" in text
