"""The ``xccl`` command (also ``python -m xccl``): demo, caps, doctor, rank-table, bench, new-plugin,
trace, preflight.

Each subcommand lives in its own module under ``xccl/tools/cli/`` with ``add_parser(subparsers, name)`` registering
``func=run``; this file only wires them. The console script itself is the ``xccl_cli`` shim at the top level,
which prepares the environment for ``doctor`` before anything imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: subcommand -> module under xccl.tools.cli implementing it.
COMMANDS = {
    "demo": "demo",
    "caps": "caps",
    "doctor": "doctor",
    "rank-table": "ranktable",
    "bench": "bench",
    "new-plugin": "new_plugin",
    "trace": "trace",
    "preflight": "preflight",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="xccl", description="vendor-neutral collective communication")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, mod in COMMANDS.items():
        importlib.import_module(f"xccl.tools.cli.{mod}").add_parser(sub, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``xccl`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
