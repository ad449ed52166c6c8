"""Sophgo and HCCL rank tables: parse, validate, generate.

A rank table is a JSON file, named by ``RANK_TABLE_FILE``, that maps each global rank to a physical device.
Two formats exist:

* **Sophgo** (``torch_tpu``; written by ``tpu_gen_sccl_rank_table``)::

      {"version": "1.0", "node_list": [{"device_list": [
          {"device_id": "0", "device_ip": "127.0.0.1", "local_rank": "0", "rank": "0"}, ...]}]}

* **HCCL** (CANN, versions 1.0 and 1.2)::

      {"status": "completed", "version": "1.0", "server_count": "1", "server_list": [
          {"server_id": "node_0", "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"}]}]}

xccl parses both itself because Sophgo's own reader is broken in its current source (it looks for a
``world_rank`` key that neither its doc nor its generator writes). Every defect raises
:class:`~xccl.errors.RankTableError` with the JSON path of the offending field, e.g.
``node_list[0].device_list[3].rank``, or ``$`` for the document as a whole, and a problem that says what is
wrong and what is expected. Validation never uses ``assert``: it must hold under ``python -O`` too.

This module uses the standard library only, so that the CLI and the plugins' cheap probes can read a rank
table without importing torch.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, final

from xccl.errors import RankTableError

__all__ = [
    "HcclDevice",
    "HcclRankTable",
    "HcclServer",
    "HcclSuperPod",
    "RankTable",
    "SophgoDevice",
    "SophgoNode",
    "SophgoRankTable",
    "dump",
    "generate_hccl",
    "generate_sophgo",
    "load_hccl",
    "load_rank_table",
    "load_sophgo",
    "parse_device_id_arg",
    "parse_hccl",
    "parse_sophgo",
]

#: A file path, as a string or a path object.
StrPath: TypeAlias = str | os.PathLike[str]

#: The only version Sophgo's doc allows ("当前仅支持配置为1.0").
SOPHGO_VERSION: Final = "1.0"
#: HCCL versions xccl understands: 1.0 (Atlas A2, typical networking) and 1.2 (Atlas A3 super-pod).
HCCL_VERSIONS: Final = ("1.0", "1.2")
#: The name used as ``RankTableError.path`` for errors in the ``--device-id`` command-line argument.
DEVICE_ID_ARG: Final = "<--device-id>"

# Digits only, with an optional minus sign so that "-1" is reported as negative rather than as non-numeric.
_INTEGER: Final = re.compile(r"-?[0-9]+")

# ---------------------------------------------------------------------------------------------------------------
# Value objects
# ---------------------------------------------------------------------------------------------------------------


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


@final
@dataclass(frozen=True, slots=True)
class HcclDevice:
    """One entry of an HCCL server's ``device`` list. Fields absent from the file are ``None``."""

    #: Physical NPU id on its server.
    device_id: int
    #: Global rank, in ``[0, world_size - 1]``.
    rank_id: int
    #: IPv4 address of the device's NIC.
    device_ip: str | None = None
    #: Port HCCL listens on for this device.
    device_port: int | None = None
    #: v1.2: device id within the super pod.
    super_device_id: int | None = None
    #: v1.2: backup NIC address.
    backup_device_ip: str | None = None
    #: v1.2: backup NIC port.
    backup_device_port: int | None = None
    #: v1.2: host-side port.
    host_port: int | None = None


@final
@dataclass(frozen=True, slots=True)
class HcclServer:
    """One entry of an HCCL ``server_list``."""

    #: The server's name or IP, unique in the table.
    server_id: str
    #: v1.2: the host's IPv4 address.
    host_ip: str | None
    #: The server's devices in file order.
    devices: tuple[HcclDevice, ...]


@final
@dataclass(frozen=True, slots=True)
class HcclSuperPod:
    """One entry of a v1.2 ``super_pod_list``."""

    #: The super pod's id, as written.
    super_pod_id: str
    #: ``server_id`` of each member server; each names a server of ``server_list``.
    server_ids: tuple[str, ...]


