"""The flight recorder's dumps, in the layout torch 2.13's own recorder writes, and when they are written.

torch's C++ recorder (``torch/csrc/distributed/c10d/FlightRecorder.hpp``: ``version_val = "2.10"`` and the keys
below; ``FlightRecorderDetail.hpp`` builds the dump) pickles one dict per rank::

    {"version": "2.10", "comm_lib_version": str, "pg_config": {name: {"name", "desc", "ranks"}},
     "pg_status": {name: {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}},
     "entries": [{"record_id", "pg_id", "process_group": (name, desc), "collective_seq_id", "p2p_seq_id", "op_id",
                  "is_p2p", "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                  "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms",
                  "state", "retired", "frames", "thread_id", "thread_name"}, ...]}

xccl writes the same keys, so that ``python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX`` reads a
directory of xccl's dumps unchanged (the ``pg_config`` keys are the groups' names, as the entries name them: torch
2.13's gloo dumps key it ``''`` and its analyzer fails on them). xccl adds keys of its own, which the analyzer
ignores: ``xccl`` (rank, reason, clock) at the top, ``xccl_op`` (the op as the user called it), ``xccl_parts``
(an emulation's building blocks), ``xccl_parts_bytes`` (each part's message size), ``xccl_operands`` (a fused op's
matmul operands) and ``xccl_note`` (what a mark of the group's life says: ``shrink_group``'s ranks) per entry. A fused op (``mm_reduce_scatter`` & co.) is one entry: ``xccl_op`` names it, and its
``profiling_name`` and sizes are those of the collective inside it (``Spec.torch_name``, ``Spec.comm``), which is
what torch's analyzer can match across ranks (it knows no fused op).

Each rank writes ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (torch's variable; default ``/tmp/nccl_trace_rank_``):

* on :func:`xccl.dump_trace`;
* on a typed fault xccl raises (``CollectiveTimeout``, ``PeerFailure``, ``CollectiveMismatch``), unless
  ``TORCH_NCCL_DUMP_ON_TIMEOUT=0`` (torch's switch, on by default as in torch: ``ProcessGroupNCCL.cpp`` reads
  ``getCvarBool(TORCH_NCCL_DUMP_ON_TIMEOUT, true)``): the rank that raises it dumps, and sets a key in the rendezvous store that makes every other rank dump too, as torch's NCCL
  watchdog does (``kStoreDumpKey = "exception_dump"`` in ``ProcessGroupNCCL.hpp``, polled by its heartbeat
  monitor): a watcher thread per process polls the key every :data:`POLL` seconds, so a rank stuck elsewhere
  (sleeping, computing, in another group's collective) dumps too;
* on ``SIGUSR1``, where no handler of the application's is installed;
* at the end of the world (``xccl.shutdown``, or the teardown at interpreter exit) when ``XCCL_TRACE_DUMP_AT_EXIT=1``:
  how ``xccl preflight`` collects what every rank of a script it runs did.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import pickle
import signal
import socket
import threading
import time
import warnings
from typing import Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from ..ops import _specs as S
from . import _faults
from ._flight import FLIGHT, Entry, Flight, last_enqueued
from ._health._liveness import ALIVE, probe
from ._state import GROUPS, PROCESS, GroupState

__all__ = ["AT_EXIT", "POLL", "VERSION", "dump", "dump_at_exit", "itemsize_of", "layout", "on_fault", "path",
           "start_watch", "stop_watch"]

LOG = logging.getLogger("xccl")
#: torch 2.13's dump version (``FlightRecorder.hpp``: ``DEFINE_CONSTANT(version_val, "2.10")``).
VERSION: Final = "2.10"
#: torch's default file prefix (``TORCH_FR_DUMP_TEMP_FILE``, formerly ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``).
DEFAULT_PREFIX: Final = "/tmp/nccl_trace_rank_"
#: Seconds between two looks at the store's dump key (torch's heartbeat monitor: ``coordCheckIntervalMilSec_``,
#: 1000 ms by default).
POLL: Final = float(os.environ.get("XCCL_TRACE_POLL", "1") or 1)
#: Seconds a store connection or operation of the recorder may take.
_CONNECT: Final = 2.0
#: Seconds to wait for a thread inside a store connect at shutdown: a connect to a store that is gone retries with a
#: back-off beyond its own timeout (seen: 2 s timeout, retried after 2.5 s).
_JOIN: Final = 4 * _CONNECT + 2
#: The store key a faulting rank sets (under the world's prefix): "<rank> <reason>".
KEY: Final = "fr/dump"
#: xccl's op -> the name torch's analyzer knows (``components/types.py``: ``COLLECTIVES | P2P``): the specs'
#: ``profiling_name``.
_TORCH_NAMES: Final = {s.name: s.profiling_name for s in (*S.ALL.values(), S.ISEND, S.IRECV)}
_DTYPE_NAMES: dict[torch.dtype, str] = {}
#: The inverse, name -> element size, built at the first :func:`itemsize_of` (a dump reader's, not a recording's).
_ITEMSIZES: dict[str, int] = {}


def path(rank: int) -> str:
    """The file rank ``rank`` dumps to."""
    prefix = (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
              or DEFAULT_PREFIX)
    return f"{prefix}{rank}"


def _dtype_name(dtype: torch.dtype) -> str:
    """c10's scalar type name (``Float``, ``BFloat16``), as torch's recorder writes it."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(torch.empty(0, dtype=dtype).type()).removeprefix("torch.").removesuffix(
            "Tensor") if not dtype.is_complex else str(dtype).removeprefix("torch.").capitalize()
    return name


