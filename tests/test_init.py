"""xccl.init: environment, re-initialisation, shutdown, world of one. Each case runs in a fresh process."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

#: What a case's process must not inherit from the environment of the test run.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "XCCL_VENDOR", "XCCL_SIMULATE")


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env={**base, **(env or {})}, capture_output=True, text=True,
        timeout=120,
    )
    # torch 2.8's gloo prints a line to stdout per group it connects ("[Gloo] Rank 0 is connected to ...").
    out.stdout = "".join(line for line in out.stdout.splitlines(keepends=True) if not line.startswith("[Gloo] "))
    return out


def test_world_of_one_without_any_environment():
    out = _run("""
        import torch, xccl
        w = xccl.init()
        t = torch.ones(3); xccl.all_reduce(t)
        print(w.rank, w.world_size, w.plugin, w.backend, w.device, t.tolist())
        assert xccl.init() is w          # same arguments: a no-op returning the same world
        xccl.shutdown(); w2 = xccl.init(); print(w2 == w)
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "0 1 cpu gloo cpu [1.0, 1.0, 1.0]"
    assert lines[1] == "True"


def test_shutdown_frees_a_world_that_torch_pinned_after_init():
    # torch.distributed.nn.functional takes group=group.WORLD as a default, evaluated at import; torch._dynamo imports
    # it (the first optimizer made after init does). The world it pins must still go at shutdown: its gloo threads
    # end (alive at interpreter exit, tearing them down can abort the process), and after a new init those
    # functions run on the new world, not the destroyed one.
    out = _run("""
        import os, warnings, torch, xccl
        warnings.simplefilter("ignore", FutureWarning)  # torch.distributed.nn.functional is deprecated
        def threads():  # gloo's workers among them (named pt_gloo_runloop from torch 2.9; unnamed before)
            return len(os.listdir("/proc/self/task"))
        before = threads()
        xccl.init()
        import torch.distributed.nn.functional as F
        during = threads()
        xccl.shutdown()
        print(during > before, threads() - before)
        xccl.init()
        print(F.all_reduce(torch.ones(2)).tolist())
        xccl.shutdown()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True 0", "[1.0, 1.0]"], out.stdout


def test_second_init_with_different_arguments_is_an_error():
    out = _run("""
        import xccl
        xccl.init()
        try:
            xccl.init(fallback="error")
        except xccl.InitError as e:
            print("InitError:", e)
    """)
    assert "InitError: xccl is already initialised" in out.stdout, out.stderr
    assert "xccl.shutdown()" in out.stdout


@pytest.mark.parametrize(
    ("env", "phrase"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside [0, 2)"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "world size must be >= 1"),
        ({"RANK": "0"}, "both are needed"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, "not a TCP port"),
        ({"XCCL_TIMEOUT": "soon"}, "XCCL_TIMEOUT='soon' is not a number"),
        ({"XCCL_VENDOR": "nope"}, "no xccl plugin named 'nope'"),
        ({"XCCL_SIMULATE": "cpu"}, "has no CPU simulation"),
    ],
    ids=["rank-not-int", "rank-out-of-range", "world-zero", "no-world-size", "no-master", "bad-port",
         "bad-timeout", "unknown-vendor", "cpu-not-simulable"],
)
def test_bad_environment_is_a_typed_error(fresh: ProcessPoolExecutor, env, phrase):
    got = fresh.submit(_init_under, env).result(timeout=120)
    assert phrase in got, got


@pytest.fixture(scope="module")
def fresh() -> Iterator[ProcessPoolExecutor]:
    """A fresh process per case, forked from a server that imported torch and xccl once (a plain interpreter per
    case spent 2-3 s of CPU importing torch; the cases only read the environment)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1) as pool:
        yield pool


def _init_under(env: dict[str, str]) -> str:
    """``xccl.init()`` under ``env`` in this fresh process: its typed error, or what it returned."""
    import xccl

    for k in _LAUNCHER_VARS:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        return f"initialised: {xccl.init()}"
    except xccl.XcclError as e:
        return f"{type(e).__name__} | {e}"


def test_init_under_torchrun_unchanged(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import torch, xccl
        w = xccl.init()
        t = torch.ones(2) * (w.rank + 1); xccl.all_reduce(t)
        print(f"rank {w.rank}/{w.world_size} local {w.local_rank}: {t.tolist()}")
        xccl.shutdown()
    """))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert "rank 0/2 local 0: [3.0, 3.0]" in out.stdout and "rank 1/2 local 1: [3.0, 3.0]" in out.stdout