@final
@dataclass(frozen=True, slots=True)
class HcclRankTable:
    """A validated HCCL rank table (version 1.0 or 1.2)."""

    #: The file it was read from (or the name given to :func:`parse_hccl`).
    path: str
    #: ``"1.0"`` or ``"1.2"``.
    version: Literal["1.0", "1.2"]
    #: ``"completed"``, or ``None`` where the file has no status.
    status: str | None
    #: Number of servers; equals ``len(servers)``.
    server_count: int
    #: The servers in file order.
    servers: tuple[HcclServer, ...]
    #: v1.2 super pods; empty for v1.0.
    super_pods: tuple[HcclSuperPod, ...] = ()

    def world_size(self) -> int:
        """Returns the number of ranks (devices) over all servers."""
        return sum(len(server.devices) for server in self.servers)

    def server_of(self, rank: int) -> int:
        """Returns the index in ``server_list`` of the server that holds ``rank``.

        Raises:
            RankTableError: No device has that rank.
        """
        for index, server in enumerate(self.servers):
            if any(d.rank_id == rank for d in server.devices):
                return index
        raise RankTableError(
            self.path, "server_list", f"no device has rank_id {rank}; the table has ranks 0..{self.world_size() - 1}"
        )

    def device_ids(self, server_index: int) -> tuple[int, ...]:
        """Returns the device ids of one server ordered by ``rank_id``.

        Raises:
            RankTableError: There is no such server.
        """
        if not 0 <= server_index < len(self.servers):
            raise RankTableError(
                self.path,
                "server_list",
                f"there is no server {server_index}; the table has servers 0..{len(self.servers) - 1}",
            )
        return tuple(d.device_id for d in sorted(self.servers[server_index].devices, key=lambda d: d.rank_id))


#: Either kind of table, as :func:`load_rank_table` returns it.
RankTable: TypeAlias = SophgoRankTable | HcclRankTable

# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def load_rank_table(path: StrPath, *, max_devices: int | None = None) -> RankTable:
    """Reads and validates a rank table of either format.

    The format is recognised by its list key: ``node_list`` is Sophgo, ``server_list`` is HCCL.

    Args:
        path: The JSON file, usually ``os.environ["RANK_TABLE_FILE"]``.
        max_devices: Devices per node/server; when given, every ``device_id`` must be in
            ``[0, max_devices - 1]``. ``None`` leaves device ids unbounded.

    Returns:
        A :class:`SophgoRankTable` or an :class:`HcclRankTable`.

    Raises:
        RankTableError: The file is missing, unreadable, not JSON, of neither format, or malformed.

    Example::

        table = load_rank_table(os.environ["RANK_TABLE_FILE"])
        if isinstance(table, SophgoRankTable):
            options.chip_map = list(table.chip_map(table.node_of(rank)))
    """
    name = os.fspath(path)
    data = _read_json(name)
    if isinstance(data, dict):
        if "node_list" in data and "server_list" in data:
            raise RankTableError(
                name, "$", "has both node_list (Sophgo) and server_list (HCCL); a rank table is one or the other"
            )
        if "server_list" in data:
            return parse_hccl(data, name, max_devices=max_devices)
        if "node_list" not in data:
            raise RankTableError(
                name, "$", "is neither a Sophgo rank table (no node_list) nor an HCCL rank table (no server_list)"
            )
    return parse_sophgo(data, name, max_devices=max_devices)


def load_sophgo(path: StrPath, *, max_devices: int | None = None) -> SophgoRankTable:
    """Reads and validates a Sophgo rank table; see :func:`parse_sophgo`.

    Raises:
        RankTableError: The file is missing, unreadable, not JSON or malformed.
    """
    name = os.fspath(path)
    return parse_sophgo(_read_json(name), name, max_devices=max_devices)


