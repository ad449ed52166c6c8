"""Interpreter exit with a world left alive: xccl tears down a world on its backend before Python finalizes.

A process group still alive when the interpreter finalizes is destroyed by module teardown or the last garbage
collection, after Python has started refusing threads the GIL; gloo's worker threads (the simulations' kernels)
may need it then, and the process dies with SIGABRT ("terminate called without an active exception") after the
job's work is done. CI saw it now and then with Lightning under torchrun on simulated Sophgo, whose scripts never
call ``destroy_process_group``. xccl's atexit handler destroys the world first; atexit handlers run before
finalization, in reverse order of registration, so a handler each rank registers *before* the world exists runs
after xccl's and sees what it left. Each case runs in real processes (2 ranks) that exit normally:
multiprocessing's children leave through ``os._exit`` and never run atexit handlers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from xccl.testing import free_port

SCRIPT = textwrap.dedent("""
    import atexit, json, os, sys
    out, case, vendor = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = int(os.environ["RANK"])
    after_shutdown = None

    def threads():  # the names of this process's threads (torch's pt_*, gloo's gloo_*, Python's as "python")
        return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]

    def after_xccl():  # registered before xccl's handler: runs after it
        import torch.distributed as dist
        gloo = threads().count("pt_gloo_runloop")  # gloo's worker threads: a group's, alive until it is freed
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"initialized_at_exit": dist.is_initialized(), "gloo_threads": gloo,
                       "after_shutdown": after_shutdown}, f)

    atexit.register(after_xccl)

    import torch
    import torch.distributed as dist
    import xccl

    if case == "framework":  # Lightning's way: the framework creates the world on xccl's backend, never destroys it
        dist.init_process_group(xccl.process_group_backend("sophgo", simulate=True))
    elif case == "framework_then_init":  # the same world, adopted by xccl.init afterwards
        dist.init_process_group(xccl.process_group_backend("sophgo", simulate=True))
        xccl.init(fallback="emulate")
    elif case in ("init", "shutdown") and vendor == "mixed":  # 2 simulated Ascend + 2 simulated Sophgo ranks
        xccl.init("ascend" if rank < 2 else "sophgo", simulate=True, heterogeneous=True)
    elif case in ("init", "shutdown"):
        xccl.init(vendor, simulate=vendor != "cpu" or None)
    elif case == "gloo_adopted":  # the user's own gloo world: left to its creator
        dist.init_process_group("gloo")
        xccl.init()
    # Imported after init (torch._dynamo imports it: the first optimizer made does), it pins the world group in its
    # functions' defaults (group=group.WORLD); the world must be freed all the same.
    import torch.distributed.nn
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()
    dist.all_reduce(torch.ones(3))
    dist.barrier()  # a simulated barrier's work completes at once, gloo's a little later
    work = dist.all_reduce(torch.ones(1 << 12), async_op=True)  # issued last, never waited on
    if case == "shutdown":  # the job's objects gone, as when a training function returns: the world goes at shutdown
        work.wait()
        del model, work
        xccl.shutdown()
        import threading  # what is left running: threads of torch's (pt_*), gloo's (gloo_*) or xccl's (Python)
        after_shutdown = sorted([t for t in threads() if t.startswith(("pt_", "gloo_"))] +
                                [t.name for t in threading.enumerate() if t is not threading.main_thread()])
    print(f"rank {rank} done", flush=True)
""")


def _run(case: str, tmp_path: Path, n: int = 2, vendor: str = "sophgo") -> list[dict[str, Any]]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XCCL_", "TORCHELASTIC_"))}
    procs = []
    for rank in range(n):
        env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path), case, vendor], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"{case}: rank {rank} exited with {p.returncode}:\n{out[-3000:]}"
        assert f"rank {rank} done" in out, out
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("case", ["framework", "framework_then_init", "init"])
def test_a_world_on_xccls_backend_is_destroyed_before_the_interpreter_finalizes(case: str, tmp_path: Path) -> None:
    for got in _run(case, tmp_path):
        assert not got["initialized_at_exit"], f"{case}: the world outlived xccl's exit handler"


@pytest.mark.parametrize("vendor", ["cpu", "sophgo", "ascend", "mixed"])
def test_shutdown_leaves_nothing_running(vendor: str, tmp_path: Path) -> None:
    # Freed, not only destroyed, once nothing of the job's holds the world (here the script dropped its DDP model):
    # no thread of its groups (a mixed world's islands and host group too), its store or xccl's own (a simulated
    # vendor's watchdog, a mixed group's worker) outlives xccl.shutdown().
    for got in _run("shutdown", tmp_path, n=4 if vendor == "mixed" else 2, vendor=vendor):
        assert got["after_shutdown"] == [], f"{vendor}: still running after xccl.shutdown(): {got}"
        assert got["gloo_threads"] == 0 and not got["initialized_at_exit"], got


def test_a_gloo_world_xccl_adopted_is_left_to_its_creator_at_exit(tmp_path: Path) -> None:
    for got in _run("gloo_adopted", tmp_path):
        assert got["initialized_at_exit"] and got["gloo_threads"] > 0, got
