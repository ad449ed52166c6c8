"""Sophgo's rank table (``torch_tpu``; written by ``tpu_gen_sccl_rank_table``): parse, validate, generate.

::

    {"version": "1.0", "node_list": [{"device_list": [
        {"device_id": "0", "device_ip": "127.0.0.1", "local_rank": "0", "rank": "0"}, ...]}]}

xccl parses it itself because Sophgo's own reader is broken in its current source (it looks for a ``world_rank``
key that neither its doc nor its generator writes; manifest gotcha 7). Every defect raises
:class:`~xccl.RankTableError` with the JSON path of the field. Standard library and xccl's rank-table kit only:
the cheap probe reads tables too.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from xccl.plugin import (
    INTEGER,
    RankTableError,
    RankTableFormat,
    StrPath,
    any_string,
    as_object,
    check_device_ids,
    check_ranks,
    describe,
    is_ipv4,
    json_type,
    non_negative,
    nonempty_list,
    optional_ipv4,
    read_json,
    require,
)

__all__ = [
    "SOPHGO_VERSION",
    "SophgoDevice",
    "SophgoFormat",
    "SophgoNode",
    "SophgoRankTable",
    "generate_sophgo",
    "load_sophgo",
    "parse_device_id_arg",
    "parse_sophgo",
]

#: The only version Sophgo's doc allows ("当前仅支持配置为1.0").
SOPHGO_VERSION: Final = "1.0"
#: The name used as ``RankTableError.path`` for errors in the ``--device-id`` command-line argument.
DEVICE_ID_ARG: Final = "<--device-id>"


@final
@dataclass(frozen=True, slots=True)
class SophgoDevice:
    """One entry of a Sophgo ``device_list``."""

    #: Physical TPU index on its node, in ``[0, devices - 1]``.
    device_id: int
    #: Global rank, in ``[0, world_size - 1]``.
    rank: int
    #: Rank within the node, if the table gives one (the generator does; the doc's template does not).
    local_rank: int | None
    #: ``device_ip`` or ``device_ip_emulator``, whichever the entry has.
    device_ip: str | None


@final
@dataclass(frozen=True, slots=True)
class SophgoNode:
    """One entry of a Sophgo ``node_list``: the devices of one host, in file order."""

    #: The node's devices as listed in the file.
    devices: tuple[SophgoDevice, ...]


@final
@dataclass(frozen=True, slots=True)
class SophgoRankTable:
    """A validated Sophgo rank table.

    Ranks are ``0..world_size()-1`` with no gaps or repeats, device ids are unique within each node, and local
    ranks, where given, number each node's devices ``0..n-1`` in rank order.
    """

    #: The file it was read from (or the name given to :func:`parse_sophgo`).
    path: str
    #: Always ``"1.0"``.
    version: str
    #: The nodes in file order.
    nodes: tuple[SophgoNode, ...]

    def world_size(self) -> int:
        """Returns the number of ranks (devices) over all nodes."""
        return sum(len(node.devices) for node in self.nodes)

    def node_of(self, rank: int) -> int:
        """Returns the index in ``node_list`` of the node that holds ``rank``.

        Raises:
            RankTableError: No device has that rank.
        """
        return self._locate(rank)[0]

    def local_rank_of(self, rank: int) -> int:
        """Returns ``rank``'s position within its node: its ``local_rank``, or its place in rank order.

        Raises:
            RankTableError: No device has that rank.
        """
        node_index, device = self._locate(rank)
        if device.local_rank is not None:
            return device.local_rank
        return sorted(d.rank for d in self.nodes[node_index].devices).index(rank)

    def chip_map(self, node_index: int) -> tuple[int, ...]:
        """Returns the device ids of one node ordered by local rank (which is also rank order).

        This is what SCCL's ``ProcessGroupSCCLOptions.chip_map`` and the ``CHIP_MAP`` variable want:
        ``chip_map[local_rank]`` is the chip that local rank drives.

        Args:
            node_index: Index in ``node_list``, from ``0``.

        Raises:
            RankTableError: There is no such node.
        """
        if not 0 <= node_index < len(self.nodes):
            raise RankTableError(
                self.path, "node_list", f"there is no node {node_index}; the table has nodes 0..{len(self.nodes) - 1}"
            )
        # Validation guarantees that local_rank order equals rank order, so sorting by rank serves both.
        return tuple(d.device_id for d in sorted(self.nodes[node_index].devices, key=lambda d: d.rank))

    def _locate(self, rank: int) -> tuple[int, SophgoDevice]:
        for node_index, node in enumerate(self.nodes):
            for device in node.devices:
                if device.rank == rank:
                    return node_index, device
        raise RankTableError(
            self.path, "node_list", f"no device has rank {rank}; the table has ranks 0..{self.world_size() - 1}"
        )


def load_sophgo(path: StrPath, *, max_devices: int | None = None) -> SophgoRankTable:
    """Reads and validates a Sophgo rank table; see :func:`parse_sophgo`.

    Raises:
        RankTableError: The file is missing, unreadable, not JSON or malformed.
    """
    name = os.fspath(path)
    return parse_sophgo(read_json(name), name, max_devices=max_devices)





def parse_sophgo(data: object, path: str = "<rank table>", *, max_devices: int | None = None) -> SophgoRankTable:
    """Validates decoded JSON as a Sophgo rank table.

    Values may be integers or numeric strings (``"0"``): Sophgo's doc and generator write strings, its C++
    reader accepts both.

    Args:
        data: The decoded JSON document.
        path: Where it came from; only used in errors and kept as ``SophgoRankTable.path``.
        max_devices: Devices per node; when given, every ``device_id`` must be in ``[0, max_devices - 1]``.

    Returns:
        The validated table.

    Raises:
        RankTableError: The first defect found.
    """
    top = as_object(data, path, "$", 'an object with "version" and "node_list"')
    version = require(top, "version", path, "")
    if version != SOPHGO_VERSION:
        raise RankTableError(
            path,
            "version",
            f'unsupported version {describe(version)}; a Sophgo rank table must have version "1.0", a JSON string',
        )
    nodes: list[SophgoNode] = []
    ranks: list[tuple[int, str]] = []
    for i, raw_node in nonempty_list(top, "node_list", path, "", "one object per node"):
        node_field = f"node_list[{i}]"
        node = as_object(raw_node, path, node_field, 'an object with "device_list"')
        devices: list[SophgoDevice] = []
        for j, raw_device in nonempty_list(node, "device_list", path, node_field, "one object per device"):
            device = _sophgo_device(raw_device, path, f"{node_field}.device_list[{j}]")
            devices.append(device)
            ranks.append((device.rank, f"{node_field}.device_list[{j}].rank"))
        check_device_ids(
            [(d.device_id, f"{node_field}.device_list[{j}].device_id") for j, d in enumerate(devices)],
            path,
            max_devices,
        )
        nodes.append(SophgoNode(tuple(devices)))
    check_ranks(ranks, path, "rank")
    # After the global check, so that ranks are known to be unique when local ranks are compared with them.
    for i, parsed in enumerate(nodes):
        _check_local_ranks(parsed.devices, path, f"node_list[{i}].device_list")
    return SophgoRankTable(path, SOPHGO_VERSION, tuple(nodes))


def _sophgo_device(raw: object, path: str, field: str) -> SophgoDevice:
    entry = as_object(raw, path, field, 'an object with "device_id" and "rank"')
    if "device_ip" in entry and "device_ip_emulator" in entry:
        raise RankTableError(path, field, "has both device_ip and device_ip_emulator; the generator writes one of them")
    ip_key = "device_ip_emulator" if "device_ip_emulator" in entry else "device_ip"
    local_rank = entry.get("local_rank")
    return SophgoDevice(
        device_id=_sophgo_int(require(entry, "device_id", path, field), path, f"{field}.device_id"),
        rank=_sophgo_int(require(entry, "rank", path, field), path, f"{field}.rank"),
        local_rank=None if local_rank is None else _sophgo_int(local_rank, path, f"{field}.local_rank"),
        device_ip=optional_ipv4(entry, ip_key, path, field, any_string),
    )


def _sophgo_int(value: object, path: str, field: str) -> int:
    # bool is an int subclass, but `true` is certainly not a device id.
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and INTEGER.fullmatch(value):
        number = int(value)
    else:
        raise RankTableError(
            path,
            field,
            f'{describe(value)} is not a number; expected a non-negative integer or a numeric string such as "0"',
        )
    return non_negative(number, path, field)


def _check_local_ranks(devices: Sequence[SophgoDevice], path: str, list_field: str) -> None:
    """Checks that local ranks, where given, number the node's devices 0..n-1 in rank order."""
    locals_ = [d.local_rank for d in devices if d.local_rank is not None]
    if not locals_:
        return
    n = len(devices)
    if len(locals_) < n:
        j = next(j for j, d in enumerate(devices) if d.local_rank is None)
        raise RankTableError(
            path,
            f"{list_field}[{j}].local_rank",
            "is missing while other devices of this node have one; give local_rank to every device or to none",
        )
    first_seen: dict[int, int] = {}
    for j, local in enumerate(locals_):
        if local >= n:
            raise RankTableError(
                path,
                f"{list_field}[{j}].local_rank",
                f"{local} is out of range: this node has {n} devices, so 0..{n - 1}",
            )
        if local in first_seen:
            raise RankTableError(
                path,
                f"{list_field}[{j}].local_rank",
                f"{local} is also the local_rank of {list_field}[{first_seen[local]}]; "
                "local ranks must be unique within a node",
            )
        first_seen[local] = j
    # chip_map is indexed by local rank while SCCL's communicator is given global ranks: if the two orders
    # disagreed, torch_tpu.set_device and the communicator would pick different chips for the same process.
    rank_order = sorted(d.rank for d in devices)
    for j, (local, device) in enumerate(zip(locals_, devices, strict=True)):
        expected = rank_order.index(device.rank)
        if local != expected:
            raise RankTableError(
                path,
                f"{list_field}[{j}].local_rank",
                f"is {local}, expected {expected}: local ranks must follow rank order, and rank {device.rank} "
                f"comes at position {expected} among this node's ranks {rank_order}",
            )