def itemsize_of(name: str) -> int | None:
    """The element size of a dtype named as :func:`_dtype_name` writes it in a dump (None: no torch dtype has it)."""
    if not _ITEMSIZES:
        with warnings.catch_warnings():  # naming a quantized dtype makes a tensor of it, which torch deprecates
            warnings.simplefilter("ignore")
            for dtype in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}:
                with contextlib.suppress(Exception):  # a dtype no tensor can be made of has no name in a dump
                    _ITEMSIZES.setdefault(_dtype_name(dtype), dtype.itemsize)
    return _ITEMSIZES.get(name)


def _groups() -> list[GroupState]:
    out: list[GroupState] = [] if GROUPS.default is None else [GROUPS.default]
    out += [st for st in GROUPS.groups.values() if st is not GROUPS.default]
    return out


def _desc(st: GroupState) -> str:
    if st is GROUPS.default:
        return "default_pg"
    return str(getattr(st.group, "group_desc", "") or "undefined")


def _profiling_name(e: Entry) -> str:
    name = _TORCH_NAMES.get(e.op, e.op)
    if e.is_p2p:
        me = e.group.rank
        name += f" {me}->{e.peer}" if name == "send" else f" {me}<-{e.peer}"
    return f"xccl:{name}"


def _entry(e: Entry, pg_ids: dict[str, int], timeout_ms: int) -> dict[str, Any]:
    st = e.group
    frames = [] if e.site is None else [
        {"name": e.site[0].co_name, "filename": e.site[0].co_filename, "line": e.site[1]}]
    state = "completed" if e.completed else "started" if e.started else "scheduled"
    return {
        "record_id": e.record_id,
        "pg_id": pg_ids.setdefault(str(st.name), len(pg_ids)),
        "process_group": (str(st.name), _desc(st)),
        "collective_seq_id": e.seq,
        "p2p_seq_id": e.p2p_seq,
        "op_id": e.p2p_seq if e.is_p2p else e.seq,
        "is_p2p": e.is_p2p,
        "profiling_name": _profiling_name(e),
        "input_sizes": [list(shape) for shape, _ in e.inputs],
        "input_dtypes": [_dtype_name(dtype) for _, dtype in e.inputs],
        "output_sizes": [list(shape) for shape, _ in e.outputs],
        "output_dtypes": [_dtype_name(dtype) for _, dtype in e.outputs],
        "time_created_ns": e.created,
        "time_discovered_started_ns": e.started or None,
        "time_discovered_completed_ns": e.completed or None,
        "timeout_ms": timeout_ms,
        "state": state,
        "retired": bool(e.completed),
        "frames": frames,
        "thread_id": "",
        "thread_name": "",
        "xccl_op": e.op,
        "xccl_parts": list(e.parts or ()),
        "xccl_parts_bytes": list(e.part_bytes or ()),
        "xccl_operands": [[list(shape), _dtype_name(dtype)] for shape, dtype in e.operands],
        "xccl_note": e.note,
    }


