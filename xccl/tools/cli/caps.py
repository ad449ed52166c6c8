"""``xccl caps [PLUGIN ...] [--all] [--json | --markdown] [--mode eager|graph|both] [--group PLUGIN:N,...]``: the
capability matrix, or (``--group``) the derived table of a mixed-vendor group (``xccl.collectives._mixed``).

Which plugins it shows, how it wraps and what ``--json`` holds are in docs/cli.md (``xccl caps``); the rendering
lives in ``xccl.tools._render``, shared with ``scripts/gen_docs.py``. Exit status: 0; 2 when a named plugin does not
exist or fails to load (the message says which are installed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import textwrap
from typing import Any, Final

LOG = logging.getLogger("xccl")

#: The width of the text output when it does not go to a terminal (a pipe, a file, a CI log).
WIDTH: Final = 120


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        name,
        help="print the capability matrix of plugins x collectives x mode",
        description="Print which collectives each plugin runs natively, emulated (and via what) or not at all, "
        "in eager and graph mode.",
    )
    p.add_argument("plugin", nargs="*",
                   help="plugin names (default: xccl's own and the vendors' plugins; --all: every plugin that loads)")
    p.add_argument("--all", action="store_true",
                   help="every plugin that loads, test and example plugins included (--json and --markdown always "
                   "list them all)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="everything as JSON: levels, dtypes, reduce ops, notes")
    fmt.add_argument("--markdown", action="store_true", help="Markdown: the matrix and a detail table per plugin")
    p.add_argument("--mode", choices=("eager", "graph", "both"), default="both", help="which modes (default both)")
    p.add_argument("--group", metavar="PLUGIN:N,...",
                   help="the derived table of a mixed-vendor group with N ranks of each plugin, e.g. ascend:2,sophgo:2 "
                   "(docs/mixed.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the tables in the requested format."""
    from xccl.errors import BackendNotFound, BackendUnavailable
    from xccl.ops._torch import TORCH
    from xccl.plugin._registry import Status, plugins
    from xccl.tools import _render

    infos = {i.name: i for i in plugins()}
    if args.group:
        return _group(args.group, args.json)
    usable = {n: i for n, i in infos.items() if i.plugin is not None and i.status is not Status.INCOMPATIBLE}
    for name in args.plugin:
        if name not in usable:
            info = infos.get(name)
            exc = BackendNotFound(name, list(infos)) if info is None else BackendUnavailable(name, info.reason, info.fix)
            print(f"xccl caps: {exc}", file=sys.stderr)
            return 2
    chosen = [usable[name] for name in args.plugin] if args.plugin else list(usable.values())
    hidden: list[str] = []
    if not (args.plugin or args.all or args.json or args.markdown):
        hidden = [i.name for i in chosen if not shown_by_default(i)]
        chosen = [i for i in chosen if shown_by_default(i)]

    tables, about = {}, {}
    for info in chosen:
        try:
            table = info.plugin.capabilities()  # type: ignore[union-attr]
        except Exception as exc:  # listing is tolerant: report the broken plugin, show the rest
            LOG.debug("capabilities() of %s raised", info.name, exc_info=True)
            print(
                f"xccl caps: plugin {info.name!r}: capabilities() raised {type(exc).__name__}: {exc}", file=sys.stderr
            )
            if args.plugin:
                return 2
            continue
        tables[info.name] = table
        about[info.name] = _render.About.of(info.plugin)

    modes = _render.modes_from(args.mode)
    if args.json:
        text = json.dumps(_render.render_json(tables, modes, about=about), indent=2) + "\n"
    elif args.markdown:
        text = _render.render_markdown(tables, modes, about=about)
    else:
        width = _width(named=bool(args.plugin))
        text = _render.render_text(tables, modes, ascii_only=not _can_print(_render.DASH), width=width)
        text += "".join(
            f"{i.name}: not available here ({i.reason}); its table is shown all the same\n"
            for i in chosen
            if not i.available
        )
        if hidden:
            text += f"Not shown: {', '.join(hidden)} (xccl caps --all, or xccl caps NAME).\n"
        text += "".join(f"torch {TORCH.version}: {c.said()}\n" for c in TORCH.missing())
        text += "".join(f"{i.name}: no in-place shrink after a lost rank (dist.shrink_group refuses it; restart and "
                        f"resume): {i.plugin.vendor_runtime().no_shrink}\n"
                        for i in chosen if i.plugin is not None and i.plugin.vendor_runtime().no_shrink)
        if width is not None:
            text = _fit(text, width)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `xccl caps | head`: the reader left; say nothing more (and keep Python from complaining at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def shown_by_default(info: Any) -> bool:
    """Whether ``xccl caps`` without plugin names shows the plugin of ``info`` (a ``PluginInfo``): xccl's own plugins
    and every plugin for a device other than the CPU, i.e. a vendor's; not the test doubles and experiments on CPU
    tensors (docs/cli.md, ``xccl caps``)."""
    plugin = info.plugin
    if plugin is None:
        return False
    own = info.target.startswith("xccl.")  # an entry point into the xccl package itself: cpu, cuda
    return own or str(plugin.device_type) != "cpu"


def _width(*, named: bool) -> int | None:
    """The width to wrap the text to: the terminal's; else :data:`WIDTH`, except for plugins named on the command
    line, printed unwrapped (one line per collective, for scripts that read the text; ``None``)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None if named else WIDTH


def _fit(text: str, width: int) -> str:
    """``text`` with its prose lines longer than ``width`` wrapped: the legend, the notes (continued under their
    text, past the ``[n]``) and the closing remarks. The matrix is left alone: ``render_text`` wrapped it into
    blocks already, and only a single plugin's columns wider than ``width`` can overflow, which no wrapping helps."""
    out = []
    in_matrix = False
    for line in text.splitlines():
        if line.startswith("collective"):  # a block of the matrix, up to the next empty line
            in_matrix = True
        elif not line:
            in_matrix = False
        if in_matrix or len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip())
        marker = line.lstrip().split(" ", 1)[0]
        hang = lead + (len(marker) + 1 if marker.startswith("[") and marker.endswith("]") else 2)
        out += textwrap.wrap(line, width, subsequent_indent=" " * hang, break_long_words=False,
                             break_on_hyphens=False)
    return "\n".join(out) + "\n"