def parse_device_id_arg(text: str) -> list[list[int]]:
    """Parses ``tpu_gen_sccl_rank_table``'s ``--device_id`` argument: one JSON list of device ids per node.

    Sophgo's tool takes a Python literal (``"[['0','1']]"``) through ``ast.literal_eval``; xccl takes JSON so that
    the same text works from a shell, a YAML file or another language. Ids may be integers or numeric strings.

    Args:
        text: e.g. ``'[[0,1,2,3,4,5,6,7]]'`` for one node, ``'[[0,1],[0,1]]'`` for two, or ``'[["0","1"]]'``.

    Returns:
        The device ids, one list per node.

    Raises:
        RankTableError: With path ``"<--device-id>"``: the text is not JSON (a Python literal with single quotes
            is named as such), or not a non-empty list of non-empty lists of non-negative integers.
    """
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as e:
        if "'" in text:
            raise RankTableError(
                DEVICE_ID_ARG, "$", f"{text!r} looks like a Python literal (single quotes); pass JSON, e.g. [[0,1]]"
            ) from e
        raise RankTableError(
            DEVICE_ID_ARG, "$", f"{text!r} is not JSON ({e.msg} at column {e.colno}); pass JSON, e.g. [[0,1]]"
        ) from e
    return _device_id_lists(data, DEVICE_ID_ARG)


