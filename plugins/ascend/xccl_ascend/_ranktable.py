"""HCCL's rank table (CANN, versions 1.0 and 1.2): parse, validate, generate.

::

    {"status": "completed", "version": "1.0", "server_count": "1", "server_list": [
        {"server_id": "node_0", "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"}]}]}

Every value is a string, as CANN's doc requires (manifest A6). Every defect raises :class:`~xccl.RankTableError`
with the JSON path of the field, so a malformed table fails before HCCL reads it (deep inside CANN otherwise).
Standard library and xccl's rank-table kit only: the cheap probe reads tables too.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, final

from xccl.plugin import (
    INTEGER,
    RankTableError,
    RankTableFormat,
    StrPath,
    as_object,
    check_device_ids,
    check_ranks,
    describe,
    dump,
    non_negative,
    nonempty_list,
    optional_ipv4,
    read_json,
    require,
)

__all__ = [
    "HCCL_VERSIONS",
    "HcclDevice",
    "HcclFormat",
    "HcclRankTable",
    "HcclServer",
    "HcclSuperPod",
    "generate_hccl",
    "load_hccl",
    "parse_hccl",
    "write_survivors",
]

#: HCCL versions xccl understands: 1.0 (Atlas A2, typical networking) and 1.2 (Atlas A3 super-pod).
HCCL_VERSIONS: Final = ("1.0", "1.2")


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


def load_hccl(path: StrPath, *, max_devices: int | None = None) -> HcclRankTable:
    """Reads and validates an HCCL rank table; see :func:`parse_hccl`.

    Raises:
        RankTableError: The file is missing, unreadable, not JSON or malformed.
    """
    name = os.fspath(path)
    return parse_hccl(read_json(name), name, max_devices=max_devices)





def write_survivors(path: StrPath, kept: Sequence[int], out: StrPath) -> HcclRankTable:
    """Write the rank table of a world shrunk to the old ranks ``kept`` (new rank ``i`` is ``kept[i]``) to ``out``.

    Every field of the original is kept as written; only the survivors' devices remain, with their new
    ``rank_id``; servers (and v1.2 super pods) left without a device are dropped and ``server_count`` follows. HCCL
    builds the world's communicator from the file ``RANK_TABLE_FILE`` names and refuses one whose ranks differ
    from the world's (``_check_rank_table``), so the survivors need theirs.

    Raises:
        RankTableError: the original is malformed, or lacks a rank of ``kept``.
    """
    name = os.fspath(path)
    data = read_json(name)
    table = parse_hccl(data, name)
    for r in kept:
        table.server_of(r)  # names a rank the table lacks
    renumber = {old: new for new, old in enumerate(kept)}
    doc = json.loads(json.dumps(data))  # a deep copy of the validated document
    servers = []
    for server in doc["server_list"]:
        devices = [dict(d, rank_id=str(renumber[int(d["rank_id"])])) for d in server["device"]
                   if int(d["rank_id"]) in renumber]
        if devices:
            servers.append(dict(server, device=devices))
    doc["server_list"] = servers
    doc["server_count"] = str(len(servers))
    if "super_pod_list" in doc:
        left = {str(s["server_id"]) for s in servers}
        pods = [dict(p, server_list=[m for m in p["server_list"] if str(m["server_id"]) in left])
                for p in doc["super_pod_list"]]
        doc["super_pod_list"] = [p for p in pods if p["server_list"]]
    dump(doc, out)
    return parse_hccl(doc, os.fspath(out))


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
    top = as_object(data, path, "$", 'an object with "version" and "server_list"')
    version = require(top, "version", path, "")
    if version not in HCCL_VERSIONS:
        raise RankTableError(
            path,
            "version",
            f"unsupported version {describe(version)}; "
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
    for i, raw_server in nonempty_list(top, "server_list", path, "", "one object per server"):
        field = f"server_list[{i}]"
        server = as_object(raw_server, path, field, 'an object with "server_id" and "device"')
        server_id = _hccl_str(require(server, "server_id", path, field), path, f"{field}.server_id")
        if server_id in first_seen:
            raise RankTableError(
                path,
                f"{field}.server_id",
                f"{server_id!r} is also the server_id of server_list[{first_seen[server_id]}]; "
                "server ids must be unique",
            )
        first_seen[server_id] = i
        devices: list[HcclDevice] = []
        for j, raw_device in nonempty_list(server, "device", path, field, "one object per device"):
            device = _hccl_device(raw_device, path, f"{field}.device[{j}]")
            devices.append(device)
            ranks.append((device.rank_id, f"{field}.device[{j}].rank_id"))
        check_device_ids(
            [(d.device_id, f"{field}.device[{j}].device_id") for j, d in enumerate(devices)], path, max_devices
        )
        host_ip = optional_ipv4(server, "host_ip", path, field, _hccl_str)
        servers.append(HcclServer(server_id, host_ip, tuple(devices)))
    check_ranks(ranks, path, "rank_id")
    return tuple(servers)


def _hccl_device(raw: object, path: str, field: str) -> HcclDevice:
    entry = as_object(raw, path, field, 'an object with "device_id" and "rank_id"')

    def number(key: str) -> int | None:
        return _hccl_int(entry[key], path, f"{field}.{key}") if key in entry else None

    def port(key: str) -> int | None:
        value = number(key)
        if value is not None and not 0 < value <= 65535:
            raise RankTableError(path, f"{field}.{key}", f"{value} is not a port number; expected 1..65535")
        return value

    return HcclDevice(
        device_id=_hccl_int(require(entry, "device_id", path, field), path, f"{field}.device_id"),
        rank_id=_hccl_int(require(entry, "rank_id", path, field), path, f"{field}.rank_id"),
        device_ip=optional_ipv4(entry, "device_ip", path, field, _hccl_str),
        device_port=port("device_port"),
        super_device_id=number("super_device_id"),
        backup_device_ip=optional_ipv4(entry, "backup_device_ip", path, field, _hccl_str),
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
            path, "super_pod_list", f'is only defined for version "1.2" (Atlas A3 super pods), not {describe(version)}'
        )
    pods: list[HcclSuperPod] = []
    member_of: dict[str, str] = {}
    for i, raw_pod in nonempty_list(top, "super_pod_list", path, "", "one object per super pod"):
        field = f"super_pod_list[{i}]"
        pod = as_object(raw_pod, path, field, 'an object with "super_pod_id" and "server_list"')
        pod_id = _hccl_str(require(pod, "super_pod_id", path, field), path, f"{field}.super_pod_id")
        members: list[str] = []
        for j, raw_member in nonempty_list(pod, "server_list", path, field, 'one {"server_id": ...} per server'):
            member_field = f"{field}.server_list[{j}]"
            member = as_object(raw_member, path, member_field, 'an object with "server_id"')
            server_id = _hccl_str(require(member, "server_id", path, member_field), path, f"{member_field}.server_id")
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
            path, field, f"{describe(value)} is not a string; every value in an HCCL rank table is a string"
        )
    return value


def _hccl_int(value: object, path: str, field: str) -> int:
    text = _hccl_str(value, path, field)
    if not INTEGER.fullmatch(text):
        raise RankTableError(
            path,
            field,
            f'{text!r} is not numeric; expected a numeric string such as "0" '
            "(every value in an HCCL rank table is a string)",
        )
    return non_negative(int(text), path, field)



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




class HcclFormat(RankTableFormat):
    """HCCL's rank-table format for ``xccl rank-table`` and ``xccl doctor``."""

    name = "hccl"
    description = "HCCL rank table (RANK_TABLE_FILE of CANN, versions 1.0 and 1.2)"
    can_generate = True
    default_output = "hccl_rank_table.json"

    def detect(self, data: Mapping[str, object]) -> bool:
        """An HCCL table lists its hosts under ``server_list``."""
        return "server_list" in data

    def parse(self, data: object, path: str, *, max_devices: int | None = None) -> HcclRankTable:
        """See :func:`parse_hccl`."""
        return parse_hccl(data, path, max_devices=max_devices)

    def summary(self, table: Any) -> list[str]:
        """The version, the ranks per server and each server's device ids."""
        servers = table.servers
        lines = [f"{table.path}: HCCL rank table, version {table.version}, {table.world_size()} ranks on "
                 f"{len(servers)} server{'s' if len(servers) != 1 else ''}"]
        for i, server in enumerate(servers):
            ranks = sorted(d.rank_id for d in server.devices)
            span = (f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
                    else ",".join(map(str, ranks)))
            lines.append(f"  server {server.server_id}: ranks {span}, device ids {','.join(map(str, table.device_ids(i)))}")
        return lines

    def add_generate_arguments(self, parser: argparse.ArgumentParser) -> None:
        """``--device-id`` (a JSON list of one server's device ids), ``--device-ip``, ``--server-id``."""
        parser.add_argument("--device-id", dest="device_id", required=True, metavar="JSON",
                            help="device ids of one server in rank order, as JSON, e.g. '[0,1,2,3]'")
        parser.add_argument("--device-ip", dest="device_ip", metavar="JSON", help="one IPv4 address per device")
        parser.add_argument("--server-id", dest="server_id", default="127.0.0.1", help="the server's name or IP")

    def generate(self, args: argparse.Namespace) -> dict[str, object]:
        """A single-server table for these options (:func:`generate_hccl`)."""
        try:
            ids = json.loads(args.device_id)
            ips = None if args.device_ip is None else json.loads(args.device_ip)
        except json.JSONDecodeError as exc:
            raise RankTableError("<--device-id>", "$", f"is not JSON ({exc.msg}); pass e.g. [0,1,2,3]") from exc
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise RankTableError("<--device-id>", "$", "expected a JSON list of integer device ids, e.g. [0,1,2,3]")
        return generate_hccl(ids, ips, server_id=args.server_id)
