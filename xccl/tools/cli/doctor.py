"""``xccl doctor [--vendor NAME] [--json] [--world [--timeout S]]``: what is wrong with this node, and how to fix it.

The first command to run on a broken node; docs/cli.md (``xccl doctor``) lists what it reports, section by
section, and what ``--world`` compares. Exit status: 0 when the selected plugin can work here; 1 when it cannot, or
when a check found something that makes ``xccl.init`` fail (a bad variable, an invalid rank table, ``import torch``
failing). Warnings do not change the status. Doctor never imports a vendor SDK: vendor knowledge comes from the
plugins' probes and package metadata.

The checks live in ``doctor_checks`` (what is installed), ``doctor_node`` (what the environment tells this rank, and
the selected vendor's run-time behaviour); ``--world`` in ``doctor_facts`` and ``doctor_world``; ``doctor_model``
holds :class:`Finding` and :class:`Report`.

If ``xccl doctor`` itself dies in ``import torch`` with "Failed to load the backend extension", run it as
``TORCH_DEVICE_BACKEND_AUTOLOAD=0 xccl doctor``: it then says why and how to fix it for good.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import TYPE_CHECKING, Any, Final

from .doctor_model import DEFAULT_TIMEOUT, Finding, Report, render

__all__ = ["Finding", "Report", "add_parser", "autoload_failure", "collect", "render", "run"]

#: Names re-exported from modules that import xccl (and so torch), loaded on first use: the parser is built for
#: every ``xccl`` command, ``--help`` included, and must not import torch.
_LAZY: Final = {"autoload_failure": "doctor_checks", "collect": "doctor_checks"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .doctor_checks import autoload_failure, collect


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="diagnose this node (or, with --world, every rank of a job): torch, vendor packages, plugins, devices, "
        "rank table, rendezvous",
        description="Diagnose this node for xccl: torch and its autoloaded extensions, vendor packages, every "
        "plugin and why it is (not) available, the plugin xccl.init would select, visible-devices variables, the "
        "rank table and the rendezvous variables. Exit status 1 when the selected plugin cannot work here. With "
        "--world, run on every rank by the launcher (torchrun ... --no-python xccl doctor --world): rank 0 prints "
        "every rank's findings by host and what differs between them; exit status 1 when a difference is flagged.",
    )
    p.add_argument("--vendor", help="the plugin to judge (default: XCCL_VENDOR / XCCL_SIMULATE, else auto)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--world", action="store_true",
                   help="compare every rank of a job (run on every rank, under torchrun); rank 0 prints")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"with --world: how long rank 0 waits for every rank to answer (default {DEFAULT_TIMEOUT:g})")
    hour = p.add_argument_group("the first hour on new hardware (docs/elastic.md): lose a rank and recover, on this node")
    hour.add_argument("--first-hour", action="store_true",
                      help="run the lost-rank checks only the hardware can answer (three rounds of --ranks local "
                      "ranks) and write a report to send back")
    hour.add_argument("--simulate", action="store_true", help="with --first-hour: on xccl's simulation of --vendor")
    hour.add_argument("--ranks", type=int, default=4, help="ranks (devices) to use (default 4)")
    hour.add_argument("--lose", type=int, default=1, help="the rank that ends (default 1: not the last)")
    hour.add_argument("--bound", type=_seconds, default=120.0, metavar="SECONDS",
                      help="how long a survivor waits to hear of the loss (default 120)")
    hour.add_argument("--alive-after", type=float, default=90.0, metavar="SECONDS",
                      help="how long the survivors live on before the shrink (default 90)")
    hour.add_argument("--report", default="xccl-first-hour.json", help="where to write the report (JSON)")
    p.set_defaults(func=run)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a positive number of seconds")
    return value


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 when the selected plugin can work (with ``--world``: when every rank agrees), else 1."""
    from .doctor_checks import collect
    from .doctor_world import run_world

    if args.world:
        return run_world(vendor=args.vendor, timeout=args.timeout, as_json=args.json)
    if args.first_hour:
        return _first_hour(args)
    report = collect(vendor=args.vendor)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    return 0 if report.ok else 1


def _first_hour(args: argparse.Namespace) -> int:
    """``--first-hour``: the rounds, the report written and printed; 2 when no vendor is named."""
    import os
    from pathlib import Path

    from .doctor_first_hour import first_hour, render_hour

    vendor = args.vendor or os.environ.get("XCCL_SIMULATE" if args.simulate else "XCCL_VENDOR", "")
    if not vendor or not 0 <= args.lose < args.ranks:
        print("xccl doctor --first-hour needs --vendor (or XCCL_VENDOR; with --simulate, XCCL_SIMULATE) and a --lose "
              "rank below --ranks")
        return 2
    result = first_hour(vendor, simulate=args.simulate, world=args.ranks, victim=args.lose, bound=args.bound,
                        alive_after=args.alive_after, report=Path(args.report))
    print(json.dumps(result, indent=2) if args.json else render_hour(result))
    print(f"report: {args.report}")
    return 0