def load_hccl(path: StrPath, *, max_devices: int | None = None) -> HcclRankTable:
    """Reads and validates an HCCL rank table; see :func:`parse_hccl`.

    Raises:
        RankTableError: The file is missing, unreadable, not JSON or malformed.
    """
    name = os.fspath(path)
    return parse_hccl(_read_json(name), name, max_devices=max_devices)


def _read_json(path: str) -> object:
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


# ---------------------------------------------------------------------------------------------------------------
# Sophgo
# ---------------------------------------------------------------------------------------------------------------


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
    top = _as_object(data, path, "$", 'an object with "version" and "node_list"')
    version = _required(top, "version", path, "")
    if version != SOPHGO_VERSION:
        raise RankTableError(
            path,
            "version",
            f'unsupported version {_describe(version)}; a Sophgo rank table must have version "1.0", a JSON string',
        )
    nodes: list[SophgoNode] = []
    ranks: list[tuple[int, str]] = []
    for i, raw_node in _nonempty_list(top, "node_list", path, "", "one object per node"):
        node_field = f"node_list[{i}]"
        node = _as_object(raw_node, path, node_field, 'an object with "device_list"')
        devices: list[SophgoDevice] = []
        for j, raw_device in _nonempty_list(node, "device_list", path, node_field, "one object per device"):
            device = _sophgo_device(raw_device, path, f"{node_field}.device_list[{j}]")
            devices.append(device)
            ranks.append((device.rank, f"{node_field}.device_list[{j}].rank"))
        _check_device_ids(
            [(d.device_id, f"{node_field}.device_list[{j}].device_id") for j, d in enumerate(devices)],
            path,
            max_devices,
        )
        nodes.append(SophgoNode(tuple(devices)))
    _check_ranks(ranks, path, "rank")
    # After the global check, so that ranks are known to be unique when local ranks are compared with them.
    for i, parsed in enumerate(nodes):
        _check_local_ranks(parsed.devices, path, f"node_list[{i}].device_list")
    return SophgoRankTable(path, SOPHGO_VERSION, tuple(nodes))


def _sophgo_device(raw: object, path: str, field: str) -> SophgoDevice:
    entry = _as_object(raw, path, field, 'an object with "device_id" and "rank"')
    if "device_ip" in entry and "device_ip_emulator" in entry:
        raise RankTableError(path, field, "has both device_ip and device_ip_emulator; the generator writes one of them")
    ip_key = "device_ip_emulator" if "device_ip_emulator" in entry else "device_ip"
    local_rank = entry.get("local_rank")
    return SophgoDevice(
        device_id=_sophgo_int(_required(entry, "device_id", path, field), path, f"{field}.device_id"),
        rank=_sophgo_int(_required(entry, "rank", path, field), path, f"{field}.rank"),
        local_rank=None if local_rank is None else _sophgo_int(local_rank, path, f"{field}.local_rank"),
        device_ip=_optional_ipv4(entry, ip_key, path, field, _any_string),
    )


def _sophgo_int(value: object, path: str, field: str) -> int:
    # bool is an int subclass, but `true` is certainly not a device id.
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _INTEGER.fullmatch(value):
        number = int(value)
    else:
        raise RankTableError(
            path,
            field,
            f'{_describe(value)} is not a number; expected a non-negative integer or a numeric string such as "0"',
        )
    return _non_negative(number, path, field)


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


# ---------------------------------------------------------------------------------------------------------------
# HCCL
# ---------------------------------------------------------------------------------------------------------------