def _device_id_lists(data: object, source: str) -> list[list[int]]:
    expected = "expected a non-empty list of lists of device ids, one list per node, e.g. [[0,1],[0,1]]"
    if not isinstance(data, list) or not data:
        raise RankTableError(source, "$", f"is {_list_or_type(data)}; {expected}")
    nodes: list[list[int]] = []
    for i, node in enumerate(data):
        if not isinstance(node, list) or not node:
            raise RankTableError(source, f"$[{i}]", f"is {_list_or_type(node)}; {expected}")
        fields = [f"$[{i}][{j}]" for j in range(len(node))]
        ids = [_sophgo_int(device_id, source, field) for device_id, field in zip(node, fields, strict=True)]
        check_device_ids(list(zip(ids, fields, strict=True)), source, None)
        nodes.append(ids)
    return nodes


def _list_or_type(value: object) -> str:
    return "an empty list" if value == [] else json_type(value)


def generate_sophgo(
    device_ids: Sequence[Sequence[int]], device_ips: Sequence[Sequence[str]] | None = None, emulator: bool = False
) -> dict[str, object]:
    """Builds a Sophgo rank table, as ``tpu_gen_sccl_rank_table`` does.

    Global ranks are numbered node by node: node 0 gets ``0..len(device_ids[0])-1``, node 1 the next ones, and
    so on; ``local_rank`` restarts at 0 on each node. Like Sophgo's generator, every value is written as a
    string and each entry's keys are ``device_id``, ``device_ip`` (``device_ip_emulator`` when ``emulator``),
    ``local_rank``, ``rank``.

    Args:
        device_ids: One list of physical device ids per node, in local-rank order.
        device_ips: One list of IPv4 addresses per node, matching ``device_ids`` in shape. ``None`` writes
            ``127.0.0.1`` everywhere (Sophgo's default, which only covers one node of 8).
        emulator: Write ``device_ip_emulator`` instead of ``device_ip``.

    Returns:
        The table as a dict, ready for :func:`dump`.

    Raises:
        RankTableError: ``device_ids`` is not a non-empty list of non-empty lists of unique non-negative ints, or
            ``device_ips`` does not match it in shape or holds something other than IPv4 addresses.
    """
    ids = _device_id_lists([list(node) for node in device_ids], "<device_ids>")
    ips = [["127.0.0.1"] * len(node) for node in ids] if device_ips is None else _ip_lists(device_ips, ids)
    ip_key = "device_ip_emulator" if emulator else "device_ip"
    node_list: list[dict[str, object]] = []
    rank = 0
    for node_ids, node_ips in zip(ids, ips, strict=True):
        device_list = []
        for local_rank, (device_id, ip) in enumerate(zip(node_ids, node_ips, strict=True)):
            device_list.append(
                {"device_id": str(device_id), ip_key: ip, "local_rank": str(local_rank), "rank": str(rank)}
            )
            rank += 1
        node_list.append({"device_list": device_list})
    return {"version": SOPHGO_VERSION, "node_list": node_list}


