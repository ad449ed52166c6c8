"""Hierarchical all_reduce on a mixed-vendor world against one flat gloo all_reduce over every rank.

A 2 + 2 world (2 simulated-Ascend and 2 simulated-Sophgo ranks, ``XCCL_HETEROGENEOUS=1``; docs/mixed.md): the
world group is xccl's mixed group, whose all_reduce is island reduce_scatter -> cross-island all_reduce of the
1/k shard among peers (gloo, host) -> island all_gather. The baseline is one gloo all_reduce over all four ranks
(what a job without islands would do over the host). Both run in the same processes, interleaved round by round
(the order alternates), 4 KiB to 64 MiB. A call's time is the slowest rank's; the table gives the median over
rounds and ``ratio`` = flat / hierarchical (above 1: the hierarchy is faster).

Bytes: ``cross/rank`` is what one rank puts into cross-island (host) collectives per call, counted by the mixed
group (``MixedProcessGroup.links``): the whole tensor for the flat all_reduce, 1/k of it (k = ranks per island)
for the hierarchy. ``wire`` models the bytes that cross between islands on the wire, for ring algorithms with the
ranks in island order: flat, 2 of the 4 ring edges cross, each carrying 2(n-1)/n x size; hierarchical, k peer
rings of I islands, each rank sending 2(I-1)/I x size/k.

In simulation both islands' "native" links are gloo over loopback too, so the times compare the compositions'
overheads, not an NPU link against a host link: on hardware the island parts run on HCCS / C2C at many times the
host link's bandwidth, and the cross-island bytes are what bounds the step.

Usage::

    python benchmarks/mixed.py                 # 4 KiB .. 64 MiB, 10 rounds
    python benchmarks/mixed.py --quick         # 4 KiB and 64 KiB, 2 rounds (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

from xccl.testing._pool import RankPool

# The bodies the ranks run are the tests' (tests/mixed_bodies.py); the ranks inherit this path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import mixed_bodies as B

RESULTS = Path(__file__).resolve().parent / "results" / "mixed.json"
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
RANK_ENV = {0: {"XCCL_SIMULATE": "ascend"}, 1: {"XCCL_SIMULATE": "ascend"},
            2: {"XCCL_SIMULATE": "sophgo"}, 3: {"XCCL_SIMULATE": "sophgo"}}
N, K, ISLANDS = 4, 2, 2


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _wire(name: str, nbytes: int) -> float:
    if name == "flat gloo":
        return 2 * (2 * (N - 1) / N * nbytes)
    return N * (2 * (ISLANDS - 1) / ISLANDS * nbytes / K)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two sizes, two rounds: a smoke run")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()
    sizes = [4 << 10, 64 << 10] if args.quick else SIZES
    iters, warmup = (2, 1) if args.quick else (args.iters, args.warmup)
    with RankPool(N, {"fallback": "emulate"}, env={"XCCL_HETEROGENEOUS": "1"}, rank_env=RANK_ENV,
                  start_method="forkserver") as pool:
        per_rank = pool.run_ok(B.time_all_reduce, sizes, warmup, iters, timeout=1800)
    rows = []
    print(f"all_reduce on 2 Ascend + 2 Sophgo simulated ranks ({platform.node()}, {os.cpu_count()} CPUs), "
          f"median of {iters} rounds, slowest rank")
    print(f"{'size':>8} {'variant':<13} {'median ms':>10} {'cross/rank':>11} {'wire (model)':>13} {'ratio':>6}")
    for nbytes in sizes:
        key = str(nbytes)
        med = {}
        for name in ("flat gloo", "hierarchical"):
            rounds = zip(*(r[key]["times"][name] for r in per_rank), strict=True)
            med[name] = statistics.median(max(ts) for ts in rounds)
        for name in ("flat gloo", "hierarchical"):
            cross = per_rank[0][key]["cross"][name]
            ratio = med["flat gloo"] / med[name]
            rows.append({"bytes": nbytes, "variant": name, "median_s": med[name], "cross_bytes_per_rank": cross,
                         "wire_cross_bytes_model": _wire(name, nbytes), "ratio_flat_over_this": ratio})
            print(f"{_size(nbytes):>8} {name:<13} {med[name] * 1e3:>10.3f} {_size(cross):>11} "
                  f"{_size(int(_wire(name, nbytes))):>13} {ratio:>6.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "iters": iters,
                                     "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
