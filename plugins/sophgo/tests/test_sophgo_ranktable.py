"""Tests of xccl_sophgo._ranktable: Sophgo rank tables, parsed, validated and generated, and its RankTableFormat.

No torch needed. ``xccl rank-table`` over these is tested in tests/test_cli_ranktable.py; the chip map a table
gives a rank in test_sophgo_chipmap.py.
"""

from __future__ import annotations

import ast
import copy
import json
import operator
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from xccl_sophgo import plugin
from xccl_sophgo._ranktable import (
    SophgoDevice,
    SophgoFormat,
    SophgoRankTable,
    generate_sophgo,
    load_sophgo,
    parse_device_id_arg,
    parse_sophgo,
)

from xccl.errors import RankTableError
from xccl.plugin import dump, load_rank_table

#: Sophgo's documented template (docs/quick_start/source_zh/03_Tutorial.rst), verbatim.
SOPHGO_TEMPLATE = Path(__file__).parent / "data" / "sophgo_template.json"

Doc = Any  # decoded JSON, mutated freely by the cases below

# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _setting(keys: tuple[str | int, ...], value: object) -> Callable[[Doc], Doc]:
    """Returns a mutation that sets the field at ``keys`` to ``value``."""

    def mutate(doc: Doc) -> Doc:
        target = doc
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
        return doc

    return mutate


def _deleting(keys: tuple[str | int, ...]) -> Callable[[Doc], Doc]:
    """Returns a mutation that removes the field at ``keys``."""

    def mutate(doc: Doc) -> Doc:
        target = doc
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
        return doc

    return mutate


def _both(*mutations: Callable[[Doc], Doc]) -> Callable[[Doc], Doc]:
    def mutate(doc: Doc) -> Doc:
        for mutation in mutations:
            doc = mutation(doc)
        return doc

    return mutate


class Case(NamedTuple):
    """One malformed table: how to break a valid one, and the error expected."""

    name: str
    mutate: Callable[[Doc], Doc]
    field: str
    phrase: str
    max_devices: int | None = None


def _dev(node: int, device: int, key: str) -> tuple[str | int, ...]:
    return ("node_list", node, "device_list", device, key)


# ---------------------------------------------------------------------------------------------------------------
# Valid tables
# ---------------------------------------------------------------------------------------------------------------


def test_sophgo_template_from_the_doc_parses() -> None:
    table = load_sophgo(SOPHGO_TEMPLATE)
    assert table.version == "1.0"
    assert table.world_size() == 2
    assert table.chip_map(0) == (0, 1)
    assert table.nodes[0].devices[0] == SophgoDevice(device_id=0, rank=0, local_rank=None, device_ip=None)
    # The template has no local_rank, so it is the position in rank order.
    assert [table.local_rank_of(r) for r in range(2)] == [0, 1]
    assert table.path == str(SOPHGO_TEMPLATE)


def test_generated_single_node_of_eight() -> None:
    table = parse_sophgo(generate_sophgo([list(range(8))]), "gen")
    assert table.world_size() == 8
    assert len(table.nodes) == 1
    assert table.chip_map(0) == tuple(range(8))
    assert [table.local_rank_of(r) for r in range(8)] == list(range(8))
    assert {table.node_of(r) for r in range(8)} == {0}


def test_generated_two_nodes_number_ranks_node_by_node() -> None:
    # A C2C ring order such as SCCL recommends, then a second, smaller node.
    ring = [0, 2, 6, 7, 3, 1, 5, 4]
    table = parse_sophgo(generate_sophgo([ring, [4, 5, 6, 7]]), "gen")
    assert table.world_size() == 12
    assert table.chip_map(0) == tuple(ring)
    assert table.chip_map(1) == (4, 5, 6, 7)
    assert [table.node_of(r) for r in (0, 7, 8, 11)] == [0, 0, 1, 1]
    assert [table.local_rank_of(r) for r in (0, 7, 8, 11)] == [0, 7, 0, 3]
    assert [d.rank for d in table.nodes[1].devices] == [8, 9, 10, 11]


def test_generator_writes_strings_like_sophgos_tool() -> None:
    doc = generate_sophgo([[0, 7]], [["10.0.0.1", "10.0.0.2"]])
    assert doc == {
        "version": "1.0",
        "node_list": [
            {
                "device_list": [
                    {"device_id": "0", "device_ip": "10.0.0.1", "local_rank": "0", "rank": "0"},
                    {"device_id": "7", "device_ip": "10.0.0.2", "local_rank": "1", "rank": "1"},
                ]
            }
        ],
    }
    # Key order too: tpu_gen_sccl_rank_table writes device_id, ip, local_rank, rank.
    entry = doc["node_list"][0]["device_list"][0]  # type: ignore[index]
    assert list(entry) == ["device_id", "device_ip", "local_rank", "rank"]


