"""HCCL rank tables (versions 1.0 and 1.2, manifest A6): valid and malformed, through ``xccl rank-table validate``
and through the Ascend runtime, which checks ``RANK_TABLE_FILE`` before HCCL reads it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from xccl_ascend import plugin
from xccl_ascend._runtime import AscendRuntime
from xccl_ascend._sdk_sim import SimSdk

from xccl import InitError, RankTableError
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