def parse_hccl(data: object, path: str = "<rank table>", *, max_devices: int | None = None) -> HcclRankTable:
    """Validates decoded JSON as an HCCL rank table (version ``"1.0"`` or ``"1.2"``).

    Every value must be a string, as CANN's doc requires ("every value is a string"): ``"0"``, not ``0``.

    Args:
        data: The decoded JSON document.
        path: Where it came from; only used in errors and kept as ``HcclRankTable.path``.
        max_devices: Devices per server; when given, every ``device_id`` must be in ``[0, max_devices - 1]``.

    Returns:
        The validated table.

    Raises:
        RankTableError: The first defect found.
    """
    top = _as_object(data, path, "$", 'an object with "version" and "server_list"')
    version = _required(top, "version", path, "")
    if version not in HCCL_VERSIONS:
        raise RankTableError(
            path,
            "version",
            f"unsupported version {_describe(version)}; "
            'an HCCL rank table must have version "1.0" or "1.2", a JSON string',
        )
    status = top.get("status")
    if status is not None and status != "completed":
        raise RankTableError(
            path,
            "status",
            f'is {status!r}: the file is not ready yet; expected "completed", which is written once it is complete',
        )
    servers = _hccl_servers(top, path, max_devices)
    server_count = len(servers)
    if "server_count" in top:
        server_count = _hccl_int(top["server_count"], path, "server_count")
        if server_count != len(servers):
            raise RankTableError(
                path, "server_count", f"is {server_count} but server_list has {len(servers)} servers; they must match"
            )
    super_pods = _hccl_super_pods(top, version, {s.server_id for s in servers}, path)
    return HcclRankTable(
        path=path,
        version="1.0" if version == "1.0" else "1.2",  # spelled out so that mypy sees the Literal
        status=None if status is None else "completed",
        server_count=server_count,
        servers=servers,
        super_pods=super_pods,
    )


def _hccl_servers(top: Mapping[str, object], path: str, max_devices: int | None) -> tuple[HcclServer, ...]:
    servers: list[HcclServer] = []
    ranks: list[tuple[int, str]] = []
    first_seen: dict[str, int] = {}
    for i, raw_server in _nonempty_list(top, "server_list", path, "", "one object per server"):
        field = f"server_list[{i}]"
        server = _as_object(raw_server, path, field, 'an object with "server_id" and "device"')
        server_id = _hccl_str(_required(server, "server_id", path, field), path, f"{field}.server_id")
        if server_id in first_seen:
            raise RankTableError(
                path,
                f"{field}.server_id",
                f"{server_id!r} is also the server_id of server_list[{first_seen[server_id]}]; "
                "server ids must be unique",
            )
        first_seen[server_id] = i
        devices: list[HcclDevice] = []
        for j, raw_device in _nonempty_list(server, "device", path, field, "one object per device"):
            device = _hccl_device(raw_device, path, f"{field}.device[{j}]")
            devices.append(device)
            ranks.append((device.rank_id, f"{field}.device[{j}].rank_id"))
        _check_device_ids(
            [(d.device_id, f"{field}.device[{j}].device_id") for j, d in enumerate(devices)], path, max_devices
        )
        host_ip = _optional_ipv4(server, "host_ip", path, field, _hccl_str)
        servers.append(HcclServer(server_id, host_ip, tuple(devices)))
    _check_ranks(ranks, path, "rank_id")
    return tuple(servers)


def _hccl_device(raw: object, path: str, field: str) -> HcclDevice:
    entry = _as_object(raw, path, field, 'an object with "device_id" and "rank_id"')

    def number(key: str) -> int | None:
        return _hccl_int(entry[key], path, f"{field}.{key}") if key in entry else None

    def port(key: str) -> int | None:
        value = number(key)
        if value is not None and not 0 < value <= 65535:
            raise RankTableError(path, f"{field}.{key}", f"{value} is not a port number; expected 1..65535")
        return value

    return HcclDevice(
        device_id=_hccl_int(_required(entry, "device_id", path, field), path, f"{field}.device_id"),
        rank_id=_hccl_int(_required(entry, "rank_id", path, field), path, f"{field}.rank_id"),
        device_ip=_optional_ipv4(entry, "device_ip", path, field, _hccl_str),
        device_port=port("device_port"),
        super_device_id=number("super_device_id"),
        backup_device_ip=_optional_ipv4(entry, "backup_device_ip", path, field, _hccl_str),
        backup_device_port=port("backup_device_port"),
        host_port=port("host_port"),
    )


