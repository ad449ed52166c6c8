"""What a native lane in C++ would cost: ``dist.all_reduce`` through a prototype C++ backend, against xccl's group.

Issue 29 asks that ``torch.distributed`` calls on xccl's group cost at most 1 µs over the vendor's own group, and
``xccl.*`` calls 0.95 of raw NCCL's speed. xccl's group is a Python ``ProcessGroup``: every call from torch crosses
into Python and back, and xccl's pipeline (plan, recorder, tool view, typed faults) runs there, a few microseconds
that cost several times that between two busy processes (``benchmarks/flight_recorder.py --calibrate``). The way
out the issue names is the vendor's own C++ doing the rest once the plan allowed a call. This script measures that
design before anyone builds it: ``benchmarks/native_lane.cpp`` is a c10d ``Backend`` in C++ (a prototype, not part
of xccl, compiled here with ``torch.utils.cpp_extension``) in front of the very backend xccl's world wraps. An
allowed call (one float32 tensor, SUM) goes straight to the vendor's backend; the recording variant first notes it
in a ring of C++ structs with the user's frame, as xccl's flight recorder records it; anything else calls xccl's
own path in Python.

Variants, interleaved round by round in one process per rank (1-element float32 all_reduce):

* ``vendor``: torch's ``ProcessGroup`` over xccl's vendor backend (the reference, as in ``overhead.py``);
* ``vendor again``: the same, an A/A control;
* ``dist on xccl``: ``dist.all_reduce`` on xccl's world (today's path);
* ``lane``: a ``ProcessGroup`` whose backend is the prototype, recording nothing;
* ``lane, recorded``: the same, each call noted in the C++ ring with the user's frame.

Before timing, it checks what the lane does: a recorded call names this script's line, and an int64 all_reduce
(not allowed) takes xccl's Python path through the lane and sums right. Without a C++ compiler (or ninja) it says
so and exits 0 (a compile error is an error): the prototype is evidence for a design decision, not something xccl
needs.

Usage: ``python benchmarks/native_lane.py [--world 1|2] [--rounds 40] [--calls 200] [--json PATH] [--quick]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

VARIANTS = ("vendor", "vendor again", "dist on xccl", "lane", "lane, recorded")
SOURCE = Path(__file__).resolve().with_suffix(".cpp")


def _build_dir() -> Path:
    """One build per version of the source, under the system's temporary directory (nothing in the user's cache)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"xccl-native-lane-{digest}"
    path.mkdir(exist_ok=True)
    return path


def _tools_on_path() -> None:
    """Put this interpreter's directory first on PATH, once: pip's ninja lies there, and it need not be on PATH."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != here:
        os.environ["PATH"] = os.pathsep.join([here, path])


def _missing() -> str | None:
    """What this machine lacks to build the prototype, or None."""
    from torch.utils import cpp_extension

    _tools_on_path()
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (c++ on PATH, or CXX)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h)"
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "no ninja (pip install ninja)"
    return None


def _load() -> Any:
    """The prototype's module (built on first use: about 30 s on 2 cores)."""
    from torch.utils import cpp_extension

    _tools_on_path()  # in a rank too (inherited from the parent already: then nothing to do)
    return cpp_extension.load(name="xccl_native_lane", sources=[str(SOURCE)], extra_cflags=["-O2"],
                              build_directory=str(_build_dir()), verbose=False)