def test_generator_emulator_key_and_default_ips() -> None:
    doc = generate_sophgo([[0, 1], [0, 1]], emulator=True)
    table = parse_sophgo(doc, "gen")
    for node in doc["node_list"]:  # type: ignore[attr-defined]
        for entry in node["device_list"]:
            assert entry["device_ip_emulator"] == "127.0.0.1"
            assert "device_ip" not in entry
    assert all(d.device_ip == "127.0.0.1" for n in table.nodes for d in n.devices)


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "rank_table.json"
    path.parent.mkdir()
    doc = generate_sophgo([[3, 2, 1, 0], [0, 1]])
    dump(doc, path)
    assert json.loads(path.read_text(encoding="utf-8")) == doc
    assert path.read_text(encoding="utf-8").endswith("}\n")
    # Through the plugin's format, as `xccl rank-table validate` and `xccl doctor` read it.
    fmt, table = load_rank_table(path, plugin.rank_table_formats(), max_devices=8)
    assert isinstance(fmt, SophgoFormat)
    assert isinstance(table, SophgoRankTable)
    assert table.chip_map(0) == (3, 2, 1, 0)
    assert table.chip_map(1) == (0, 1)
    assert [p.name for p in path.parent.iterdir()] == ["rank_table.json"]  # no temporary file left behind


def test_sophgo_accepts_integers_and_orders_chip_map_by_rank() -> None:
    # Sophgo's C++ reader accepts numbers as well as strings; file order need not be rank order.
    doc = {"version": "1.0", "node_list": [{"device_list": [{"device_id": 5, "rank": 1}, {"device_id": 3, "rank": 0}]}]}
    table = parse_sophgo(doc)
    assert table.chip_map(0) == (3, 5)
    assert table.local_rank_of(1) == 1
    assert table.local_rank_of(0) == 0


def test_sophgo_lookups_of_unknown_rank_or_node_raise() -> None:
    table = load_sophgo(SOPHGO_TEMPLATE)
    with pytest.raises(RankTableError, match="no device has rank 2"):
        table.node_of(2)
    with pytest.raises(RankTableError, match="no device has rank -1"):
        table.local_rank_of(-1)
    with pytest.raises(RankTableError, match="there is no node 1"):
        table.chip_map(1)


# ---------------------------------------------------------------------------------------------------------------
# The plugin's RankTableFormat
# ---------------------------------------------------------------------------------------------------------------


def test_plugin_brings_the_sophgo_format() -> None:
    (fmt,) = plugin.rank_table_formats()
    assert isinstance(fmt, SophgoFormat)
    assert (fmt.name, fmt.can_generate, fmt.default_output) == ("sophgo", True, "sccl_rank_table.json")
    # Recognised by its key, node_list; an HCCL table (server_list) is not one.
    assert fmt.detect(json.loads(SOPHGO_TEMPLATE.read_text(encoding="utf-8")))
    assert fmt.detect({"node_list": []})
    assert not fmt.detect({"version": "1.0", "server_list": []})
    table = fmt.parse(generate_sophgo([[0, 2], [1, 0]]), "gen", max_devices=4)
    assert fmt.summary(table) == [
        "gen: Sophgo rank table, version 1.0, 4 ranks on 2 nodes",
        "  node 0: ranks 0..1, chip map 0,2",
        "  node 1: ranks 2..3, chip map 1,0",
    ]
    with pytest.raises(RankTableError, match="device_id must be in"):
        fmt.parse(generate_sophgo([[0, 4]]), "gen", max_devices=4)


# ---------------------------------------------------------------------------------------------------------------
# Malformed tables
# ---------------------------------------------------------------------------------------------------------------

