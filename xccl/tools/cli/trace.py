"""``xccl trace DIR``: where every group's ranks stand in a directory of flight-recorder dumps, who is missing or
ahead, the call sites, and which rank makes the others wait (docs/cli.md, ``xccl trace``).

Exit status: 0 when every group completed every call it recorded; 1 when some group has a call not completed
everywhere (a hang or a fault); 2 when the directory holds no dumps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="analyse flight-recorder dumps: the stuck collective, missing ranks, stragglers",
        description="Read <prefix><rank> dumps (xccl.dump_trace(), or written at a fault; torch's flight-recorder "
        "layout) and print, per group, the last call every rank completed, the first one some rank did not, who "
        "never called it and who is ahead, with call sites, and the rank that entered last most often.",
    )
    p.add_argument("directory", help="the directory of dumps")
    p.add_argument("-p", "--prefix", default=None, help="file prefix before the rank (default: inferred)")
    p.add_argument("--window", type=int, default=100, help="calls per group for straggler attribution (last N)")
    p.add_argument("--json", default=None, help="also write the verdicts as JSON to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the verdicts; see the module's exit statuses."""
    from xccl.tools._trace import analyse, load, render

    try:
        dumps = load(args.directory, args.prefix)
    except (OSError, ValueError) as exc:
        print(f"xccl trace: {exc}", file=sys.stderr)
        return 2
    reports = analyse(dumps, window=args.window)
    print(render(reports))
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in reports], indent=2, default=str))
    return 1 if any(r.stuck_seq is not None for r in reports) else 0
