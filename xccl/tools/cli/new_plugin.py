"""``xccl new-plugin NAME``: a vendor plugin distribution, named for the vendor, passing the kit in simulation.

It writes ``./xccl-NAME`` (or ``-o DIR``): the entry point, a cheap probe, a lazy SDK boundary raising
``BackendUnavailable`` with what is missing and the fix, device setup, a capability table, a simulation profile,
the vendor's run-time behaviour, a rank-table format, the conformance test and a README. Then::

    pip install -e "./xccl-acme[test]" && (cd xccl-acme && pytest)

Exit status: 0; 2 for a bad name or option, or an output directory that is not empty.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="generate a vendor plugin distribution that passes the conformance kit in simulation",
        description="Write a plugin distribution for a vendor: SDK boundary, probe, device setup, capability table, "
        "simulation profile, run-time behaviour, rank table, conformance test, README; all named for the vendor. "
        "Options not given derive from NAME.",
    )
    p.add_argument("name", help="the plugin's name, what users pass to xccl.init(vendor=...), e.g. acme")
    p.add_argument("--vendor", help='the vendor, for humans (e.g. "Acme Corp"; default: Name)')
    p.add_argument("--device-type", help="torch device type of the tensors (default: NAME)")
    p.add_argument("--backend", help="the torch.distributed backend the SDK registers (default: NAMEcl)")
    p.add_argument("--sdk", help="the SDK's import name (default: torch_NAME)")
    p.add_argument("--sdk-dist", help="the SDK's distribution, what pip installs (default: SDK with - for _)")
    p.add_argument("--visible-devices-env", help="the variable restricting visible devices (default: NAME_VISIBLE_DEVICES)")
    p.add_argument("-o", "--output", metavar="DIR", help="where to write (default: ./xccl-NAME); must not have files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate; print what was written and what to run next."""
    from xccl.tools._scaffold import names, write

    try:
        n = names(args.name, vendor=args.vendor, device_type=args.device_type, backend=args.backend, sdk=args.sdk,
                  sdk_dist=args.sdk_dist, visible_devices_env=args.visible_devices_env)
        dest = Path(args.output or f"xccl-{n.name}")
        files = write(n, dest)
    except (ValueError, FileExistsError) as exc:
        print(f"xccl new-plugin: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} files to {dest}/ (plugin {n.name!r}, package {n.pkg}, backend {n.backend!r}, SDK {n.sdk})")
    print(f"next: pip install -e '{dest}[test]' && cd {dest} && pytest    # the conformance kit, simulated")
    return 0