def _ip_lists(device_ips: Sequence[Sequence[str]], ids: Sequence[Sequence[int]]) -> list[list[str]]:
    source = "<device_ips>"
    if len(device_ips) != len(ids):
        raise RankTableError(
            source, "$", f"has {len(device_ips)} nodes but device_ids has {len(ids)}; give one list per node"
        )
    nodes: list[list[str]] = []
    for i, (node_ips, node_ids) in enumerate(zip(device_ips, ids, strict=True)):
        if isinstance(node_ips, str) or len(node_ips) != len(node_ids):
            raise RankTableError(
                source, f"$[{i}]", f"must list {len(node_ids)} addresses, one per device id of node {i}"
            )
        for j, ip in enumerate(node_ips):
            if not isinstance(ip, str) or not is_ipv4(ip):
                raise RankTableError(
                    source, f"$[{i}][{j}]", f'{describe(ip)} is not an IPv4 address; expected e.g. "127.0.0.1"'
                )
        nodes.append(list(node_ips))
    return nodes




class SophgoFormat(RankTableFormat):
    """Sophgo's rank-table format for ``xccl rank-table`` and ``xccl doctor``."""

    name = "sophgo"
    description = "Sophgo (SCCL) rank table, like tpu_gen_sccl_rank_table writes"
    can_generate = True
    default_output = "sccl_rank_table.json"

    def detect(self, data: Mapping[str, object]) -> bool:
        """A Sophgo table lists its hosts under ``node_list``."""
        return "node_list" in data

    def parse(self, data: object, path: str, *, max_devices: int | None = None) -> SophgoRankTable:
        """See :func:`parse_sophgo`."""
        return parse_sophgo(data, path, max_devices=max_devices)

    def summary(self, table: Any) -> list[str]:
        """The version, the ranks per node and each node's chip map."""
        nodes = table.nodes
        lines = [f"{table.path}: Sophgo rank table, version {table.version}, {table.world_size()} ranks on "
                 f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"]
        for i, node in enumerate(nodes):
            ranks = sorted(d.rank for d in node.devices)
            lines.append(f"  node {i}: ranks {_span(ranks)}, chip map {','.join(map(str, table.chip_map(i)))}")
        return lines

    def add_generate_arguments(self, parser: argparse.ArgumentParser) -> None:
        """``--device-id`` (JSON, one list per node), ``--device-ip``, ``--emulator``: Sophgo's tool's options."""
        parser.add_argument("--device-id", "--device_id", dest="device_id", required=True, metavar="JSON",
                            help="device ids per node as JSON, e.g. '[[0,1,2,3,4,5,6,7]]' (one list per node)")
        parser.add_argument("--device-ip", "--device_ip", dest="device_ip", metavar="JSON",
                            help="device IPv4 addresses per node as JSON, same shape (default: 127.0.0.1 everywhere)")
        parser.add_argument("--emulator", action="store_true", help="write device_ip_emulator instead of device_ip")

    def generate(self, args: argparse.Namespace) -> dict[str, object]:
        """The table ``tpu_gen_sccl_rank_table`` would write for these options."""
        ids = parse_device_id_arg(args.device_id)
        ips = None if args.device_ip is None else _device_ips(args.device_ip)
        return generate_sophgo(ids, ips, emulator=args.emulator)


def _device_ips(text: str) -> list[list[str]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankTableError("<--device-ip>", "$", f"{text!r} is not JSON ({exc.msg} at column {exc.colno}); "
                             'pass JSON, e.g. [["192.168.1.8","192.168.1.9"]]') from exc
    if not isinstance(data, list) or not all(isinstance(node, list) for node in data):
        raise RankTableError("<--device-ip>", "$", "expected a list of lists of IPv4 addresses, one list per node")
    return data


def _span(ordered: list[int]) -> str:
    """``0..7`` for a contiguous run, else the ranks listed: ``0,2,4``."""
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return ",".join(map(str, ordered))