def layout(flight: Flight, reason: str = "dump_trace") -> dict[str, Any]:
    """This rank's record in torch's dump layout (see the module's docstring)."""
    world = PROCESS.world
    timeout_ms = int((world.timeout if world is not None else _dt.timedelta(minutes=30)).total_seconds() * 1000)
    pg_ids: dict[str, int] = {}
    groups = _groups()
    for st in groups:
        pg_ids.setdefault(str(st.name), len(pg_ids))
    entries = [_entry(e, pg_ids, timeout_ms) for e in flight.entries()]
    seen = {id(st) for st in groups}
    groups += [e.group for e in flight.entries() if id(e.group) not in seen and not seen.add(id(e.group))]  # type: ignore[func-returns-value]
    status: dict[str, dict[str, int]] = {}
    for st in groups:
        done = [x["collective_seq_id"] for x in entries if x["process_group"][0] == str(st.name) and x["retired"]
                and not x["is_p2p"]]
        started = [x["collective_seq_id"] for x in entries if x["process_group"][0] == str(st.name)
                   and x["state"] != "scheduled" and not x["is_p2p"]]
        status[str(st.name)] = {"last_enqueued_collective": last_enqueued(st),
                                "last_started_collective": max(started, default=-1),
                                "last_completed_collective": max(done, default=-1)}
    me = world.rank if world is not None else (dist.get_rank() if dist.is_initialized() else 0)
    return {
        "version": VERSION,
        "comm_lib_version": "",
        "pg_config": {str(st.name): {"name": str(st.name), "desc": _desc(st), "ranks": str(list(st.ranks))}
                      for st in groups},
        "pg_status": status,
        "entries": entries,
        "xccl": {"rank": me, "reason": reason, "clock": "time.time_ns", "dumped_ns": time.time_ns(),
                 "host": socket.gethostname(),
                 "backend": world.backend if world is not None else ""},
    }


_WRITE_LOCK: Final = threading.Lock()
#: The variable that asks every rank to dump its record when its world ends (``xccl preflight`` sets it).
AT_EXIT: Final = "XCCL_TRACE_DUMP_AT_EXIT"


def dump_at_exit() -> None:
    """Dump this rank's record because its world is ending, when :data:`AT_EXIT` asks for it (once: the state is
    forgotten right after, so a later teardown finds nothing to dump)."""
    if FLIGHT.ring is None or os.environ.get(AT_EXIT, "").strip() in ("", "0"):
        return
    try:
        dump("end of the world")
    except OSError as exc:  # a full disk must not turn a finished run into a failed one
        LOG.warning("xccl flight recorder: could not dump at exit (%s)", exc)


