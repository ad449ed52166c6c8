"""HCCL rank tables (versions 1.0 and 1.2, manifest A6): valid and malformed, through ``xccl rank-table validate``,
through the Ascend runtime, which checks ``RANK_TABLE_FILE`` before HCCL reads it, and through
``xccl_ascend._ranktable`` itself (parser, generator and the plugin's RankTableFormat)."""

from __future__ import annotations

import ast
import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from xccl_ascend import plugin
from xccl_ascend._ranktable import HcclFormat, HcclRankTable, generate_hccl, load_hccl, parse_hccl
from xccl_ascend._runtime import AscendRuntime
from xccl_ascend._sdk_sim import SimSdk

from xccl import InitError, RankTableError
from xccl.plugin import dump, load_rank_table
from xccl.tools.cli import main


def v10(servers: int = 2, per: int = 2) -> dict[str, Any]:
    """An Atlas A2 table: ``servers`` servers of ``per`` devices, ranks in order."""
    return {
        "status": "completed", "version": "1.0", "server_count": str(servers),
        "server_list": [
            {"server_id": f"node_{s}", "device": [
                {"device_id": str(d), "device_ip": f"192.168.{s}.{d + 8}", "device_port": "16667",
                 "rank_id": str(s * per + d)} for d in range(per)]}
            for s in range(servers)
        ],
    }


def v12() -> dict[str, Any]:
    """An Atlas A3 super-pod table (two servers in one pod)."""
    servers = []
    for s in range(2):
        servers.append({"server_id": f"node_{s}", "host_ip": f"172.16.0.{100 + s}", "device": [
            {"device_id": str(d), "super_device_id": str(s * 2 + d), "device_ip": f"192.168.{s}.{d + 6}",
             "device_port": "16666", "backup_device_ip": f"192.168.{s}.{d + 16}", "backup_device_port": "16667",
             "host_port": "16665", "rank_id": str(s * 2 + d)} for d in range(2)]})
    return {"status": "completed", "version": "1.2", "server_count": "2", "server_list": servers,
            "super_pod_list": [{"super_pod_id": "0", "server_list": [{"server_id": "node_0"}, {"server_id": "node_1"}]}]}