SOPHGO_CASES = [
    Case("missing-version", _deleting(("version",)), "version", "is missing"),
    Case("version-2.0", _setting(("version",), "2.0"), "version", 'must have version "1.0"'),
    Case("version-as-number", _setting(("version",), 1.0), "version", "unsupported version 1.0"),
    Case("missing-node-list", _deleting(("node_list",)), "node_list", "is missing"),
    Case("empty-node-list", _setting(("node_list",), []), "node_list", "is empty"),
    Case("node-list-not-a-list", _setting(("node_list",), {}), "node_list", "is an object; expected a list"),
    Case("node-not-an-object", _setting(("node_list", 1), "node"), "node_list[1]", "is a string"),
    Case("missing-device-list", _deleting(("node_list", 0, "device_list")), "node_list[0].device_list", "is missing"),
    Case("empty-device-list", _setting(("node_list", 1, "device_list"), []), "node_list[1].device_list", "is empty"),
    Case("device-not-an-object", _setting(_dev(0, 1, "rank")[:-1], 3), "node_list[0].device_list[1]", "is a number"),
    Case("missing-device-id", _deleting(_dev(0, 1, "device_id")), "node_list[0].device_list[1].device_id", "missing"),
    Case("missing-rank", _deleting(_dev(1, 0, "rank")), "node_list[1].device_list[0].rank", "is missing"),
    Case("non-numeric-rank", _setting(_dev(1, 0, "rank"), "one"), "node_list[1].device_list[0].rank", "not a number"),
    Case("float-device-id", _setting(_dev(0, 0, "device_id"), 1.5), "node_list[0].device_list[0].device_id", "1.5"),
    Case("boolean-rank", _setting(_dev(0, 0, "rank"), True), "node_list[0].device_list[0].rank", "true is not a"),
    Case("null-rank", _setting(_dev(0, 0, "rank"), None), "node_list[0].device_list[0].rank", "null is not a number"),
    Case(
        "negative-device-id",
        _setting(_dev(1, 1, "device_id"), "-1"),
        "node_list[1].device_list[1].device_id",
        "-1 is negative",
    ),
    Case("negative-rank", _setting(_dev(0, 0, "rank"), -1), "node_list[0].device_list[0].rank", "-1 is negative"),
    Case(
        "duplicate-rank",
        _setting(_dev(1, 1, "rank"), "0"),
        "node_list[1].device_list[1].rank",
        "rank 0 is also given at node_list[0].device_list[0].rank",
    ),
    Case(
        "rank-gap",
        _setting(_dev(1, 1, "rank"), "4"),
        "node_list[1].device_list[1].rank",
        "rank 4 is out of range and rank 3 is missing",
    ),
    Case(
        "ranks-not-from-zero",
        lambda d: {"version": "1.0", "node_list": [{"device_list": [{"device_id": "0", "rank": "1"}]}]},
        "node_list[0].device_list[0].rank",
        "rank 0 is missing",
    ),
    Case(
        "duplicate-device-id-in-node",
        _setting(_dev(0, 1, "device_id"), "0"),
        "node_list[0].device_list[1].device_id",
        "0 is also the device_id at node_list[0].device_list[0].device_id; a device may appear only once",
    ),
    Case(
        "device-id-out-of-range",
        _setting(_dev(1, 0, "device_id"), "8"),
        "node_list[1].device_list[0].device_id",
        "device_id must be in [0, 7]",
        max_devices=8,
    ),
    Case(
        "duplicate-local-rank",
        _setting(_dev(0, 1, "local_rank"), "0"),
        "node_list[0].device_list[1].local_rank",
        "local ranks must be unique",
    ),
    Case(
        "local-rank-out-of-range",
        _setting(_dev(1, 1, "local_rank"), "2"),
        "node_list[1].device_list[1].local_rank",
        "2 is out of range: this node has 2 devices",
    ),
    Case(
        "local-rank-missing-on-one-device",
        _deleting(_dev(0, 1, "local_rank")),
        "node_list[0].device_list[1].local_rank",
        "give local_rank to every device or to none",
    ),
    Case(
        "local-rank-against-rank-order",
        _both(_setting(_dev(0, 0, "local_rank"), "1"), _setting(_dev(0, 1, "local_rank"), "0")),
        "node_list[0].device_list[0].local_rank",
        "local ranks must follow rank order",
    ),
    Case(
        "bad-device-ip",
        _setting(_dev(0, 0, "device_ip"), "127.0.0"),
        "node_list[0].device_list[0].device_ip",
        "is not an IPv4 address",
    ),
    Case(
        "both-ip-keys",
        _setting(_dev(0, 0, "device_ip_emulator"), "127.0.0.1"),
        "node_list[0].device_list[0]",
        "has both device_ip and device_ip_emulator",
    ),
    Case("top-level-array", lambda d: [d], "$", "is an array; expected an object"),
]


