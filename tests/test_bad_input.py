"""The bad-input catalog: every case raises its typed error on every rank within seconds, and leaves the process
group usable where that is possible. ``docs/errors.md`` lists each case (by its id) with its fix; a test keeps
the two in step.

Where each case runs:

* ``pool``: a 2-rank gloo pool; every rank makes the same bad call, then an all_reduce proves the group works;
* ``sophgo`` / ``ascend``: the same, in a 2-rank pool simulating that vendor with ``fallback="error"``
  (skipped when the vendor's plugin is not installed);
* ``local``: ``xccl.init`` or plugin selection in this process, failing before any process group exists;
* ``world``: several processes started with inconsistent settings (world size, rank).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl import Plugin, ProbeResult, Registry
from xccl.backends.cpu import CpuPlugin
from xccl.plugin import load_rank_table
from xccl.testing import RankPool, free_port
from xccl.tools.cli.ranktable import installed_formats

DOCS = Path(__file__).resolve().parent.parent / "docs" / "errors.md"
R = xccl.ReduceOp


@dataclass(frozen=True)
class Case:
    """One catalog entry: its id (as in docs/errors.md), where it runs, and the error it must raise."""

    id: str
    where: str
    error: str


# ---------------------------------------------------------------------------------------------- rank-side calls

_GROUPS: dict[str, Any] = {}


def _n() -> int:
    return xccl.get_world().world_size


def _me() -> int:
    return xccl.get_world().rank


def _not_mine() -> Any:
    """A group this rank is not in: rank r gets the group of the other rank only (every rank creates both)."""
    if "solo" not in _GROUPS:
        _GROUPS["solo"] = [xccl.new_group([r]) for r in range(_n())]
    return _GROUPS["solo"][(_me() + 1) % _n()]


def _table(tmp: str, name: str, content: Any) -> str:
    path = Path(tmp) / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _hccl(devices: list[dict[str, str]]) -> dict[str, Any]:
    return {"status": "completed", "version": "1.0", "server_count": "1",
            "server_list": [{"server_id": "node_0", "device": devices}]}


def _dev(device_id: str, rank_id: str) -> dict[str, str]:
    return {"device_id": device_id, "device_ip": "192.168.1.8", "device_port": "16667", "rank_id": rank_id}


t4 = lambda: torch.ones(4)  # noqa: E731 - a fresh small tensor per call


CALLS: dict[str, Callable[[str], Any]] = {
    # -- every collective: type, device, contiguity, dtype, shape, sizes, ranks, groups
    "all_reduce-not-a-tensor": lambda _: xccl.all_reduce([1.0, 2.0]),  # type: ignore[arg-type]
    "all_reduce-wrong-device": lambda _: xccl.all_reduce(torch.ones(4, device="meta")),
    "all_reduce-non-contiguous": lambda _: xccl.all_reduce(torch.ones(4, 4).t()),
    "all_reduce-op-for-dtype": lambda _: xccl.all_reduce(t4(), op=R.BAND),
    "all_reduce-premul-sum-on-integers": lambda _: xccl.all_reduce(torch.ones(4, dtype=torch.int32),
                                                                   op=dist._make_nccl_premul_sum(2.0)),
    "all_reduce-group-not-a-group": lambda _: xccl.all_reduce(t4(), group="tp"),
    "all_reduce-group-not-member": lambda _: xccl.all_reduce(t4(), group=_not_mine()),
    "all_gather-list-length": lambda _: xccl.all_gather([torch.empty(4) for _ in range(_n() + 1)], t4()),
    "all_gather-dtype": lambda _: xccl.all_gather([torch.empty(4, dtype=torch.int64) for _ in range(_n())], t4()),
    "all_gather-shape": lambda _: xccl.all_gather([torch.empty(5) for _ in range(_n())], t4()),
    "all_gather_into_tensor-output-size": lambda _: xccl.all_gather_into_tensor(torch.empty(4 * _n() + 1), t4()),
    "all_gather_into_tensor-dtype": lambda _: xccl.all_gather_into_tensor(
        torch.empty(4 * _n(), dtype=torch.float64), t4()),
    "reduce_scatter-input-shape": lambda _: xccl.reduce_scatter(torch.empty(4), [torch.ones(3) for _ in range(_n())]),
    "reduce_scatter_tensor-input-size": lambda _: xccl.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * _n() + 2)),
    "all_to_all-mixed-dtypes": lambda _: xccl.all_to_all(
        [torch.empty(1) for _ in range(_n())], [torch.ones(1, dtype=torch.int32) for _ in range(_n())]),
    "all_to_all_single-split-count": lambda _: xccl.all_to_all_single(
        torch.empty(2 * _n()), torch.ones(2 * _n()), [2] * (_n() + 1), None),
    "all_to_all_single-split-sum": lambda _: xccl.all_to_all_single(
        torch.empty(2 * _n()), torch.ones(2 * _n()), None, [1] * _n()),
    "all_to_all_single-negative-split": lambda _: xccl.all_to_all_single(
        torch.empty(2 * _n()), torch.ones(2 * _n()), None, [-1] + [2] * (_n() - 2) + [5]),
    "all_to_all_single-float-split": lambda _: xccl.all_to_all_single(
        torch.empty(2 * _n()), torch.ones(2 * _n()), None, [2.0] * _n()),
    "all_to_all_single-indivisible": lambda _: xccl.all_to_all_single(torch.empty(2 * _n() + 1), torch.ones(2 * _n() + 1)),
    "broadcast-src-out-of-range": lambda _: xccl.broadcast(t4(), src=_n() + 3),
    "broadcast-src-and-group-src": lambda _: xccl.broadcast(t4(), src=0, group_src=0),
    "broadcast-group-src-out-of-range": lambda _: xccl.broadcast(t4(), group_src=-1),
    "reduce-dst-negative": lambda _: xccl.reduce(t4(), dst=-1),
    "gather-list-on-wrong-ranks": lambda _: xccl.gather(t4(), [torch.empty(4)] * (_n() + 1), dst=0),
    "scatter-list-shape": lambda _: xccl.scatter(torch.empty(4), [torch.ones(3)] * _n(), src=0),
    "send-to-self": lambda _: xccl.send(t4(), _me()),
    "send-dst-out-of-range": lambda _: xccl.send(t4(), _n() + 1),
    "recv-src-not-in-group": lambda _: xccl.recv(t4(), 99),
    "all_gather_into_tensor_uneven-split-sum": lambda _: xccl.all_gather_into_tensor_uneven(
        torch.empty(4 * _n()), t4(), [4] * (_n() - 1) + [5]),
    "reduce_scatter_tensor_uneven-output-shape": lambda _: xccl.reduce_scatter_tensor_uneven(
        torch.empty(3), torch.ones(4 * _n()), [4] * _n()),
    "all_to_all_v-not-square": lambda _: xccl.all_to_all_v(torch.empty(4), t4(), [[1, 1]]),
    "all_to_all_v-in-place": lambda _: _a2av_in_place(),
    "all_to_all_v-negative-count": lambda _: xccl.all_to_all_v(
        torch.empty(4), t4(), [[-1] + [5] + [0] * (_n() - 2)] * _n()),
    "new_group-rank-out-of-range": lambda _: xccl.new_group([0, _n()]),
    "new_group-duplicate-ranks": lambda _: xccl.new_group([0, 0]),
    "new_group-empty": lambda _: xccl.new_group([]),
    "init-twice-different-arguments": lambda _: xccl.init(fallback="error"),
    # -- rank tables (xccl parses them itself: Sophgo's reader is broken, see docs/vendors)
    "ranktable-missing-file": lambda tmp: load_rank_table(Path(tmp) / "absent.json", installed_formats()),
    "ranktable-not-json": lambda tmp: load_rank_table(_table(tmp, "a.json", "{not json"), installed_formats()),
    "ranktable-neither-format": lambda tmp: load_rank_table(
        _table(tmp, "b.json", {"version": "1.0"}), installed_formats()),
    "ranktable-sophgo-version": lambda tmp: load_rank_table(
        _table(tmp, "c.json", {"version": "2.0", "node_list": [{"device_list": [{"device_id": "0", "rank": "0"}]}]}),
        installed_formats()),
    "ranktable-duplicate-rank": lambda tmp: load_rank_table(
        _table(tmp, "d.json", _hccl([_dev("0", "0"), _dev("1", "0")])), installed_formats()),
    "ranktable-device-id-range": lambda tmp: load_rank_table(
        _table(tmp, "e.json", _hccl([_dev("0", "0"), _dev("9", "1")])), installed_formats(), max_devices=8),
    "ranktable-not-a-number": lambda tmp: load_rank_table(
        _table(tmp, "f.json", _hccl([_dev("zero", "0")])), installed_formats()),
    # -- simulated vendor constraints (pools with XCCL_SIMULATE=<vendor>, fallback="error")
    "sophgo-reduce_scatter_tensor": lambda _: xccl.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * _n())),
    "sophgo-avg": lambda _: xccl.all_reduce(t4(), op=R.AVG),
    "sophgo-float64": lambda _: xccl.all_reduce(torch.ones(4, dtype=torch.float64)),
    "sophgo-uneven-all_to_all_single": lambda _: xccl.all_to_all_single(
        torch.empty(3 * _n()), torch.ones(3 * _n()), [3] * _n(), [2] + [3] * (_n() - 2) + [4]),
    "ascend-band": lambda _: xccl.all_reduce(torch.ones(4, dtype=torch.int32), op=R.BAND),
    "ascend-mm_all_reduce-dtype": lambda _: xccl.mm_all_reduce(torch.ones(4, 8), torch.ones(8, 4)),
    "ascend-mm_reduce_scatter-k-range": lambda _: xccl.mm_reduce_scatter(
        torch.ones(4, 8, dtype=torch.float16), torch.ones(8, 4, dtype=torch.float16)),
    "ascend-mm_reduce_scatter-m-divisible": lambda _: xccl.mm_reduce_scatter(
        torch.ones(3, 256, dtype=torch.float16), torch.ones(256, 4, dtype=torch.float16)),
}


def _a2av_in_place() -> None:
    n = _n()
    buf = torch.ones(n)
    xccl.all_to_all_v(buf, buf, [[1] * n for _ in range(n)])


def body_case(case_id: str, tmp: str) -> dict[str, Any]:
    """Make the bad call, record what it raised, then prove the group still works."""
    started = time.monotonic()
    try:
        CALLS[case_id](tmp)
        raised: list[str] = ["no error"]
        message = ""
    except Exception as exc:  # the test compares the class names
        raised = [c.__name__ for c in type(exc).__mro__]
        message = str(exc)
    elapsed = time.monotonic() - started
    t = torch.ones(2)
    xccl.all_reduce(t)
    return {"raised": raised, "message": message, "elapsed": elapsed, "after": t.tolist()}


# ---------------------------------------------------------------------------------------------- the catalog

INVALID = "InvalidArgument"
UNSUPPORTED = "UnsupportedCollective"
POOL = [Case(k, "pool", INVALID) for k in CALLS if not k.startswith(("ranktable-", "sophgo-", "ascend-"))]
POOL = [
    Case(c.id, c.where, {"all_reduce-op-for-dtype": UNSUPPORTED, "all_reduce-premul-sum-on-integers": UNSUPPORTED,
                         "init-twice-different-arguments": "InitError"}.get(c.id, c.error))
    for c in POOL
]
POOL += [Case(k, "pool", "RankTableError") for k in CALLS if k.startswith("ranktable-")]
SIM = [Case(k, k.split("-", 1)[0], UNSUPPORTED) for k in CALLS if k.startswith(("sophgo-", "ascend-"))]
SIM = [
    Case(c.id, c.where, {"ascend-mm_all_reduce-dtype": "ConstraintViolation",
                         "ascend-mm_reduce_scatter-k-range": "ConstraintViolation",
                         "ascend-mm_reduce_scatter-m-divisible": INVALID}.get(c.id, c.error))
    for c in SIM
]


class _Accel(Plugin):
    vendor = "Test"
    device_type = "cpu"

    def probe(self) -> ProbeResult:
        return ProbeResult.ok()


class _AccelA(_Accel):
    name = "accel-a"


class _AccelB(_Accel):
    name = "accel-b"


class _OldApi(_Accel):
    name = "old"
    api_version = 0


def _broken() -> object:
    raise ImportError("libvendor.so: cannot open shared object file")


LOCAL: dict[str, tuple[str, dict[str, str], Callable[[], Any]]] = {
    # id: (error, environment, call)
    "init-unknown-vendor": ("BackendNotFound", {}, lambda: xccl.init("nope")),
    "init-vendor-env-unknown": ("BackendNotFound", {"XCCL_VENDOR": "nope"}, lambda: xccl.init()),
    "init-vendor-unavailable": ("BackendUnavailable", {}, lambda: xccl.init("cuda")),
    "init-rank-not-an-integer": ("InitError", {"RANK": "x", "WORLD_SIZE": "2"}, lambda: xccl.init()),
    "init-rank-out-of-range": ("InitError", {"RANK": "2", "WORLD_SIZE": "2"}, lambda: xccl.init()),
    "init-world-size-zero": ("InitError", {"RANK": "0", "WORLD_SIZE": "0"}, lambda: xccl.init()),
    "init-world-size-missing": ("InitError", {"RANK": "0"}, lambda: xccl.init()),
    "init-master-missing": ("InitError", {"RANK": "0", "WORLD_SIZE": "2"}, lambda: xccl.init()),
    "init-master-port-not-a-port": (
        "InitError", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"},
        lambda: xccl.init()),
    "init-timeout-env-not-a-number": ("InitError", {"XCCL_TIMEOUT": "soon"}, lambda: xccl.init()),
    "init-timeout-not-positive": ("InitError", {}, lambda: xccl.init(timeout=-1)),
    "init-fallback-unknown": ("InitError", {}, lambda: xccl.init(fallback="maybe")),  # type: ignore[arg-type]
    "init-simulate-conflicts-with-vendor": ("InitError", {"XCCL_SIMULATE": "sophgo"}, lambda: xccl.init("cpu")),
    "init-simulate-without-vendor": ("InitError", {}, lambda: xccl.init(simulate=True)),
    "init-simulate-not-simulable": ("BackendUnavailable", {"XCCL_SIMULATE": "cpu"}, lambda: xccl.init()),
    "collective-before-init": ("InitError", {}, lambda: xccl.all_reduce(torch.ones(2))),
    "plugin-two-accelerators": (
        "InitError", {}, lambda: xccl.init(registry=Registry.from_plugins(CpuPlugin(), _AccelA(), _AccelB()))),
    "plugin-failed-to-load": (
        "BackendUnavailable", {},
        lambda: xccl.init("broken", registry=Registry([("broken", "vendor:plugin", "xccl-vendor 1.0", _broken)]))),
    "plugin-wrong-api-version": ("BackendUnavailable", {}, lambda: xccl.init("old", registry=Registry.from_plugins(_OldApi()))),
}

WORLD = {
    "init-world-size-mismatch": "InitError",
    "init-duplicate-rank": "InitError",
}

ALL_IDS = [c.id for c in POOL] + [c.id for c in SIM] + list(LOCAL) + list(WORLD)


def test_catalog_has_forty_cases_each_documented_with_a_fix():
    assert len(ALL_IDS) >= 40 and len(set(ALL_IDS)) == len(ALL_IDS)
    text = DOCS.read_text()
    errors = {c.id: c.error for c in POOL + SIM} | {k: v[0] for k, v in LOCAL.items()} | WORLD
    for case_id in ALL_IDS:
        rows = [line for line in text.splitlines() if f"`{case_id}`" in line]
        assert rows, f"{case_id} is not in docs/errors.md"
        assert errors[case_id] in rows[0], f"docs/errors.md names another error for {case_id}: {rows[0]}"
        assert rows[0].count("|") >= 5, f"{case_id}: the row needs a cause and a fix column"


# ---------------------------------------------------------------------------------------------- pool cases


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    with RankPool(2, {"timeout": 10}, start_method="forkserver") as p:
        yield p


def _check(outs: list[Any], error: str) -> None:
    for o in outs:
        assert o.ok, str(o)  # the body itself never fails: it reports what the bad call raised
        report = o.value
        assert error in report["raised"] and "XcclError" in report["raised"], (o.rank, report)
        assert report["elapsed"] < 5.0, report
        assert report["after"] == [2.0, 2.0], report  # the group still computes the right sum


@pytest.mark.parametrize("case", POOL, ids=[c.id for c in POOL])
def test_pool_case(pool, case, tmp_path):
    _check(pool.run(body_case, case.id, str(tmp_path), timeout=60), case.error)


def _installed(name: str) -> bool:
    return any(i.name == name and i.plugin is not None for i in xccl.plugins())


@pytest.fixture(scope="module")
def sim_pool(request: pytest.FixtureRequest) -> Iterator[RankPool]:
    """A 2-rank pool simulating ``request.param``'s vendor with ``fallback="error"`` (indirect parameter)."""
    if not _installed(request.param):
        pytest.skip(f"the {request.param} plugin is not installed")
    env = {"XCCL_SIMULATE": request.param}
    with RankPool(2, {"timeout": 10, "fallback": "error"}, env=env, start_method="forkserver") as p:
        if request.param == "ascend":
            # The fused ops' first call imports torch._dynamo (seconds, once per process): not the error's cost.
            p.run_ok(_warm_up)
        yield p