def _hccl_super_pods(
    top: Mapping[str, object], version: object, server_ids: set[str], path: str
) -> tuple[HcclSuperPod, ...]:
    if "super_pod_list" not in top:
        return ()
    if version != "1.2":
        raise RankTableError(
            path, "super_pod_list", f'is only defined for version "1.2" (Atlas A3 super pods), not {_describe(version)}'
        )
    pods: list[HcclSuperPod] = []
    member_of: dict[str, str] = {}
    for i, raw_pod in _nonempty_list(top, "super_pod_list", path, "", "one object per super pod"):
        field = f"super_pod_list[{i}]"
        pod = _as_object(raw_pod, path, field, 'an object with "super_pod_id" and "server_list"')
        pod_id = _hccl_str(_required(pod, "super_pod_id", path, field), path, f"{field}.super_pod_id")
        members: list[str] = []
        for j, raw_member in _nonempty_list(pod, "server_list", path, field, 'one {"server_id": ...} per server'):
            member_field = f"{field}.server_list[{j}]"
            member = _as_object(raw_member, path, member_field, 'an object with "server_id"')
            server_id = _hccl_str(_required(member, "server_id", path, member_field), path, f"{member_field}.server_id")
            if server_id not in server_ids:
                raise RankTableError(
                    path,
                    f"{member_field}.server_id",
                    f"{server_id!r} names no server of server_list; expected one of {sorted(server_ids)}",
                )
            if server_id in member_of:
                raise RankTableError(
                    path,
                    f"{member_field}.server_id",
                    f"server {server_id!r} is already in super pod {member_of[server_id]!r}; a server is in one pod",
                )
            member_of[server_id] = pod_id
            members.append(server_id)
        pods.append(HcclSuperPod(pod_id, tuple(members)))
    return tuple(pods)


def _hccl_str(value: object, path: str, field: str) -> str:
    if not isinstance(value, str):
        raise RankTableError(
            path, field, f"{_describe(value)} is not a string; every value in an HCCL rank table is a string"
        )
    return value


def _hccl_int(value: object, path: str, field: str) -> int:
    text = _hccl_str(value, path, field)
    if not _INTEGER.fullmatch(text):
        raise RankTableError(
            path,
            field,
            f'{text!r} is not numeric; expected a numeric string such as "0" '
            "(every value in an HCCL rank table is a string)",
        )
    return _non_negative(int(text), path, field)


# ---------------------------------------------------------------------------------------------------------------
# Checks shared by both formats
# ---------------------------------------------------------------------------------------------------------------


def _check_ranks(ranks: Sequence[tuple[int, str]], path: str, key: str) -> None:
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


def _check_device_ids(device_ids: Sequence[tuple[int, str]], path: str, max_devices: int | None) -> None:
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


def _non_negative(number: int, path: str, field: str) -> int:
    if number < 0:
        raise RankTableError(path, field, f"{number} is negative; expected an integer >= 0")
    return number


def _any_string(value: object, path: str, field: str) -> str:
    if not isinstance(value, str):
        raise RankTableError(path, field, f"{_describe(value)} is not a string; expected an IPv4 address string")
    return value


