"""``xccl preflight``: run a training script, unmodified, as every rank of a world on a vendor's simulation, and
report every collective it issued by call site: native, emulated (by what) or unsupported (the typed error the
hardware run would raise), with its predicted time on the vendor's hardware.

Options and exit statuses: docs/cli.md (``xccl preflight``); the walk-through: docs/preflight.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="will this script run on vendor V at world size N, and what will its communication cost?",
        description="Run `python ARGS` (a script or -m module, unmodified) as every rank of a world of N on the "
        "vendor's CPU simulation, and report each collective by the script's call site: op, group, dtype, bytes, "
        "calls, native / emulated / unsupported, and its predicted time from the vendor's cost model.",
    )
    p.add_argument("--vendor", required=True, help="the plugin to check against (sophgo, ascend, cpu...)")
    p.add_argument("--world", type=int, required=True,
                   help="the number of ranks (mode real: every one a process, at most 8; mode fake: any)")
    p.add_argument("--mode", choices=("real", "fake", "auto"), default="auto",
                   help="real: every rank a process; fake: a few ranks, each playing its rank of the world alone "
                   "without communicating; auto (default): real up to 8 ranks, fake above")
    p.add_argument("--ranks", type=_ranks, default=None, metavar="R,R...",
                   help="the ranks a fake world plays (default: the first and the last, e.g. 0,63)")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes the world spans, ranks laid out node by node (default: as few as the vendor's "
                   "simulated node holds, world / devices per node rounded up, e.g. 8 for 64 ranks on Sophgo)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds the run may take (default 300)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON to FILE")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write the report as one self-contained HTML page with its charts to FILE")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also plot the per-rank breakdown by op and by group to FILE (needs matplotlib: "
                   "pip install 'xccl[plot]')")
    p.add_argument("--calibrate", action="append", default=[], metavar="FILE",
                   help="price calls with figures fitted to FILE, measured inside one node: `xccl bench --json` "
                   "output, an nccl-tests log or an HCCL Test log (repeatable; overrides the plugin's figures op by op)")
    p.add_argument("--calibrate-inter", action="append", default=[], metavar="FILE",
                   help="as --calibrate, for measurements across nodes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ARGS, or -- python -m module ARGS")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the preflight and print its report; 0 when it runs on the vendor, 1 when not, 2 for a bad request."""
    from xccl.errors import XcclError
    from xccl.tools._preflight import preflight
    from xccl.tools._preflight_report import render

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        if args.png:
            from xccl.tools._preflight_charts import require_matplotlib

            require_matplotlib("--png")  # before the script runs: a missing extra costs seconds, not a preflight
        model = _calibrated(args.vendor, args.calibrate, args.calibrate_inter)
        report = preflight(args.vendor, args.world, command, nodes=args.nodes, timeout=args.timeout,
                           cost_model=model, mode=args.mode, ranks=args.ranks)
    except XcclError as exc:
        print(f"xccl preflight: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2, default=str), encoding="utf-8")
    if args.html:
        Path(args.html).write_text(report.html(), encoding="utf-8")
    if args.png:
        report.png(args.png)
    return report.exit_code


def _ranks(text: str) -> list[int]:
    """``--ranks 0,63``."""
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ranks separated by commas, e.g. 0,63") from None


def _calibrated(vendor: str, intra: list[str], inter: list[str]) -> Any:
    """The plugin's cost model, with the figures fitted to the ``--calibrate`` files in place of its own."""
    if not intra and not inter:
        return "plugin"
    from xccl.plugin._registry import default_registry
    from xccl.tools._cost_fit import calibrate

    model = default_registry().get(vendor).cost_model()
    generation = f"{model.generation if model is not None else vendor}, calibrated"
    for paths, intra_node in ((intra, True), (inter, False)):
        for path in paths:
            model = calibrate(path, generation=generation, intra_node=intra_node, base=model)
    return model