def _warm_up() -> None:
    import torch._dynamo  # noqa: F401


@pytest.mark.parametrize(("sim_pool", "case"), [(c.where, c) for c in SIM], ids=[c.id for c in SIM],
                         indirect=["sim_pool"])
def test_simulated_vendor_case(sim_pool, case, tmp_path):
    _check(sim_pool.run(body_case, case.id, str(tmp_path), timeout=60), case.error)


# ---------------------------------------------------------------------------------------------- local cases

_CLEAN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "XCCL_VENDOR", "XCCL_SIMULATE",
          "XCCL_TIMEOUT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")


@pytest.mark.parametrize("case_id", list(LOCAL), ids=list(LOCAL))
def test_local_case(case_id, monkeypatch):
    from xccl.collectives._state import PROCESS as _PROCESS

    if _PROCESS.world is not None or dist.is_initialized():
        pytest.skip("this process already has a process group")
    error, env, call = LOCAL[case_id]
    for k in _CLEAN:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    started = time.monotonic()
    try:
        with pytest.raises(xccl.XcclError) as info:
            call()
    finally:
        if _PROCESS.world is not None:  # a case that wrongly succeeded must not leak its world into others
            xccl.shutdown()
    names = [c.__name__ for c in type(info.value).__mro__]
    assert error in names, (case_id, names, str(info.value))
    assert time.monotonic() - started < 5.0
    assert not dist.is_initialized()