def body(rounds: int, calls_per_round: int) -> dict[str, Any]:
    """One rank's run (in a rank of ``xccl.testing.RankPool``: xccl's world initialised)."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

    from xccl.collectives._groups import state_of
    from xccl.ops._warn import internal

    lane_module = _load()
    rank, world = dist.get_rank(), dist.get_world_size()
    native = state_of(None).native
    world_pg = dist.group.WORLD
    assert world_pg is not None
    cpu = torch.device("cpu")

    def group_over(backend: Any, kind: Any) -> Any:
        pg = dist.ProcessGroup(dist.HashStore(), rank, world)
        pg._register_backend(cpu, kind, backend)
        pg._set_default_backend(kind)
        return pg

    def slow(tensors: list[torch.Tensor], opts: Any) -> Any:
        """xccl's own path, for what the lane does not allow: a work for C++ (xccl's group returns None once a
        synchronous call has run)."""
        work = world_pg.allreduce(tensors, opts)
        if work is None:
            done: torch.futures.Future[Any] = torch.futures.Future()
            done.set_result(tensors)
            work = _create_work_from_future(done)
        return work

    def lane(record: bool) -> Any:
        backend = lane_module.Lane(rank, world, native, slow, internal)
        backend.allow(6, True)  # c10::ScalarType::Float
        backend.record = record
        return backend

    custom = dist.ProcessGroup.BackendType.CUSTOM
    lanes = {"lane": lane(False), "lane, recorded": lane(True)}
    groups = {"vendor": group_over(native, dist.ProcessGroup.BackendType.GLOO), "dist on xccl": None,
              **{name: group_over(backend, custom) for name, backend in lanes.items()}}
    groups["vendor again"] = groups["vendor"]
    one = torch.ones(1)
    calls: dict[str, Any] = {v: (lambda g=groups[v]: dist.all_reduce(one, group=g)) for v in VARIANTS}

    # What the lane does, checked before it is timed.
    dist.all_reduce(one, group=groups["lane, recorded"]); line = sys._getframe().f_lineno  # noqa: E702
    seq, _dtype, numel, _created, code, lasti = lanes["lane, recorded"].last()
    found = None if code is None else next((n for s, e, n in code.co_lines() if s <= lasti < e), None)
    ints = torch.full((3,), rank + 1, dtype=torch.int64)
    dist.all_reduce(ints, group=groups["lane"])  # int64: not allowed, xccl's path
    checks = {"recorded_call_site": f"{Path(code.co_filename).name}:{found}" if code is not None else None,
              "recorded_call_site_right": code is not None and code.co_filename == __file__ and found == line,
              "recorded_numel": numel, "recorded_seq": seq,
              "fallback_sum_right": ints.tolist() == [world * (world + 1) // 2] * 3}
    one.fill_(1)

    for fn in calls.values():
        for _ in range(20):
            fn()
    other = dist.new_group(backend="gloo") if world > 1 else None
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            if other is not None:
                dist.barrier(group=other)
            fn = calls[v]
            t0 = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            times[v].append((time.perf_counter() - t0) / calls_per_round)
    if other is not None:
        dist.barrier(group=other)
    return {"times": times, "checks": checks}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from xccl.testing import RankPool

    with RankPool(args.world, {"vendor": "cpu"}, start_method="spawn") as pool:
        res = pool.run_ok(body, args.rounds, args.calls, timeout=1800)[0]
    times = res["times"]
    base = times["vendor"]
    return {
        "world_size": args.world,
        "tensor": "1 x float32",
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "checks": res["checks"],
        "median_us": {v: statistics.median(times[v]) * 1e6 for v in VARIANTS},
        "ratio_to_vendor": {v: statistics.median(x / b for x, b in zip(times[v], base, strict=True)) for v in VARIANTS},
        "over_vendor_us": {v: statistics.median((x - b) * 1e6 for x, b in zip(times[v], base, strict=True))
                           for v in VARIANTS},
        "torch": torch.__version__,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=1, choices=(1, 2))
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default="benchmarks/results/native_lane.json")
    p.add_argument("--quick", action="store_true", help="2 rounds of 10 calls: a smoke run (tests)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.calls = 2, 10
    missing = _missing()
    if missing is not None:
        print(f"native_lane.py: skipped: the prototype cannot be built here: {missing}")
        return 0
    t0 = time.perf_counter()
    _load()  # built once here (a compile error is an error), loaded by the ranks
    built = time.perf_counter() - t0
    out = measure(args)
    out["build_or_load_s"] = built
    print(f"all_reduce on cpu, world of {args.world}, {out['tensor']}, {args.rounds} rounds of {args.calls} calls "
          f"(the prototype built or loaded in {built:.1f} s)")
    print(f"checks: a recorded call names {out['checks']['recorded_call_site']} "
          f"({'right' if out['checks']['recorded_call_site_right'] else 'WRONG'}); an int64 call through the lane "
          f"took xccl's path and summed {'right' if out['checks']['fallback_sum_right'] else 'WRONG'}")
    print(f"{'variant':<16}{'median per call':>18}{'ratio to vendor':>16}{'over vendor':>14}")
    for v in VARIANTS:
        print(f"{v:<16}{out['median_us'][v]:>15.2f} us{out['ratio_to_vendor'][v]:>16.3f}"
              f"{out['over_vendor_us'][v]:>11.2f} us")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    ok = out["checks"]["recorded_call_site_right"] and out["checks"]["fallback_sum_right"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
