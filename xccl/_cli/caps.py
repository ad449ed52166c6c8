"""``xccl caps [PLUGIN]``: the capability matrix."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(name, help="print the capability table of one plugin or all of them")
    p.add_argument("plugin", nargs="?", help="plugin name (default: every plugin that loads)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the table(s) as text."""
    import xccl

    names = [args.plugin] if args.plugin else [i.name for i in xccl.plugins() if i.plugin is not None]
    for name in names:
        table = xccl.capabilities(name)
        print(f"{name}:")
        for (op, mode), sup in table.items():
            if mode is xccl.Mode.EAGER:
                graph = table.entry(op, xccl.Mode.GRAPH)
                via = f" via {sup.via}" if sup.via else ""
                print(f"  {op.value:32} eager={sup.level.value}{via:24} graph={graph.level.value}")
    return 0
