"""``xccl rank-table``: generate a rank table of any installed plugin's format (``Plugin.rank_table_formats``),
or validate any rank table (docs/cli.md, ``xccl rank-table``): ``validate`` prints a summary, or the
:class:`~xccl.RankTableError` (file, JSON path of the field, problem) and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["add_parser", "installed_formats", "run"]


def installed_formats() -> list[Any]:
    """The rank-table formats of every installed plugin that loads (tolerant: a broken plugin brings none)."""
    from xccl.plugin._registry import plugins

    formats = []
    for info in plugins():
        if info.plugin is None:
            continue
        try:
            formats += list(info.plugin.rank_table_formats())
        except Exception:  # a plugin's hook failing must not hide the other formats
            continue
    return formats


def add_parser(sub: Any, name: str) -> None:
    """Register ``rank-table``: ``validate``, and one generator per installed format that has one.

    The formats come from the plugins, and loading a plugin imports torch, which the parser of every ``xccl``
    command (``--help`` included) must not do. So ``rank-table`` takes ``ACTION ...`` here, and
    :func:`_action_parser`, built once ``rank-table`` is chosen, parses them.
    """
    p = sub.add_parser(
        name,
        help="generate a rank table of an installed plugin's format, or validate one",
        description="Generate a rank table of an installed plugin's format (`xccl rank-table FORMAT --help` for its "
        "options), or validate a rank table of any installed format (`xccl rank-table validate FILE`).",
    )
    p.add_argument("action", metavar="ACTION",
                   help="validate, or the format to generate (an installed plugin's: sophgo, hccl, ...; a name that "
                   "is none lists them)")
    p.add_argument("arguments", nargs=argparse.REMAINDER, metavar="...", help="the action's arguments")
    p.set_defaults(func=_dispatch, action_prog=p.prog)


def _action_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of ``rank-table``'s actions: ``validate``, and a generator per installed format that has one."""
    parser = argparse.ArgumentParser(prog=prog)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for fmt in installed_formats():
        if not fmt.can_generate:
            continue
        gen = actions.add_parser(fmt.name, help=f"write a {fmt.description}")
        fmt.add_generate_arguments(gen)
        gen.add_argument("-o", "--output", metavar="FILE",
                         help=f"output file (default: $RANK_TABLE_FILE, else ./{fmt.default_output})")
        gen.set_defaults(func=run, format=fmt)
    val = actions.add_parser("validate", help="check a rank table of any installed format and summarise it")
    val.add_argument("file", help="the rank table (JSON)")
    val.add_argument("--max-devices", type=int, metavar="N",
                     help="devices per node/server; every device_id must be below N")
    val.set_defaults(func=run, format=None)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    """Parse the action and its arguments now that the plugins may be loaded, then run it."""
    return run(_action_parser(args.action_prog).parse_args([args.action, *args.arguments]))


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; 0 on success, 1 (message on stderr) on a rank-table error."""
    from xccl.errors import RankTableError

    try:
        return _validate(args) if args.format is None else _generate(args)
    except RankTableError as exc:
        print(f"xccl rank-table: error: {exc}", file=sys.stderr)
        return 1


def _generate(args: argparse.Namespace) -> int:
    from xccl.errors import RankTableError
    from xccl.plugin import dump

    fmt = args.format
    table = fmt.generate(args)
    out = args.output or os.environ.get("RANK_TABLE_FILE", "").strip() or fmt.default_output
    # Read back through the parser: what is written is exactly what `validate` and xccl.init accept.
    parsed = fmt.parse(table, out)
    try:
        dump(table, out)
    except OSError as exc:
        raise RankTableError(out, "$", f"cannot write the file: {exc.strerror or exc}") from exc
    lines = fmt.summary(parsed)
    print(f"wrote {out}: {lines[0].split(': ', 1)[-1]}" if lines else f"wrote {out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from xccl.plugin import load_rank_table

    fmt, table = load_rank_table(args.file, installed_formats(), max_devices=args.max_devices)
    print("\n".join(fmt.summary(table)))
    return 0
