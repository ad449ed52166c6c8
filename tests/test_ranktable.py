"""Tests of the vendor-neutral rank-table kit (xccl.plugin._ranktable): reading JSON, writing atomically, and picking
the format of a table among those given. No torch needed.

The kit is tested with two toy formats defined here, so that it does not depend on any plugin; the vendors' formats
are tested with their plugins (plugins/sophgo/tests/test_sophgo_ranktable.py,
plugins/ascend/tests/test_ascend_ranktable.py) and through ``xccl rank-table`` (tests/test_cli_ranktable.py).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest

from xccl.errors import RankTableError
from xccl.plugin import (
    RankTableFormat,
    as_object,
    check_device_ids,
    describe,
    dump,
    load_rank_table,
    non_negative,
    nonempty_list,
    read_json,
)
from xccl.tools.cli.ranktable import installed_formats

DATA = Path(__file__).parent / "data" / "ranktables"
#: Sophgo's documented template (docs/quick_start/source_zh/03_Tutorial.rst), verbatim.
SOPHGO_TEMPLATE = DATA / "sophgo_template.json"
#: The manifest's HCCL examples (CANN hcclug), completed with the servers their server_count announces.
HCCL_V10 = DATA / "hccl_v1.0.json"
HCCL_V12 = DATA / "hccl_v1.2.json"

# ---------------------------------------------------------------------------------------------------------------
# Two toy formats: {"<key>": [device_id, ...]}, rank i on device_id [i], built from the kit's readers and checks
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyTable:
    path: str
    kind: str
    device_ids: tuple[int, ...]

    def world_size(self) -> int:
        return len(self.device_ids)


class ToyFormat(RankTableFormat):
    #: The key that marks a table of this format.
    key: ClassVar[str] = ""

    def detect(self, data: Mapping[str, object]) -> bool:
        return self.key in data

    def parse(self, data: object, path: str, *, max_devices: int | None = None) -> ToyTable:
        top = as_object(data, path, "$", f'an object with "{self.key}"')
        ids: list[tuple[int, str]] = []
        for i, value in nonempty_list(top, self.key, path, "", "one device id per rank"):
            field = f"{self.key}[{i}]"
            if not isinstance(value, int) or isinstance(value, bool):
                raise RankTableError(path, field, f"{describe(value)} is not an integer")
            ids.append((non_negative(value, path, field), field))
        check_device_ids(ids, path, max_devices)
        return ToyTable(path, self.name, tuple(device_id for device_id, _ in ids))

    def summary(self, table: Any) -> list[str]:
        return [f"{table.path}: {self.name} table, {table.world_size()} ranks"]


class AlphaFormat(ToyFormat):
    name = "alpha"
    description = "alpha toy table"
    key = "alpha_list"


class BetaFormat(ToyFormat):
    name = "beta"
    description = "beta toy table"
    key = "beta_list"


FORMATS: tuple[RankTableFormat, ...] = (AlphaFormat(), BetaFormat())


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# load_rank_table: the matching format, and its table
# ---------------------------------------------------------------------------------------------------------------


def test_load_rank_table_picks_the_format_that_detects_the_table(tmp_path: Path) -> None:
    path = _write(tmp_path, {"beta_list": [3, 1, 0]})
    fmt, table = load_rank_table(path, FORMATS)
    assert fmt is FORMATS[1]
    assert table == ToyTable(str(path), "beta", (3, 1, 0))
    # A str path works too, and the order of the formats does not matter.
    fmt, table = load_rank_table(str(path), FORMATS[::-1])
    assert (fmt, table.path) == (FORMATS[1], str(path))
    fmt, table = load_rank_table(_write(tmp_path, {"alpha_list": [0]}), FORMATS)
    assert (fmt.name, table.kind, table.world_size()) == ("alpha", "alpha", 1)


def test_load_rank_table_passes_max_devices_and_reports_the_formats_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, {"alpha_list": [0, 8]})
    assert load_rank_table(path, FORMATS)[1].device_ids == (0, 8)
    assert load_rank_table(path, FORMATS, max_devices=9)[1].device_ids == (0, 8)
    with pytest.raises(RankTableError) as info:
        load_rank_table(path, FORMATS, max_devices=8)
    assert (info.value.path, info.value.field) == (str(path), "alpha_list[1]")
    assert "8 is out of range: with 8 devices, device_id must be in [0, 7]" in info.value.problem
    with pytest.raises(RankTableError) as info:
        load_rank_table(_write(tmp_path, {"alpha_list": [0, "1"]}), FORMATS)
    assert (info.value.field, info.value.problem) == ("alpha_list[1]", '"1" is not an integer')


def test_load_rank_table_recognises_both_installed_formats() -> None:
    # What `xccl rank-table validate` and `xccl doctor` do: every installed plugin's formats, here Sophgo's and HCCL's.
    formats = installed_formats()
    fmt, table = load_rank_table(SOPHGO_TEMPLATE, formats)
    assert (fmt.name, type(table).__name__, table.world_size()) == ("sophgo", "SophgoRankTable", 2)
    fmt, table = load_rank_table(HCCL_V10, formats)
    assert (fmt.name, type(table).__name__, table.world_size()) == ("hccl", "HcclRankTable", 2)
    fmt, table = load_rank_table(str(HCCL_V12), formats)
    assert (fmt.name, type(table).__name__, table.world_size()) == ("hccl", "HcclRankTable", 4)


# ---------------------------------------------------------------------------------------------------------------
# Files that are no rank table at all
# ---------------------------------------------------------------------------------------------------------------


class FileCase(NamedTuple):
    """A file that is not a rank table at all: how to make it, and the error expected."""

    name: str
    make: Callable[[Path], Path]
    phrase: str


def _text(content: str | bytes) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "rank_table.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return make


#: Files that read_json itself rejects, before any format is consulted.
READ_CASES = [
    # Tests may run as root, where chmod 000 still reads; a directory and a missing path fail for everyone.
    FileCase("missing-file", lambda p: p / "absent.json", "cannot read the file: No such file or directory"),
    FileCase("directory", lambda p: p, "cannot read the file: Is a directory"),
    FileCase("invalid-json", _text('{\n  "version": "1.0",\n  "node_list": [,]\n}'), "invalid JSON at line 3 column"),
    FileCase("empty-file", _text(""), "invalid JSON at line 1 column 1"),
    FileCase("not-utf8", _text(b'{"version": "\xff"}'), "is not UTF-8 text"),
]

FILE_CASES = [
    *READ_CASES,
    FileCase("json-string", _text('"1.0"'), "is a string; expected a JSON object (a rank table of: alpha, beta)"),
    FileCase(
        "neither-format",
        _text('{"version": "1.0"}'),
        "is none of the rank-table formats the installed plugins know (alpha, beta)",
    ),
    FileCase(
        "both-formats",
        _text('{"alpha_list": [], "beta_list": []}'),
        "has the keys of several formats (alpha, beta); a rank table is one or the other",
    ),
]


@pytest.mark.parametrize("case", FILE_CASES, ids=operator.attrgetter("name"))
def test_unusable_file(case: FileCase, tmp_path: Path) -> None:
    path = case.make(tmp_path)
    with pytest.raises(RankTableError) as info:
        load_rank_table(path, FORMATS)
    assert info.value.path == str(path)
    assert info.value.field == "$"
    assert case.phrase in info.value.problem


@pytest.mark.parametrize("case", READ_CASES, ids=operator.attrgetter("name"))
def test_read_json_errors(case: FileCase, tmp_path: Path) -> None:
    path = str(case.make(tmp_path))
    with pytest.raises(RankTableError) as info:
        read_json(path)
    assert (info.value.path, info.value.field) == (path, "$")
    assert case.phrase in info.value.problem


def test_read_json_decodes() -> None:
    assert read_json(str(SOPHGO_TEMPLATE)) == json.loads(SOPHGO_TEMPLATE.read_text(encoding="utf-8"))


def test_no_formats_at_all(tmp_path: Path) -> None:
    with pytest.raises(RankTableError) as info:
        load_rank_table(_write(tmp_path, {"alpha_list": [0]}), ())
    assert info.value.problem == "is none of the rank-table formats the installed plugins know (none installed)"


def test_a_format_without_a_generator_says_so() -> None:
    assert (AlphaFormat.can_generate, AlphaFormat.default_output) == (False, "rank_table.json")
    with pytest.raises(NotImplementedError, match="the alpha rank-table format has no generator"):
        AlphaFormat().generate(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# dump
# ---------------------------------------------------------------------------------------------------------------


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "rank_table.json"
    path.parent.mkdir()
    doc = {"alpha_list": [3, 2, 1, 0]}
    dump({"alpha_list": [9]}, path)
    dump(doc, path)  # replaces the previous table
    assert json.loads(path.read_text(encoding="utf-8")) == doc
    assert path.read_text(encoding="utf-8") == json.dumps(doc, indent=4) + "\n"
    assert path.stat().st_mode & 0o777 == 0o644
    fmt, table = load_rank_table(path, FORMATS, max_devices=4)
    assert (fmt.name, table.device_ids) == ("alpha", (3, 2, 1, 0))
    assert [p.name for p in path.parent.iterdir()] == ["rank_table.json"]  # no temporary file left behind


def test_dump_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The text goes to a temporary file that then replaces the table: a failure leaves the old table whole.
    path = tmp_path / "rank_table.json"
    dump({"alpha_list": [0]}, path)

    def failing_replace(src: str, dst: str) -> None:
        assert Path(src).parent == tmp_path and Path(src).name != path.name
        assert json.loads(Path(src).read_text(encoding="utf-8")) == {"alpha_list": [0, 1]}  # written in full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        dump({"alpha_list": [0, 1]}, path)
    assert json.loads(path.read_text(encoding="utf-8")) == {"alpha_list": [0]}
    assert [p.name for p in tmp_path.iterdir()] == ["rank_table.json"]  # the temporary file is removed


# ---------------------------------------------------------------------------------------------------------------
# The module itself
# ---------------------------------------------------------------------------------------------------------------


def test_module_imports_only_the_standard_library() -> None:
    # The CLI and the plugins' cheap probes read rank tables; that must never pull in torch or a vendor SDK.
    import xccl.plugin._ranktable as module

    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    package = module.__name__.split(".")
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # Resolve relative imports: `from ..errors import` in xccl.plugin._ranktable is xccl.errors.
            base = package[: len(package) - node.level] if node.level else []
            imported.add(".".join([*base, *([node.module] if node.module else [])]))
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"xccl.errors"}