def dump(reason: str = "dump_trace") -> str | None:
    """Write this rank's record to :func:`path` (atomically: a reader never sees half a file); its path, or None
    when the recorder is off."""
    flight = FLIGHT.ring
    if flight is None:
        return None
    record = layout(flight, reason)
    target = path(int(record["xccl"]["rank"]))
    with _WRITE_LOCK:
        directory = os.path.dirname(target)
        if directory:
            os.makedirs(directory, exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(record, f)
        os.replace(tmp, target)
    LOG.warning("xccl flight recorder: rank %s dumped %d entries to %s (%s)", record["xccl"]["rank"],
                len(record["entries"]), target, reason)
    return target


# -------------------------------------------------------------------------------------- every rank dumps at a fault


def _store() -> Any:
    """A store client of its own (the main thread may be blocked in the shared one), or None without a store."""
    live = PROCESS.liveness
    if live is None:
        return None
    addr, port = live.store
    # A store whose host is gone would make TCPStore retry its connect past its timeout (and a thread inside that
    # connect at interpreter exit aborts the process): knock first, as the liveness check does.
    if probe({-1: (addr, port)}, _CONNECT).get(-1) != ALIVE:
        raise RuntimeError(f"the rendezvous store at {addr}:{port} cannot be reached")
    raw = dist.TCPStore(addr, port, is_master=False, timeout=_dt.timedelta(seconds=_CONNECT), wait_for_workers=False)
    return PrefixStore(live.prefix, raw)


def on_fault(kind: str, rank: int, op: str, group: str) -> None:
    """A typed fault is being raised on this rank: dump here, and ask every rank of the world to dump."""
    if FLIGHT.ring is None or os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "").strip() in ("0", "false"):
        return
    trigger = f"{rank} {kind} in {op} on group {group!r}"
    watch = FLIGHT.watch
    if watch is not None and watch.fired:
        return  # this process dumped for a fault already (its own or a peer's): the first record stands
    if watch is not None:
        watch.fired = True
    try:
        dump(f"{kind} on rank {rank}: {op} on group {group!r}")
    except OSError as exc:
        LOG.warning("xccl flight recorder: could not dump (%s)", exc)
    if PROCESS.liveness is not None:
        # In the background: a store whose host is gone must not delay the typed error.
        asking = threading.Thread(target=_ask_all, args=(trigger,), name="xccl-flight-ask", daemon=True)
        _ASKING.append(asking)  # joined at shutdown (stop_watch): it may be inside a store connect
        asking.start()


_ASKING: list[threading.Thread] = []


def _ask_all(trigger: str) -> None:
    try:
        store = _store()
        if store is not None:
            store.set(KEY, trigger)
    except RuntimeError as exc:  # the store is gone with its host: the others dump at their own faults
        LOG.warning("xccl flight recorder: could not ask the other ranks to dump (%s)", exc)


class _Watch:
    """The thread that dumps this rank's record when another rank's fault asks for it (through the store)."""

    def __init__(self) -> None:
        self.fired = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="xccl-flight-watch", daemon=True)

    def _run(self) -> None:
        store = None
        while not self.stop.wait(POLL):
            try:
                store = store or _store()
                if self.stop.is_set():
                    return
                if store is None:
                    return
                if not store.check([KEY]):
                    continue
                trigger = bytes(store.get(KEY)).decode(errors="replace")
            except RuntimeError:
                store = None  # the store went away (or timed out): look again later
                continue
            if not self.fired:
                self.fired = True
                with contextlib.suppress(OSError):
                    dump(f"asked by rank {trigger}")


def start_watch() -> None:
    """Start this process's dump watcher and the SIGUSR1 handler (``xccl.init``, when the recorder is on)."""
    if FLIGHT.ring is None or FLIGHT.watch is not None:
        return
    if PROCESS.liveness is not None:
        watch = FLIGHT.watch = _Watch()
        watch.thread.start()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGUSR1, _on_signal)


def _on_signal(signum: int, _frame: Any) -> None:
    with contextlib.suppress(OSError):
        dump(f"signal {signal.Signals(signum).name}")


def stop_watch(watch: Any) -> None:
    """Stop a watcher (``xccl.shutdown``), and wait briefly for it and for the threads asking the other ranks to dump:
    a thread left inside a store call while the interpreter exits can abort the process."""
    threads = [*(asking for asking in _ASKING), *([watch.thread] if isinstance(watch, _Watch) else [])]
    _ASKING.clear()
    if isinstance(watch, _Watch):
        watch.stop.set()
    for thread in threads:
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=_JOIN)


_faults.LISTENERS.append(on_fault)
