"""``xccl new-plugin NAME``: a vendor plugin distribution, named for the vendor, passing the kit in simulation.

It writes ``./xccl-NAME`` (or ``-o DIR``) from the templates of :mod:`xccl.tools._scaffold`; the options and what a
shared backend name means are in docs/cli.md (``xccl new-plugin``). Exit status: 0; 2 for a bad name or option, or
an output directory that is not empty.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

LOG = logging.getLogger(__name__)


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
    p.add_argument("--bridge-picks-device", action="store_true",
                   help="the SDK's bridge chooses each process's device (it sees that one): setup_device takes the "
                   "current device instead of making device LOCAL_RANK current (Habana's habana_frameworks.torch)")
    p.add_argument("--rank-table", action="store_true",
                   help="write a stub rank-table format (RANK_TABLE_FILE) to adapt to the vendor's; without it the "
                   "plugin declares none")
    p.add_argument("-o", "--output", metavar="DIR", help="where to write (default: ./xccl-NAME); must not have files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate; print what was written and what to run next."""
    from xccl.tools._scaffold import names, write

    try:
        n = names(args.name, vendor=args.vendor, device_type=args.device_type, backend=args.backend, sdk=args.sdk,
                  sdk_dist=args.sdk_dist, visible_devices_env=args.visible_devices_env,
                  bridge_picks_device=args.bridge_picks_device, rank_table=args.rank_table)
        dest = Path(args.output or f"xccl-{n.name}")
        files = write(n, dest)
    except (ValueError, FileExistsError) as exc:
        print(f"xccl new-plugin: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} files to {dest}/ (plugin {n.name!r}, package {n.pkg}, backend {n.backend!r}, SDK {n.sdk})")
    if warning := _shared_backend(n.name, n.backend):
        print(f"xccl new-plugin: warning: {warning}", file=sys.stderr)
    print(f"next: pip install -e '{dest}[test]' && cd {dest} && pytest    # the conformance kit, simulated")
    return 0


def _shared_backend(name: str, backend: str) -> str:
    """The warning when an installed plugin other than ``name`` drives ``backend`` (empty when none does).

    Listing plugins never raises, but importing torch may (a broken backend extension): then there is nothing to
    say here, and ``xccl doctor`` says why.
    """
    try:
        from xccl.plugin._registry import default_registry
        from xccl.tools.cli.doctor_checks import consequence, xccl_drives

        infos = default_registry().infos().values()
    except Exception:  # the scaffold is written; a warning that cannot be computed is not an error
        LOG.debug("xccl new-plugin: listing the installed plugins failed", exc_info=True)
        return ""
    others = [i for i in infos if i.plugin is not None and i.plugin.backend == backend and i.name != name]
    if not others or xccl_drives(others):
        return ""  # gloo, nccl: xccl's own plugin adopts their worlds (and torch reserves those names anyway)
    drivers = ", ".join(f"{i.name} ({i.distribution or 'no distribution'})" for i in others)
    return (f"backend {backend!r} is also driven by the installed plugin(s) {drivers}; "
            + consequence(backend, [name, *(i.name for i in others)]))
