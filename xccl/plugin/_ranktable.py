"""The rank-table kit: reading a rank table's JSON and reporting every defect with its JSON path.

A rank table is a JSON file, named by ``RANK_TABLE_FILE``, that maps each global rank to a physical device. Each
plugin brings its vendor's :class:`RankTableFormat` (``Plugin.rank_table_formats``); what the formats share is here
(docs/plugin-guide.md, section 11). Every defect raises :class:`~xccl.RankTableError` with the JSON path of the
offending field (``node_list[0].device_list[3].rank``, or ``$`` for the whole document) and what is expected.
Validation never uses ``assert``: it must hold under ``python -O`` too.

This module uses the standard library only, so that the CLI and the plugins' cheap probes can read a rank table
without importing torch.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, TypeAlias

from ..errors import RankTableError

__all__ = [
    "INTEGER",
    "RankTableFormat",
    "StrPath",
    "any_string",
    "as_object",
    "check_device_ids",
    "check_ranks",
    "describe",
    "dump",
    "is_ipv4",
    "json_type",
    "load_rank_table",
    "non_negative",
    "nonempty_list",
    "optional_ipv4",
    "read_json",
    "require",
]

#: A file path, as a string or a path object.
StrPath: TypeAlias = str | os.PathLike[str]

#: Digits only, with an optional minus sign so that "-1" is reported as negative rather than as non-numeric.
INTEGER: Final = re.compile(r"-?[0-9]+")


class RankTableFormat:
    """One vendor's rank-table format, as its plugin provides it (``Plugin.rank_table_formats``): subclasses
    implement :meth:`detect`, :meth:`parse` and :meth:`summary`, and :meth:`generate` where :attr:`can_generate`."""

    #: Short name: ``xccl rank-table <name>`` generates one, and messages name the format by it.
    name: ClassVar[str] = ""
    #: One line for help texts, e.g. ``"Sophgo (SCCL) rank table"``.
    description: ClassVar[str] = ""
    #: Whether ``xccl rank-table <name>`` can write one (:meth:`generate`).
    can_generate: ClassVar[bool] = False
    #: Where ``xccl rank-table <name>`` writes without ``-o`` or ``RANK_TABLE_FILE``.
    default_output: ClassVar[str] = "rank_table.json"

    def detect(self, data: Mapping[str, object]) -> bool:
        """Whether the decoded JSON object is a table of this format (judged by its keys, not validated)."""
        raise NotImplementedError

    def parse(self, data: object, path: str, *, max_devices: int | None = None) -> Any:
        """Validate the decoded JSON; return the table (with a ``world_size()``).

        Raises:
            RankTableError: the first defect found.
        """
        raise NotImplementedError

    def summary(self, table: Any) -> list[str]:
        """Lines describing a parsed table, for ``xccl rank-table validate``."""
        raise NotImplementedError

    def add_generate_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this format's generator options to ``parser`` (when :attr:`can_generate`)."""

    def generate(self, args: argparse.Namespace) -> dict[str, object]:
        """The table the generator options in ``args`` describe (validated by :meth:`parse` before writing)."""
        raise NotImplementedError(f"the {self.name} rank-table format has no generator")


def load_rank_table(
    path: StrPath, formats: Sequence[RankTableFormat], *, max_devices: int | None = None
) -> tuple[RankTableFormat, Any]:
    """Read a rank table of any of ``formats``: the one whose :meth:`~RankTableFormat.detect` accepts it.

    Args:
        path: the JSON file, usually ``os.environ["RANK_TABLE_FILE"]``.
        formats: the formats to recognise (every installed plugin's, for the CLI and ``xccl doctor``).
        max_devices: devices per node/server; when given, every ``device_id`` must be below it.

    Returns:
        The format and the parsed table.

    Raises:
        RankTableError: the file is missing, unreadable, not JSON, of no format or of several, or malformed.
    """
    name = os.fspath(path)
    data = read_json(name)
    known = ", ".join(f.name for f in formats) or "none installed"
    if not isinstance(data, dict):
        raise RankTableError(name, "$", f"is {json_type(data)}; expected a JSON object (a rank table of: {known})")
    matches = [f for f in formats if f.detect(data)]
    if len(matches) > 1:
        raise RankTableError(name, "$", f"has the keys of several formats ({', '.join(f.name for f in matches)}); "
                             "a rank table is one or the other")
    if not matches:
        raise RankTableError(name, "$", f"is none of the rank-table formats the installed plugins know ({known})")
    return matches[0], matches[0].parse(data, name, max_devices=max_devices)


