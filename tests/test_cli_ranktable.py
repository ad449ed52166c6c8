"""``xccl rank-table``: the Sophgo generator (tpu_gen_sccl_rank_table's equivalent) and the validator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xccl_sophgo._ranktable import generate_sophgo, load_sophgo

from xccl.tools.cli import main

DATA = Path(__file__).parent / "data" / "ranktables"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["rank-table", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rt.json"
    code, stdout, _ = run(capsys, "sophgo", "--device-id", "[[0,1,2,3,4,5,6,7]]", "-o", str(out))
    assert code == 0 and stdout.strip() == f"wrote {out}: Sophgo rank table, version 1.0, 8 ranks on 1 node"
    assert json.loads(out.read_text()) == generate_sophgo([list(range(8))])
    table = load_sophgo(out)
    assert table.chip_map(0) == tuple(range(8))


def test_default_output_is_rank_table_file_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK_TABLE_FILE", raising=False)
    assert run(capsys, "sophgo", "--device_id", "[[0,1]]")[0] == 0  # Sophgo's spelling of the flag works too
    assert load_sophgo(tmp_path / "sccl_rank_table.json").world_size() == 2
    monkeypatch.setenv("RANK_TABLE_FILE", str(tmp_path / "from_env.json"))
    assert run(capsys, "sophgo", "--device-id", '[["3","1"],[0]]')[0] == 0
    table = load_sophgo(tmp_path / "from_env.json")
    assert (table.chip_map(0), table.chip_map(1), table.node_of(2)) == ((3, 1), (0,), 1)


def test_device_ips_and_emulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rt.json"
    ips = '[["10.0.0.1","10.0.0.2"]]'
    assert run(capsys, "sophgo", "--device-id", "[[0,1]]", "--device-ip", ips, "--emulator", "-o", str(out))[0] == 0
    entry = json.loads(out.read_text())["node_list"][0]["device_list"][1]
    assert entry == {"device_id": "1", "device_ip_emulator": "10.0.0.2", "local_rank": "1", "rank": "1"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--device-id", "[['0','1']]"], "<--device-id>: $: \"[['0','1']]\" looks like a Python literal"),
    (["--device-id", "[[0,1"], "is not JSON"),
    (["--device-id", "[]"], "is an empty list"),
    (["--device-id", "[[0,0]]"], "$[0][1]: 0 is also the device_id at $[0][0]"),
    (["--device-id", "[[0,-1]]"], "$[0][1]: -1 is negative"),
    (["--device-id", "[[0,1]]", "--device-ip", "[[\"10.0.0.1\"]]"], "must list 2 addresses"),
    (["--device-id", "[[0]]", "--device-ip", "[[\"host\"]]"], "is not an IPv4 address"),
    (["--device-id", "[[0]]", "--device-ip", "10.0.0.1"], "<--device-ip>: $: '10.0.0.1' is not JSON"),
], ids=["python-literal", "bad-json", "empty", "duplicate", "negative", "ip-shape", "ip-value", "ip-not-json"])
def test_generate_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "rt.json"
    code, stdout, err = run(capsys, "sophgo", *argv, "-o", str(out))
    assert code == 1 and stdout == "" and not out.exists()
    assert err.startswith("xccl rank-table: error: rank table ") and message in err


def test_generate_into_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "rt.json"
    code, _, err = run(capsys, "sophgo", "--device-id", "[[0]]", "-o", str(out))
    assert code == 1 and f"rank table {out}: $:" in err


def test_validate_sophgo_template(capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "sophgo_template.json"
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 0
    assert out.splitlines() == [f"{path}: Sophgo rank table, version 1.0, 2 ranks on 1 node",
                                "  node 0: ranks 0..1, chip map 0,1"]


def test_validate_hccl(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(DATA / "hccl_v1.0.json"))
    assert code == 0 and "HCCL rank table, version 1.0, 2 ranks on 2 servers" in out


def test_validate_generated_two_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rt.json"
    assert run(capsys, "sophgo", "--device-id", "[[0,2],[1,0]]", "-o", str(out))[0] == 0
    code, stdout, _ = run(capsys, "validate", str(out), "--max-devices", "4")
    assert code == 0 and "  node 1: ranks 2..3, chip map 1,0" in stdout.splitlines()


def _template() -> dict[str, object]:
    return json.loads((DATA / "sophgo_template.json").read_text())


def _mutated(path: tuple[object, ...], value: object) -> str:
    doc: object = _template()
    target = doc
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    if value is KeyError:
        del target[path[-1]]  # type: ignore[attr-defined]
    else:
        target[path[-1]] = value  # type: ignore[index]
    return json.dumps(doc)


DEV1 = ("node_list", 0, "device_list", 1)
MALFORMED = {
    "missing-version": (_mutated(("version",), KeyError), "version: is missing"),
    "wrong-version": (_mutated(("version",), "1.1"), 'version: unsupported version "1.1"'),
    "missing-node-list": (
        _mutated(("node_list",), KeyError),
        "$: is none of the rank-table formats the installed plugins know (hccl, sophgo, template)",
    ),
    "empty-node-list": (_mutated(("node_list",), []), "node_list: is empty"),
    "missing-rank": (_mutated((*DEV1, "rank"), KeyError), "node_list[0].device_list[1].rank: is missing"),
    "missing-device-id": (_mutated((*DEV1, "device_id"), KeyError), "device_list[1].device_id: is missing"),
    "duplicate-rank": (_mutated((*DEV1, "rank"), "0"), "device_list[1].rank: rank 0 is also given"),
    "gap": (_mutated((*DEV1, "rank"), "5"), "rank 5 is out of range and rank 1 is missing"),
    "non-numeric-id": (_mutated((*DEV1, "device_id"), "one"), 'device_list[1].device_id: "one" is not a number'),
    "non-numeric-rank": (_mutated((*DEV1, "rank"), "1a"), 'device_list[1].rank: "1a" is not a number'),
    "id-out-of-range": (_mutated((*DEV1, "device_id"), "9"), "9 is out of range: with 8 devices"),
    "invalid-json": ('{"version": "1.0",', "$: invalid JSON at line 1"),
    "not-an-object": ("[1, 2]", "$: is an array"),
    "both-formats": ('{"node_list": [], "server_list": []}', "$: has the keys of several formats (hccl, sophgo)"),
}


@pytest.mark.parametrize(("text", "message"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_validate_reports_malformed_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, out, err = run(capsys, "validate", str(path), "--max-devices", "8")
    assert code == 1 and out == ""
    assert err.startswith(f"xccl rank-table: error: rank table {path}: ") and message in err


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_validate_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path = tmp_path / "rt.json"
    if kind == "directory":
        path.mkdir()
    code, _, err = run(capsys, "validate", str(path))
    assert code == 1 and f"rank table {path}: $: cannot read the file" in err


def test_as_a_command(tmp_path: Path) -> None:
    # One process start (it imports torch): the exit status of a failing validation reaches the shell.
    bad = subprocess.run([sys.executable, "-m", "xccl", "rank-table", "validate", str(tmp_path / "none.json")],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "cannot read the file" in bad.stderr
