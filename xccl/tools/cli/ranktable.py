"""``xccl rank-table``: generate a Sophgo rank table, or validate any rank table.

``xccl rank-table sophgo --device-id '[[0,1,2,3,4,5,6,7]]' [--device-ip JSON] [--emulator] [-o FILE]`` does what
Sophgo's ``tpu_gen_sccl_rank_table`` does, but takes JSON (not a Python literal) and writes atomically; the output
goes to ``-o``, else ``$RANK_TABLE_FILE``, else ``./sccl_rank_table.json``, as Sophgo's tool.

``xccl rank-table validate FILE [--max-devices N]`` recognises Sophgo and HCCL tables and prints a summary, or
the :class:`~xccl.RankTableError` (file, JSON path of the field, problem) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["add_parser", "run"]

#: Where the table goes without ``-o`` or ``RANK_TABLE_FILE`` (Sophgo's default).
DEFAULT_OUTPUT = "sccl_rank_table.json"


def add_parser(sub: Any, name: str) -> None:
    """Register ``rank-table`` and its two actions."""
    p = sub.add_parser(name, help="generate a Sophgo rank table, or validate a Sophgo/HCCL rank table")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    gen = actions.add_parser("sophgo", help="write a Sophgo (SCCL) rank table, like tpu_gen_sccl_rank_table")
    gen.add_argument("--device-id", "--device_id", dest="device_id", required=True, metavar="JSON",
                     help="device ids per node as JSON, e.g. '[[0,1,2,3,4,5,6,7]]' (one list per node)")
    gen.add_argument("--device-ip", "--device_ip", dest="device_ip", metavar="JSON",
                     help="device IPv4 addresses per node as JSON, same shape (default: 127.0.0.1 everywhere)")
    gen.add_argument("--emulator", action="store_true", help="write device_ip_emulator instead of device_ip")
    gen.add_argument("-o", "--output", metavar="FILE",
                     help=f"output file (default: $RANK_TABLE_FILE, else ./{DEFAULT_OUTPUT})")
    gen.set_defaults(func=run)

    val = actions.add_parser("validate", help="check a Sophgo or HCCL rank table and summarise it")
    val.add_argument("file", help="the rank table (JSON)")
    val.add_argument("--max-devices", type=int, metavar="N",
                     help="devices per node/server; every device_id must be below N")
    val.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; 0 on success, 1 (message on stderr) on a rank-table error."""
    from xccl.errors import RankTableError

    try:
        return _generate(args) if args.action == "sophgo" else _validate(args)
    except RankTableError as exc:
        print(f"xccl rank-table: error: {exc}", file=sys.stderr)
        return 1


def _generate(args: argparse.Namespace) -> int:
    from xccl.plugin import _ranktable as rt

    ids = rt.parse_device_id_arg(args.device_id)
    ips = None if args.device_ip is None else _device_ips(args.device_ip)
    table = rt.generate_sophgo(ids, ips, emulator=args.emulator)
    out = args.output or os.environ.get("RANK_TABLE_FILE", "").strip() or DEFAULT_OUTPUT
    # Read back through the parser: what is written is exactly what `validate` and xccl.init accept.
    rt.parse_sophgo(table, out)
    try:
        rt.dump(table, out)
    except OSError as exc:
        from xccl.errors import RankTableError

        raise RankTableError(out, "$", f"cannot write the file: {exc.strerror or exc}") from exc
    ranks = sum(len(node) for node in ids)
    print(f"wrote {out}: {ranks} ranks on {len(ids)} node{'s' if len(ids) != 1 else ''}")
    return 0


def _device_ips(text: str) -> list[list[str]]:
    from xccl.errors import RankTableError

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankTableError("<--device-ip>", "$", f"{text!r} is not JSON ({exc.msg} at column {exc.colno}); "
                             'pass JSON, e.g. [["192.168.1.8","192.168.1.9"]]') from exc
    if not isinstance(data, list) or not all(isinstance(node, list) for node in data):
        raise RankTableError("<--device-ip>", "$", "expected a list of lists of IPv4 addresses, one list per node")
    return data


def _validate(args: argparse.Namespace) -> int:
    from xccl.plugin import _ranktable as rt

    table = rt.load_rank_table(args.file, max_devices=args.max_devices)
    if isinstance(table, rt.SophgoRankTable):
        print(f"{table.path}: Sophgo rank table, version {table.version}, {table.world_size()} ranks on "
              f"{len(table.nodes)} node{'s' if len(table.nodes) != 1 else ''}")
        for i, node in enumerate(table.nodes):
            chips = ",".join(map(str, table.chip_map(i)))
            print(f"  node {i}: ranks {_span(d.rank for d in node.devices)}, chip map {chips}")
        return 0
    print(f"{table.path}: HCCL rank table, version {table.version}, {table.world_size()} ranks on "
          f"{len(table.servers)} server{'s' if len(table.servers) != 1 else ''}")
    for i, server in enumerate(table.servers):
        ids = ",".join(map(str, table.device_ids(i)))
        print(f"  server {server.server_id}: ranks {_span(d.rank_id for d in server.devices)}, device ids {ids}")
    return 0


def _span(ranks: Iterable[int]) -> str:
    """``0..7`` for a contiguous run, else the ranks listed: ``0,2,4``."""
    ordered = sorted(ranks)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return ",".join(map(str, ordered))