def edit(base: Callable[[], dict[str, Any]], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(base())
    change(data)
    return data


def dev(data: dict[str, Any], s: int, d: int) -> dict[str, Any]:
    return data["server_list"][s]["device"][d]  # type: ignore[no-any-return]


MALFORMED: list[tuple[str, object, str, str]] = [
    ("status", edit(v10, lambda t: t.update(status="initializing")), "status", "not ready yet"),
    ("version", edit(v10, lambda t: t.update(version="1.1")), "version", 'version "1.0" or "1.2"'),
    ("server-count", edit(v10, lambda t: t.update(server_count="3")), "server_count", "server_list has 2 servers"),
    ("int-not-string", edit(v10, lambda t: dev(t, 0, 1).update(rank_id=1)), "server_list[0].device[1].rank_id",
     "not a string"),
    ("duplicate-rank", edit(v10, lambda t: dev(t, 1, 0).update(rank_id="0")), "server_list[1].device[0].rank_id",
     "each rank_id must appear once"),
    ("rank-gap", edit(v10, lambda t: dev(t, 1, 1).update(rank_id="7")), "server_list[1].device[1].rank_id",
     "rank_id 3 is missing"),
    ("duplicate-device", edit(v10, lambda t: dev(t, 0, 1).update(device_id="0")), "server_list[0].device[1].device_id",
     "only once on its host"),
    ("bad-ip", edit(v10, lambda t: dev(t, 0, 0).update(device_ip="192.168.1")), "server_list[0].device[0].device_ip",
     "IPv4"),
    ("bad-port", edit(v10, lambda t: dev(t, 0, 0).update(device_port="70000")), "server_list[0].device[0].device_port",
     "not a port number"),
    ("missing-rank-id", edit(v10, lambda t: dev(t, 0, 0).pop("rank_id")), "server_list[0].device[0].rank_id", "is missing"),
    ("pod-in-v1.0", edit(v10, lambda t: t.update(super_pod_list=v12()["super_pod_list"])), "super_pod_list",
     'only defined for version "1.2"'),
    ("pod-unknown-server", edit(v12, lambda t: t["super_pod_list"][0]["server_list"].append({"server_id": "node_9"})),
     "super_pod_list[0].server_list[2].server_id", "names no server"),
    ("duplicate-server", edit(v10, lambda t: t["server_list"][1].update(server_id="node_0")),
     "server_list[1].server_id", "must be unique"),
    ("empty-devices", edit(v10, lambda t: t["server_list"][0].update(device=[])), "server_list[0].device", "empty"),
    ("not-json", "{version: 1.0}", "$", "JSON"),
]


def write(tmp_path: Path, data: object, name: str = "rank_table.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("data", "summary"),
    [
        (v10(), "HCCL rank table, version 1.0, 4 ranks on 2 servers"),
        (v12(), "HCCL rank table, version 1.2, 4 ranks on 2 servers"),
        (edit(v10, lambda t: t.pop("status")), "HCCL rank table, version 1.0, 4 ranks on 2 servers"),
        ({"version": "1.0", "node_list": [{"device_list": [
            {"device_id": "0", "device_ip": "127.0.0.1", "local_rank": "0", "rank": "0"},
            {"device_id": "1", "device_ip": "127.0.0.1", "local_rank": "1", "rank": "1"}]}]},
         "Sophgo rank table, version 1.0, 2 ranks on 1 node"),
    ],
    ids=["hccl-1.0", "hccl-1.2", "hccl-no-status", "sophgo"],
)
def test_cli_validates_both_vendors(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: object, summary: str) -> None:
    path = write(tmp_path, data)
    assert main(["rank-table", "validate", str(path)]) == 0
    assert f"{path}: {summary}" in capsys.readouterr().out


@pytest.mark.parametrize(("data", "field", "problem"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_cli_names_file_field_and_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: object, field: str, problem: str
) -> None:
    path = write(tmp_path, data)
    assert main(["rank-table", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"rank table {path}: {field}: " in err and problem in err, err


def test_cli_max_devices_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, v10(per=2))
    assert main(["rank-table", "validate", "--max-devices", "1", str(path)]) == 1
    assert "server_list[0].device[1].device_id: 1 is out of range" in capsys.readouterr().err
    assert main(["rank-table", "validate", str(tmp_path / "absent.json")]) == 1
    assert "absent.json" in capsys.readouterr().err


def sim_runtime() -> AscendRuntime:
    return AscendRuntime(plugin, simulate=True, sdk=SimSdk({}))


def test_runtime_checks_rank_table_before_hccl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK_TABLE_FILE", str(write(tmp_path, edit(v10, lambda t: dev(t, 0, 0).update(rank_id="x")))))
    with pytest.raises(RankTableError) as err:
        sim_runtime().setup_device(0)
    assert err.value.field == "server_list[0].device[0].rank_id" and "not numeric" in err.value.problem


def test_runtime_checks_table_against_world_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK_TABLE_FILE", str(write(tmp_path, v12())))
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "600")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(RankTableError, match="describes 4 ranks but WORLD_SIZE=8"):
        sim_runtime().setup_device(0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert sim_runtime().setup_device(3).type == "cpu"


def test_runtime_checks_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = AscendRuntime(plugin, simulate=True, sdk=SimSdk({"ASCEND_RT_VISIBLE_DEVICES": "3,2"}))
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3,2")
    with pytest.raises(InitError, match=r"0 NPU\(s\) are visible \(ASCEND_RT_VISIBLE_DEVICES='3,2'"):
        runtime.setup_device(0)


# ---------------------------------------------------------------------------------------------------------------
# xccl_ascend._ranktable: the manifest's examples, lookups, the generator and malformed tables, field by field
# ---------------------------------------------------------------------------------------------------------------

#: The manifest's HCCL examples (CANN hcclug) completed with the servers their server_count announces: the doc
#: shows one server and elides the rest, which a strict server_count check would otherwise reject. Shared with the
#: core tests (tests/data/ranktables), which validate them through ``xccl rank-table`` and ``xccl doctor``.
HCCL_DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "ranktables"
HCCL_V10 = HCCL_DATA / "hccl_v1.0.json"
HCCL_V12 = HCCL_DATA / "hccl_v1.2.json"

Doc = Any  # decoded JSON, mutated freely by the cases below


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


class Case(NamedTuple):
    """One malformed table: how to break a valid one, and the error expected."""

    name: str
    mutate: Callable[[Doc], Doc]
    field: str
    phrase: str
    max_devices: int | None = None


def _hdev(server: int, device: int, key: str) -> tuple[str | int, ...]:
    return ("server_list", server, "device", device, key)


def test_hccl_v10_example_parses() -> None:
    table = load_hccl(HCCL_V10)
    assert (table.version, table.status, table.server_count, table.world_size()) == ("1.0", "completed", 2, 2)
    assert [s.server_id for s in table.servers] == ["node_0", "node_1"]
    device = table.servers[0].devices[0]
    assert (device.device_id, device.rank_id, device.device_ip, device.device_port) == (0, 0, "192.168.1.8", 16667)
    assert device.super_device_id is None
    assert table.server_of(1) == 1
    assert table.device_ids(1) == (0,)
    assert table.super_pods == ()


def test_hccl_v12_example_parses() -> None:
    table = load_hccl(HCCL_V12)
    assert (table.version, table.server_count, table.world_size()) == ("1.2", 4, 4)
    assert table.servers[0].host_ip == "172.16.0.100"
    device = table.servers[0].devices[0]
    assert (device.super_device_id, device.backup_device_ip, device.backup_device_port, device.host_port) == (
        0,
        "192.168.1.7",
        16667,
        16665,
    )
    assert [(p.super_pod_id, p.server_ids) for p in table.super_pods] == [
        ("0", ("node_0", "node_1")),
        ("1", ("node_2", "node_3")),
    ]
    assert [table.server_of(r) for r in range(4)] == [0, 1, 2, 3]


def test_hccl_lookups_of_unknown_rank_or_server_raise() -> None:
    table = load_hccl(HCCL_V10)
    with pytest.raises(RankTableError, match="no device has rank_id 2"):
        table.server_of(2)
    with pytest.raises(RankTableError, match="there is no server 2"):
        table.device_ids(2)


def test_plugin_brings_the_hccl_format() -> None:
    formats = plugin.rank_table_formats()
    (fmt,) = formats
    assert isinstance(fmt, HcclFormat)
    assert (fmt.name, fmt.can_generate, fmt.default_output) == ("hccl", True, "hccl_rank_table.json")
    # Recognised by its key, server_list; a Sophgo table (node_list) is not one.
    assert fmt.detect(json.loads(HCCL_V12.read_text(encoding="utf-8")))
    assert not fmt.detect({"version": "1.0", "node_list": []})
    fmt_read, table = load_rank_table(HCCL_V10, formats)
    assert fmt_read is fmt and isinstance(table, HcclRankTable)
    assert fmt.summary(table) == [
        f"{HCCL_V10}: HCCL rank table, version 1.0, 2 ranks on 2 servers",
        "  server node_0: ranks 0, device ids 0",
        "  server node_1: ranks 1, device ids 0",
    ]


def test_generate_hccl_round_trip(tmp_path: Path) -> None:
    doc = generate_hccl([4, 5, 6, 7], [f"192.168.1.{i}" for i in range(4)], server_id="node_0", device_port=16667)
    path = tmp_path / "hccl.json"
    dump(doc, path)
    fmt, table = load_rank_table(path, plugin.rank_table_formats())
    assert isinstance(fmt, HcclFormat)
    assert isinstance(table, HcclRankTable)
    assert (table.version, table.status, table.server_count, table.world_size()) == ("1.0", "completed", 1, 4)
    assert table.device_ids(0) == (4, 5, 6, 7)
    assert table.servers[0].devices[3].device_ip == "192.168.1.3"
    assert table.servers[0].devices[3].device_port == 16667
    # Without addresses, the devices have no device_ip.
    assert parse_hccl(generate_hccl([0, 1])).servers[0].devices[0].device_ip is None
    with pytest.raises(RankTableError, match="has 1 addresses for 2 devices"):
        generate_hccl([0, 1], ["192.168.1.1"])


def test_hccl_manifest_example_as_printed_has_too_few_servers(tmp_path: Path) -> None:
    # The doc's v1.0 example announces two servers and lists one; taken literally, it is inconsistent.
    doc = {
        "status": "completed",
        "version": "1.0",
        "server_count": "2",
        "server_list": [
            {
                "server_id": "node_0",
                "device": [{"device_id": "0", "device_ip": "192.168.1.8", "device_port": "16667", "rank_id": "0"}],
            }
        ],
    }
    with pytest.raises(RankTableError) as info:
        load_rank_table(write(tmp_path, doc), plugin.rank_table_formats())
    assert info.value.field == "server_count"
    assert "is 2 but server_list has 1 servers" in info.value.problem


HCCL_CASES = [
    Case("status-not-completed", _setting(("status",), "initializing"), "status", "the file is not ready"),
    Case("missing-version", _deleting(("version",)), "version", "is missing"),
    Case("version-1.1", _setting(("version",), "1.1"), "version", 'must have version "1.0" or "1.2"'),
    Case("server-count-mismatch", _setting(("server_count",), "3"), "server_count", "is 3 but server_list has 2"),
    Case(
        "server-count-number",
        _setting(("server_count",), 2),
        "server_count",
        "every value in an HCCL rank table is a string",
    ),
    Case(
        "device-id-number",
        _setting(_hdev(0, 0, "device_id"), 0),
        "server_list[0].device[0].device_id",
        "0 is not a string; every value",
    ),
    Case(
        "rank-id-non-numeric",
        _setting(_hdev(1, 0, "rank_id"), "one"),
        "server_list[1].device[0].rank_id",
        "'one' is not numeric",
    ),
    Case(
        "rank-id-negative", _setting(_hdev(1, 0, "rank_id"), "-1"), "server_list[1].device[0].rank_id", "-1 is negative"
    ),
    Case("missing-server-list", _deleting(("server_list",)), "server_list", "is missing"),
    Case("empty-server-list", _setting(("server_list",), []), "server_list", "is empty"),
    Case("missing-server-id", _deleting(("server_list", 1, "server_id")), "server_list[1].server_id", "is missing"),
    Case("missing-device-key", _deleting(("server_list", 0, "device")), "server_list[0].device", "is missing"),
    Case("missing-rank-id", _deleting(_hdev(0, 0, "rank_id")), "server_list[0].device[0].rank_id", "is missing"),
    Case(
        "bad-device-ip",
        _setting(_hdev(0, 0, "device_ip"), "192.168.1"),
        "server_list[0].device[0].device_ip",
        "is not an IPv4",
    ),
    Case(
        "bad-port",
        _setting(_hdev(0, 0, "device_port"), "70000"),
        "server_list[0].device[0].device_port",
        "not a port number",
    ),
    Case(
        "duplicate-rank-id",
        _setting(_hdev(1, 0, "rank_id"), "0"),
        "server_list[1].device[0].rank_id",
        "rank_id 0 is also given at server_list[0].device[0].rank_id",
    ),
    Case(
        "rank-id-gap",
        _setting(_hdev(1, 0, "rank_id"), "2"),
        "server_list[1].device[0].rank_id",
        "rank_id 1 is missing",
    ),
    Case(
        "duplicate-device-id-in-server",
        lambda d: _setting(
            ("server_list", 0, "device"), [*d["server_list"][0]["device"], {"device_id": "0", "rank_id": "2"}]
        )(d),
        "server_list[0].device[1].device_id",
        "0 is also the device_id at server_list[0].device[0].device_id",
    ),
    Case(
        "duplicate-server-id",
        _setting(("server_list", 1, "server_id"), "node_0"),
        "server_list[1].server_id",
        "also the server_id of server_list[0]",
    ),
    Case(
        "device-id-out-of-range",
        _setting(_hdev(1, 0, "device_id"), "16"),
        "server_list[1].device[0].device_id",
        "device_id must be in [0, 15]",
        max_devices=16,
    ),
    Case(
        "super-pod-list-in-v1.0",
        _setting(("super_pod_list",), [{"super_pod_id": "0", "server_list": [{"server_id": "node_0"}]}]),
        "super_pod_list",
        'only defined for version "1.2"',
    ),
    Case("top-level-array", lambda d: [d], "$", "is an array"),
]

HCCL_V12_CASES = [
    Case(
        "unknown-server-in-super-pod",
        _setting(("super_pod_list", 1, "server_list", 0, "server_id"), "node_9"),
        "super_pod_list[1].server_list[0].server_id",
        "'node_9' names no server of server_list",
    ),
    Case(
        "server-in-two-super-pods",
        _setting(("super_pod_list", 1, "server_list", 0, "server_id"), "node_0"),
        "super_pod_list[1].server_list[0].server_id",
        "already in super pod '0'",
    ),
    Case(
        "empty-super-pod",
        _setting(("super_pod_list", 0, "server_list"), []),
        "super_pod_list[0].server_list",
        "is empty",
    ),
    Case("bad-host-ip", _setting(("server_list", 2, "host_ip"), "172.16.0.300"), "server_list[2].host_ip", "IPv4"),
    Case(
        "super-device-id-non-numeric",
        _setting(_hdev(3, 0, "super_device_id"), "x"),
        "server_list[3].device[0].super_device_id",
        "is not numeric",
    ),
]


@pytest.mark.parametrize(
    ("case", "example"),
    [(c, HCCL_V10) for c in HCCL_CASES] + [(c, HCCL_V12) for c in HCCL_V12_CASES],
    ids=[c.name for c in HCCL_CASES] + [f"v1.2-{c.name}" for c in HCCL_V12_CASES],
)
def test_malformed_hccl_table(case: Case, example: Path, tmp_path: Path) -> None:
    doc = case.mutate(json.loads(example.read_text(encoding="utf-8")))
    path = write(tmp_path, doc)
    with pytest.raises(RankTableError) as info:
        load_hccl(path, max_devices=case.max_devices)
    assert info.value.path == str(path)
    assert info.value.field == case.field
    assert case.phrase in info.value.problem


def test_ranktable_module_imports_only_the_standard_library_and_the_kit() -> None:
    # The CLI and the cheap probe read rank tables; that must never pull in torch, torch_npu or CANN.
    import xccl_ascend._ranktable as module

    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # A relative import is one of the plugin's own modules: it counts as outside too.
            imported.add(f"xccl_ascend.{node.module or ''}" if node.level else node.module or "")
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"xccl.plugin"}