def read_json(path: str) -> object:
    """The decoded JSON of ``path``.

    Raises:
        RankTableError: the file is missing, unreadable, not UTF-8 or not JSON.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        # e.strerror is "No such file or directory", "Is a directory", "Permission denied"...
        raise RankTableError(
            path, "$", f"cannot read the file: {e.strerror or e}; expected a readable JSON file"
        ) from e
    except UnicodeDecodeError as e:
        raise RankTableError(path, "$", f"is not UTF-8 text ({e.reason} at byte {e.start}); expected JSON") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RankTableError(path, "$", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e


def check_ranks(ranks: Sequence[tuple[int, str]], path: str, key: str) -> None:
    """Checks that the global ranks are exactly ``0..n-1``; ``ranks`` pairs each rank with its field."""
    first_seen: dict[int, str] = {}
    for rank, field in ranks:
        if rank in first_seen:
            raise RankTableError(
                path, field, f"{key} {rank} is also given at {first_seen[rank]}; each {key} must appear once"
            )
        first_seen[rank] = field
    n = len(ranks)
    missing = next((r for r in range(n) if r not in first_seen), None)
    if missing is not None:
        # Ranks are unique, so n of them with one absent from 0..n-1 means at least one lies beyond n-1.
        rank, field = min((r, f) for r, f in ranks if r >= n)
        raise RankTableError(
            path,
            field,
            f"{key} {rank} is out of range and {key} {missing} is missing: "
            f"the table has {n} devices, so its {key}s must be 0..{n - 1} with no gaps",
        )


def check_device_ids(device_ids: Sequence[tuple[int, str]], path: str, max_devices: int | None) -> None:
    """Checks one node's device ids (each paired with its field): unique, and below ``max_devices`` if given."""
    first_seen: dict[int, str] = {}
    for device_id, field in device_ids:
        if max_devices is not None and device_id >= max_devices:
            raise RankTableError(
                path,
                field,
                f"{device_id} is out of range: with {max_devices} devices, device_id must be in [0, {max_devices - 1}]",
            )
        if device_id in first_seen:
            raise RankTableError(
                path,
                field,
                f"{device_id} is also the device_id at {first_seen[device_id]}; "
                "a device may appear only once on its host",
            )
        first_seen[device_id] = field


def non_negative(number: int, path: str, field: str) -> int:
    """``number`` if it is >= 0."""
    if number < 0:
        raise RankTableError(path, field, f"{number} is negative; expected an integer >= 0")
    return number


def any_string(value: object, path: str, field: str) -> str:
    """``value`` if it is a string (an address, here)."""
    if not isinstance(value, str):
        raise RankTableError(path, field, f"{describe(value)} is not a string; expected an IPv4 address string")
    return value


def optional_ipv4(
    entry: Mapping[str, object], key: str, path: str, field: str, as_str: Callable[[object, str, str], str]
) -> str | None:
    """``entry[key]`` as an IPv4 address string, or None when absent (``as_str`` reads the string)."""
    if key not in entry:
        return None
    text = as_str(entry[key], path, f"{field}.{key}")
    if not is_ipv4(text):
        raise RankTableError(path, f"{field}.{key}", f'{text!r} is not an IPv4 address; expected e.g. "192.168.1.8"')
    return text


def is_ipv4(text: str) -> bool:
    """Whether ``text`` is a dotted IPv4 address."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def as_object(value: object, path: str, field: str, expected: str) -> dict[str, object]:
    """``value`` if it is a JSON object; ``expected`` describes one in the error."""
    if not isinstance(value, dict):
        raise RankTableError(path, field, f"is {json_type(value)}; expected {expected}")
    return value


def require(entry: Mapping[str, object], key: str, path: str, parent: str) -> object:
    """``entry[key]``, which must be present (``parent`` is the JSON path of ``entry``)."""
    if key not in entry:
        where = f"{parent}.{key}" if parent else key
        raise RankTableError(path, where, "is missing; it is required")
    return entry[key]


def nonempty_list(
    entry: Mapping[str, object], key: str, path: str, parent: str, expected: str
) -> list[tuple[int, object]]:
    """``entry[key]``, a non-empty JSON array, as ``(index, item)`` pairs."""
    field = f"{parent}.{key}" if parent else key
    value = require(entry, key, path, parent)
    if not isinstance(value, list):
        raise RankTableError(path, field, f"is {json_type(value)}; expected a list with {expected}")
    if not value:
        raise RankTableError(path, field, f"is empty; expected a list with {expected}")
    return list(enumerate(value))


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type: "an object", "an array", "a string"..."""
    for kind, name in ((dict, "an object"), (list, "an array"), (str, "a string"), (bool, "a boolean"),
                       ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def describe(value: object) -> str:
    """Names a bad value: scalars as JSON text (``"abc"``, ``true``, ``1.5``), containers by their type."""
    return json.dumps(value) if isinstance(value, (str, int, float)) else json_type(value)


def dump(table: Mapping[str, object], path: StrPath) -> None:
    """Writes a rank table as indented JSON, atomically.

    Other ranks may read the file while it is being written (every rank of a job often generates the same
    table), so the text goes to a temporary file in the same directory that then replaces ``path``.

    Args:
        table: A dict such as :meth:`RankTableFormat.generate` returns.
        path: Destination file.
    """
    name = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".ranktable-", suffix=".json", dir=os.path.dirname(os.path.abspath(name)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(table, indent=4) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, name)
    except BaseException:
        os.unlink(tmp)
        raise
