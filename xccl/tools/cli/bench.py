"""``xccl bench``: nccl-tests-style bandwidth sweeps of any collective through xccl.

Options, columns and exit statuses (0; 1 when a rank fails or ``--plot`` lacks matplotlib; 2 for a configuration
that cannot run) are in docs/cli.md (``xccl bench``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any, name: str) -> None:
    """Register the subcommand (without importing torch: ``xccl --help`` stays fast)."""
    p = sub.add_parser(
        name, help="benchmark collectives through xccl (nccl-tests style), optionally against raw torch.distributed",
        description="Launch N local ranks, sweep message sizes and print size, count, dtype, time, algbw and "
        "busbw (nccl-tests' bus-bandwidth factors) per collective.")
    p.add_argument("--op", default="all_reduce", help="comma-separated collectives (e.g. all_reduce,all_to_all_v, "
                   "sendrecv for a send/recv ring), or 'all' (default all_reduce)")
    p.add_argument("--plugin", "--vendor", dest="plugin", default="auto",
                   help="xccl plugin (default auto: XCCL_VENDOR, else the accelerator, else cpu)")
    p.add_argument("--simulate", action="store_true", help="run the plugin's CPU simulation (vendor plugins)")
    p.add_argument("-n", "--nproc", type=int, default=2, help="local ranks to launch (default 2)")
    p.add_argument("-b", "--min-bytes", default="4", help="smallest message (default 4; K/M/G suffixes)")
    p.add_argument("-e", "--max-bytes", default="64M", help="largest message (default 64M)")
    p.add_argument("-f", "--factor", type=float, default=2.0, help="size step factor (default 2)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--iters", type=int, default=20, help="timed rounds per size, each calling every variant once "
                   "(default 20; with --time-per-size: the most)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size and variant (default 5)")
    p.add_argument("--batch", type=int, default=1,
                   help="calls per timed sample (default 1; raise it on GPUs, where a sync per call costs)")
    p.add_argument("--compare-raw", action="store_true",
                   help="also run plain torch.distributed, interleaved call by call, and add a ratio column")
    p.add_argument("--aa-control", action="store_true",
                   help="with --compare-raw: run the raw call twice per round and report their ratio beside xccl's "
                   "(an A/A control: how far the machine's noise alone moves a ratio), with 95%% confidence intervals")
    p.add_argument("--xccl-on-world", action="store_true",
                   help="with --compare-raw: run xccl's calls on its world instead of on the raw calls' group (two "
                   "communicators, whose difference on a loaded machine then enters the ratio)")
    p.add_argument("--passes", type=int, default=1,
                   help="sweep the sizes this many times, each pass running its share of the rounds, so that a burst "
                   "of load from elsewhere is spread over the sizes (default 1)")
    p.add_argument("--time-per-size", type=float, default=0.0, metavar="SECONDS",
                   help="run as many rounds per size as fit in SECONDS (at least --min-iters, at most --iters): many "
                   "for small, fast calls, few for large ones (default 0: exactly --iters)")
    p.add_argument("--min-iters", type=int, default=30,
                   help="with --time-per-size: the fewest rounds per size, however long its calls (default 30)")
    p.add_argument("--gap-us", type=float, default=0.0,
                   help="time each call as a training step issues it: after a barrier and this many microseconds of "
                   "idle (default 0: back to back, which fits a lower latency than a step pays)")
    p.add_argument("--gap-busy", action="store_true",
                   help="with --gap-us: compute during the gap (a busy loop, as a step's forward pass) instead of "
                   "sleeping")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="plot bus bandwidth against size (needs matplotlib)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="one-line progress counter on stderr (default: when stderr is a terminal)")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout in seconds (default 120)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate, launch the ranks, then write JSON and the plot."""
    from xccl.errors import XcclError
    from xccl.plugin._registry import default_registry
    from xccl.tools import _bench

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("xccl bench: --plot needs matplotlib, which is not installed: pip install 'xccl[plot]'", file=sys.stderr)
        return 1
    try:
        ops = _bench.OPS if args.op.strip() == "all" else tuple(o.strip() for o in args.op.split(",") if o.strip())
        same = ("plugin", "simulate", "nproc", "factor", "dtype", "iters", "warmup", "batch", "compare_raw", "passes",
                "time_per_size", "min_iters", "gap_us", "gap_busy", "timeout")  # options named as the fields
        cfg = _bench.BenchConfig(
            ops=ops, min_bytes=_bench.parse_size(args.min_bytes), max_bytes=_bench.parse_size(args.max_bytes),
            control=args.aa_control, same_group=not args.xccl_on_world,
            progress=sys.stderr.isatty() if args.progress is None else args.progress,
            **{name: getattr(args, name) for name in same},
        )
        cfg.check()
        if cfg.plugin != "auto":  # a plugin that cannot run here is refused before any rank is launched
            registry = default_registry()
            if not cfg.simulate:
                registry.select(cfg.plugin)
            elif registry.get(cfg.plugin).simulation() is None:
                raise _bench.BenchError(f"plugin {cfg.plugin!r} has no CPU simulation; run it on its hardware "
                                        "without --simulate")
    except (_bench.BenchError, XcclError) as exc:
        print(f"xccl bench: {exc}", file=sys.stderr)
        return 2
    try:
        doc = _bench.launch(cfg)
    except _bench.BenchError as exc:
        print(f"xccl bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"# wrote {path}")
    if args.plot:
        _bench.plot(doc, args.plot)
        print(f"# wrote {args.plot}")
    failed = [r["op"] for r in doc["results"] if r["error"]]
    return 1 if failed and len(failed) == len(doc["results"]) else 0