def _optional_ipv4(
    entry: Mapping[str, object], key: str, path: str, field: str, as_str: Callable[[object, str, str], str]
) -> str | None:
    if key not in entry:
        return None
    text = as_str(entry[key], path, f"{field}.{key}")
    if not _is_ipv4(text):
        raise RankTableError(path, f"{field}.{key}", f'{text!r} is not an IPv4 address; expected e.g. "192.168.1.8"')
    return text


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _as_object(value: object, path: str, field: str, expected: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RankTableError(path, field, f"is {_json_type(value)}; expected {expected}")
    return value


def _required(entry: Mapping[str, object], key: str, path: str, parent: str) -> object:
    if key not in entry:
        where = f"{parent}.{key}" if parent else key
        raise RankTableError(path, where, "is missing; it is required")
    return entry[key]


def _nonempty_list(
    entry: Mapping[str, object], key: str, path: str, parent: str, expected: str
) -> list[tuple[int, object]]:
    field = f"{parent}.{key}" if parent else key
    value = _required(entry, key, path, parent)
    if not isinstance(value, list):
        raise RankTableError(path, field, f"is {_json_type(value)}; expected a list with {expected}")
    if not value:
        raise RankTableError(path, field, f"is empty; expected a list with {expected}")
    return list(enumerate(value))


def _json_type(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else type(value).__name__


def _describe(value: object) -> str:
    """Names a bad value: scalars as JSON text (``"abc"``, ``true``, ``1.5``), containers by their type."""
    return json.dumps(value) if isinstance(value, (str, int, float)) else _json_type(value)


# ---------------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------------


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
        _check_device_ids(list(zip(ids, fields, strict=True)), source, None)
        nodes.append(ids)
    return nodes


def _list_or_type(value: object) -> str:
    return "an empty list" if value == [] else _json_type(value)


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
            if not isinstance(ip, str) or not _is_ipv4(ip):
                raise RankTableError(
                    source, f"$[{i}][{j}]", f'{_describe(ip)} is not an IPv4 address; expected e.g. "127.0.0.1"'
                )
        nodes.append(list(node_ips))
    return nodes


def generate_hccl(
    device_ids: Sequence[int],
    device_ips: Sequence[str] | None = None,
    *,
    server_id: str = "127.0.0.1",
    device_port: int | None = None,
) -> dict[str, object]:
    """Builds a single-server HCCL v1.0 rank table, e.g. to drive a simulated Ascend world.

    Args:
        device_ids: Physical device ids in rank order; ``rank_id`` is the position in this list.
        device_ips: One IPv4 address per device; ``None`` leaves ``device_ip`` out.
        server_id: The server's name or IP.
        device_port: Written as every device's ``device_port`` when given.

    Returns:
        The table as a dict (every value a string, as CANN requires), ready for :func:`dump`.

    Raises:
        RankTableError: The ids or addresses are invalid; the result is checked with :func:`parse_hccl`.
    """
    if device_ips is not None and len(device_ips) != len(device_ids):
        raise RankTableError(
            "<device_ips>", "$", f"has {len(device_ips)} addresses for {len(device_ids)} devices; give one per device"
        )
    devices: list[dict[str, str]] = []
    for rank_id, device_id in enumerate(device_ids):
        entry = {"device_id": str(device_id)}
        if device_ips is not None:
            entry["device_ip"] = device_ips[rank_id]
        if device_port is not None:
            entry["device_port"] = str(device_port)
        entry["rank_id"] = str(rank_id)
        devices.append(entry)
    table: dict[str, object] = {
        "status": "completed",
        "version": "1.0",
        "server_count": "1",
        "server_list": [{"server_id": server_id, "device": devices}],
    }
    # Reuse the parser as the generator's validator so that the two can never disagree.
    parse_hccl(table, "<generate_hccl>")
    return table


def dump(table: Mapping[str, object], path: StrPath) -> None:
    """Writes a rank table as indented JSON, atomically.

    Other ranks may read the file while it is being written (every rank of a job often generates the same
    table), so the text goes to a temporary file in the same directory that then replaces ``path``.

    Args:
        table: A dict such as :func:`generate_sophgo` returns.
        path: Destination file.
    """
    name = os.fspath(path)
    text = json.dumps(table, indent=4) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".ranktable-", suffix=".json", dir=os.path.dirname(os.path.abspath(name)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, name)
    except BaseException:
        os.unlink(tmp)
        raise