# ---------------------------------------------------------------------------------------------- world cases


def _start_rank(rank: int, world_size: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    started = time.monotonic()
    try:
        xccl.init("cpu", timeout=3, setup_timeout=3)
        xccl.barrier()
        queue.put((rank, ["no error"], time.monotonic() - started))
    except Exception as exc:  # reported to the parent
        queue.put((rank, [c.__name__ for c in type(exc).__mro__], time.monotonic() - started))


@pytest.mark.parametrize("case_id", list(WORLD), ids=list(WORLD))
def test_world_case(case_id):
    """Ranks that disagree about the world: each raises a typed error instead of hanging.

    The rank that owns the inconsistency raises the catalog's error; a rank whose peers misbehave may see it as a
    rendezvous timeout or, if its own rendezvous happened to complete, as a fault in its first collective.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    specs = {"init-world-size-mismatch": [(0, 2), (1, 3)], "init-duplicate-rank": [(0, 2), (0, 2)]}[case_id]
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_start_rank, args=(r, ws, port, queue)) for r, ws in specs]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    typed = {"RendezvousTimeout", "InitError", "CollectiveTimeout", "PeerFailure"}
    for _rank, names, elapsed in results:
        assert typed & set(names) and "XcclError" in names, results
        assert elapsed < 30, results  # the init timeout is 3 s; gloo's own connect retries can add ~20 s
    assert any(WORLD[case_id] in names for _r, names, _e in results), results