@pytest.mark.parametrize("case", SOPHGO_CASES, ids=operator.attrgetter("name"))
def test_malformed_sophgo_table(case: Case, tmp_path: Path) -> None:
    doc = case.mutate(copy.deepcopy(generate_sophgo([[0, 1], [0, 1]])))
    path = _write(tmp_path, doc)
    with pytest.raises(RankTableError) as info:
        load_sophgo(path, max_devices=case.max_devices)
    assert info.value.path == str(path)
    assert info.value.field == case.field
    assert case.phrase in info.value.problem
    # parse_sophgo reports the same defect for the decoded document.
    with pytest.raises(RankTableError) as again:
        parse_sophgo(doc, "doc", max_devices=case.max_devices)
    assert (again.value.field, again.value.problem) == (case.field, info.value.problem)


# ---------------------------------------------------------------------------------------------------------------
# The --device-id argument and the generator
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[[0,1,2,3,4,5,6,7]]", [list(range(8))]), ('[["0","1"]]', [[0, 1]]), ("[[0, 1], [1, 0]]", [[0, 1], [1, 0]])],
    ids=["eight-ints", "numeric-strings", "two-nodes"],
)
def test_device_id_arg(text: str, expected: list[list[int]]) -> None:
    assert parse_device_id_arg(text) == expected


@pytest.mark.parametrize(
    ("text", "field", "phrase"),
    [
        # Sophgo's own docs pass this form (ast.literal_eval); xccl takes JSON and says so.
        ("[['0', '1', '2']]", "$", "Python literal (single quotes); pass JSON, e.g. [[0,1]]"),
        ("[[0, 1]", "$", "is not JSON"),
        ("0,1", "$", "is not JSON"),
        ("[0, 1]", "$[0]", "is a number; expected a non-empty list of lists"),
        ("[]", "$", "is an empty list"),
        ("[[]]", "$[0]", "is an empty list"),
        ('{"0": [0]}', "$", "is an object"),
        ("[[0, -1]]", "$[0][1]", "-1 is negative"),
        ('[[0, "x"]]', "$[0][1]", '"x" is not a number'),
        ("[[0, 1.0]]", "$[0][1]", "1.0 is not a number"),
        ("[[1, 1]]", "$[0][1]", "also the device_id at $[0][0]"),
    ],
    ids=[
        "python-literal",
        "unterminated",
        "not-json",
        "flat-list",
        "empty",
        "empty-node",
        "object",
        "negative",
        "non-numeric",
        "float",
        "duplicate",
    ],
)
def test_bad_device_id_arg(text: str, field: str, phrase: str) -> None:
    with pytest.raises(RankTableError) as info:
        parse_device_id_arg(text)
    assert isinstance(info.value, ValueError)  # so argparse-style callers catching ValueError keep working
    assert (info.value.path, info.value.field) == ("<--device-id>", field)
    assert phrase in info.value.problem


@pytest.mark.parametrize(
    ("device_ips", "field", "phrase"),
    [
        ([["127.0.0.1", "127.0.0.1"]], "$", "has 1 nodes but device_ids has 2"),
        ([["127.0.0.1"], ["127.0.0.1", "127.0.0.1"]], "$[0]", "must list 2 addresses"),
        ([["127.0.0.1", "localhost"], ["127.0.0.1", "127.0.0.1"]], "$[0][1]", '"localhost" is not an IPv4'),
    ],
    ids=["node-count", "device-count", "not-ipv4"],
)
def test_generate_sophgo_rejects_bad_ips(device_ips: list[list[str]], field: str, phrase: str) -> None:
    with pytest.raises(RankTableError) as info:
        generate_sophgo([[0, 1], [0, 1]], device_ips)
    assert (info.value.path, info.value.field) == ("<device_ips>", field)
    assert phrase in info.value.problem


def test_generate_sophgo_rejects_bad_ids() -> None:
    with pytest.raises(RankTableError) as info:
        generate_sophgo([[0, 1], [2, 2]])
    assert (info.value.path, info.value.field) == ("<device_ids>", "$[1][1]")


# ---------------------------------------------------------------------------------------------------------------
# The module itself
# ---------------------------------------------------------------------------------------------------------------


def test_module_imports_only_the_standard_library_and_the_kit() -> None:
    # The CLI and the cheap probe read rank tables; that must never pull in torch or torch_tpu.
    import xccl_sophgo._ranktable as module

    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # A relative import is one of the plugin's own modules: it counts as outside too.
            imported.add(f"xccl_sophgo.{node.module or ''}" if node.level else node.module or "")
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"xccl.plugin"}