def _group(spec: str, as_json: bool) -> int:
    """``--group ascend:2,sophgo:2``: how each collective runs on a group spanning those islands."""
    from xccl.collectives._mixed import mixed_table
    from xccl.errors import XcclError
    from xccl.plugin._registry import default_registry

    sizes: dict[str, int] = {}
    try:
        for item in spec.split(","):
            name, _, count = item.strip().partition(":")
            sizes[name] = int(count or "1")
            if sizes[name] < 1:
                raise ValueError(item)
    except ValueError:
        print(f"xccl caps: --group {spec!r}: expected PLUGIN:N[,PLUGIN:N...] with N >= 1", file=sys.stderr)
        return 2
    try:
        tables = {name: default_registry().get(name).capabilities() for name in sizes}
    except XcclError as exc:
        print(f"xccl caps: {exc}", file=sys.stderr)
        return 2
    table = mixed_table(tables, sizes)
    if as_json:
        sys.stdout.write(json.dumps({"group": sizes, "ops": {op.value: how for op, how in table.items()}},
                                    indent=2) + "\n")
        return 0
    title = " + ".join(f"{n} {name}" for name, n in sizes.items())
    width = max(len(op.value) for op in table)
    sys.stdout.write(f"a mixed group of {title} (eager)\n" + "".join(
        f"{op.value:<{width}}  {how}\n" for op, how in table.items()))
    return 0


def _can_print(text: str) -> bool:
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
