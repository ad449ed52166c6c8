"""The flight recorder: what every collective through xccl was, where the user called it, and when it completed.

A hook of every group's pipeline (``_hooks``): each call a group runs (``xccl.<op>``, ``torch.distributed.<op>`` on
xccl's process group, DDP and FSDP2 through it, the fused ops, the graph ops at run time) becomes one :class:`Entry`
in a process-wide ring of the last N calls. An entry keeps:

* the group (name, description, members) and its per-group sequence number (``collective_seq_id``; point-to-point
  calls count separately, ``p2p_seq_id``, as in torch's recorder);
* the op as the user called it and, for an emulation (or a fused op's portable version), the names of its parts
  (the hook's inner stage appends each building block to the entry this thread is issuing);
* dtypes and shapes (never the tensors: the ring must not keep memory alive);
* the user's call site: the first frame outside xccl, torch and the vendor's or framework's adaptor (the rule of
  ``ops/_warn.py``);
* timestamps (``time.time_ns()``, the clock torch's recorder uses): ``created`` when dispatch saw the call,
  ``started`` when xccl handed it to the backend (xccl cannot see when a device starts a kernel: best effort),
  ``completed`` when a synchronous call returned; for an asynchronous call, when xccl's handle found it done
  (``wait()``, ``is_completed()``) or, for whoever waits on its future instead (DDP's reducer), from a callback on
  the backend's future: no host sync on the hot path, and no callback for a caller that waits on the handle.

Dumps in torch's own layout are written by :mod:`._flight_dump`. The switches (:func:`capacity`):
``TORCH_FR_BUFFER_SIZE=N`` (torch's: N entries, on) and ``XCCL_TRACE`` (``0`` off, ``1`` on with
:data:`DEFAULT_ENTRIES`, a number: that many entries). Without either it is on, with :data:`DEFAULT_ENTRIES`, as
torch keeps its NCCL recorder on: measured side by side with an A/A control (``benchmarks/flight_recorder.py``,
``docs/performance.md``), an entry costs a few percent of a 1-element all_reduce between processes.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..errors import InitError
from ..ops import _warn
from ..ops._specs import Access, Kind
from ..ops._vocab import Collective
from ._state import Part

__all__ = ["DEFAULT_ENTRIES", "FLIGHT", "Entry", "Flight", "capacity", "hook", "message_bytes", "recorder"]

#: Entries kept when the recorder is on without a size (torch's default for ``TORCH_FR_BUFFER_SIZE`` is 2000).
DEFAULT_ENTRIES: Final = 2000
_time_ns: Final = time.time_ns
_getframe: Final = sys._getframe
#: Whether a frame is not the user's (xccl, torch, the deprecation wrappers, the adaptors): ``ops/_warn.py``'s
#: rule, and its cache of the answer per code object.
_internal: Final = _warn.internal
_INTERNAL_CODE: Final = _warn.INTERNAL_CODE
_TENSOR: Final = torch.Tensor
_WORK: Final = dist.Work
_IN: Final = Access.READ
_OUT: Final = Access.WRITE
_ONE: Final = Kind.TENSOR
_P2P: Final = frozenset({Collective.SEND, Collective.RECV, Collective.RECV_ANY_SOURCE})


def capacity() -> int:
    """Entries the recorder keeps, from the environment; 0 when it is off (on by default: see the module's docstring).

    ``XCCL_TRACE`` wins over ``TORCH_FR_BUFFER_SIZE`` (``XCCL_TRACE=0`` turns xccl's recorder off even where
    torch's is on for another backend).

    Raises:
        InitError: a variable is not a non-negative integer.
    """
    for name in ("XCCL_TRACE", "TORCH_FR_BUFFER_SIZE"):
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        if name == "XCCL_TRACE" and raw.lower() in ("on", "true", "yes"):
            return DEFAULT_ENTRIES
        if name == "XCCL_TRACE" and raw.lower() in ("off", "false", "no"):
            return 0
        try:
            value = int(raw)
        except ValueError:
            raise InitError(f"environment variable {name}={raw!r} is not a number of entries; fix or unset it") from None
        if value < 0:
            raise InitError(f"environment variable {name}={raw!r} must be 0 (off) or a number of entries")
        return DEFAULT_ENTRIES if name == "XCCL_TRACE" and value == 1 else value
    return DEFAULT_ENTRIES


@final
class Entry:
    """One recorded call. Written by the thread that issued it; ``completed`` by the backend's callback."""

    __slots__ = (
        "completed",
        "created",
        "group",
        "inputs",
        "is_p2p",
        "op",
        "operands",
        "outputs",
        "p2p_seq",
        "part_bytes",
        "parts",
        "peer",
        "record_id",
        "seq",
        "site",
        "started",
    )

    def __init__(self, record_id: int, group: Any, op: str, seq: int, p2p_seq: int, is_p2p: bool,
                 inputs: tuple[Any, ...], outputs: tuple[Any, ...], site: tuple[types.CodeType, int] | None,
                 created: int) -> None:
        #: Process-wide order of the call (torch's ``record_id``).
        self.record_id: Final = record_id
        #: The group's state (name, members, description are read at dump time).
        self.group: Final = group
        #: The op as the user called it (``all_reduce``, ``reduce_scatter_tensor``...).
        self.op: Final = op
        #: Per-group sequence numbers: collectives and point-to-point calls counted separately, from 1 (torch's).
        self.seq: Final = seq
        self.p2p_seq: Final = p2p_seq
        self.is_p2p: Final = is_p2p
        #: ``(shape, dtype)`` of each tensor read, and of each tensor written.
        self.inputs: Final = inputs
        self.outputs: Final = outputs
        #: The user's frame: its code object and line (formatted only when dumped).
        self.site: Final = site
        #: Peer group rank of a point-to-point call (-1 otherwise).
        self.peer = -1
        #: A fused op's matmul operands, ``(shape, dtype)`` each (its ``inputs`` and ``outputs`` are its
        #: communication's, as torch's analyzer matches them).
        self.operands: tuple[Any, ...] = ()
        #: The emulation's parts, in issue order (None: a native call).
        self.parts: list[str] | None = None
        #: The bytes each part read or wrote, whichever is larger (nccl-tests' message size), in issue order.
        self.part_bytes: list[int] | None = None
        #: ``time.time_ns()`` at the call, when handed to the backend, when known complete (0: not yet).
        self.created: Final = created
        self.started = 0
        self.completed = 0

    def done(self, _fut: Any = None) -> None:
        """Stamp the completion (a synchronous call's return, or the backend future's callback)."""
        self.completed = _time_ns()

    def __repr__(self) -> str:
        return f"<xccl flight entry #{self.record_id} {self.op} seq {self.seq} on group {self.group.name!r}>"


def user_site() -> tuple[types.CodeType, int] | None:
    """The first frame outside xccl, torch and the adaptors: the user's call (None when the call came from C++
    alone). The rule is ``ops/_warn.py``'s :func:`~xccl.ops._warn.internal`; its cache is read here first."""
    frame: types.FrameType | None = _getframe(2)
    known = _INTERNAL_CODE
    while frame is not None:
        internal = known.get(frame.f_code)
        if internal is None:
            internal = _internal(frame)
        if not internal:
            return frame.f_code, frame.f_lineno
        frame = frame.f_back
    return None


def message_bytes(spec: Any, kargs: Sequence[Any]) -> int:
    """The larger of the bytes a call reads and writes: the message size nccl-tests reports (all_gather: the
    gathered output; reduce_scatter: the input)."""
    read = written = 0
    for arg, value in zip(spec.args, kargs, strict=False):
        access = arg.access
        if access is None:
            continue
        size = sum(int(shape.numel()) * dtype.itemsize for shape, dtype in _described((value,)))
        if access.value != "out":
            read += size
        if access.value != "in":
            written += size
    return max(read, written)


def _described(values: Sequence[Any]) -> tuple[Any, ...]:
    """``(shape, dtype)`` of every tensor in ``values`` (lists of tensors flattened, anything else skipped)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, _TENSOR):
            out.append((v.shape, v.dtype))
        elif isinstance(v, (list, tuple)):
            out.extend(_described(v))
    return tuple(out)


Describe = Callable[[Sequence[Any]], tuple[tuple[Any, ...], tuple[Any, ...]]]
#: Per spec, what its calls read and write as ``(shape, dtype)`` tuples (built at the spec's first call).
_DESCRIBERS: dict[Any, Describe] = {}


def _describer(spec: Any) -> Describe:
    """A function from ``spec``'s kernel arguments to the ``(shape, dtype)`` of the tensors it reads and writes;
    written out for the common case of plain tensor arguments (the recorder's cost is per call)."""
    reads = tuple(i for i, a in enumerate(spec.args) if a.access is not None and a.access is not _OUT)
    writes = tuple(i for i, a in enumerate(spec.args) if a.access is not None and a.access is not _IN)
    if all(spec.args[i].kind is _ONE for i in (*reads, *writes)):
        if reads == writes and len(reads) == 1:  # all_reduce, broadcast, reduce: one tensor, read and written
            (i,) = reads

            def one(k: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
                t = k[i]
                both = ((t.shape, t.dtype),)
                return both, both

            return one

        def plain(k: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            return (tuple((k[i].shape, k[i].dtype) for i in reads if k[i] is not None),
                    tuple((k[i].shape, k[i].dtype) for i in writes if k[i] is not None))

        return plain

    def nested(k: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return _described([k[i] for i in reads]), _described([k[i] for i in writes])

    return nested


@final
class Flight:
    """The process's ring of the last :attr:`size` calls (one per process, as torch's recorder)."""

    __slots__ = ("_count", "_local", "_lock", "ring", "size")

    def __init__(self, size: int) -> None:
        self.size: Final = size
        self.ring: Final[list[Entry | None]] = [None] * size
        self._count: Final = itertools.count()
        #: Per thread, the call being issued, whose emulation parts are appended to it (a mixed group's calls run
        #: on a thread of their own).
        self._local: Final = threading.local()
        self._lock: Final = threading.Lock()

    @property
    def current(self) -> Entry | None:
        """The call this thread is issuing, if any."""
        return getattr(self._local, "entry", None)

    def begin(self, rec: _Recorder, spec: Any, kargs: Sequence[Any]) -> Entry:
        """Record a call of ``spec`` on ``rec``'s group with kernel arguments ``kargs``; returns its entry."""
        describe = _DESCRIBERS.get(spec)
        if describe is None:
            describe = _DESCRIBERS[spec] = _describer(spec)
        inputs, outputs = describe(kargs)
        is_p2p = spec.key in _P2P
        if is_p2p:
            rec.p2p += 1
        else:
            rec.seq += 1
        comm = spec.comm
        operands = ()
        if comm is not None:
            operands = inputs
            inputs, outputs = comm(kargs, rec.st.size)
        entry = Entry(next(self._count), rec.st, spec.name, rec.seq, rec.p2p, is_p2p, inputs, outputs, user_site(),
                      _time_ns())
        if is_p2p:
            entry.peer = int(kargs[1]) if kargs[1] is not None else -1
        elif operands:
            entry.operands = operands
        self.ring[entry.record_id % self.size] = entry
        self._local.entry = entry
        return entry

    def part(self, spec: Any, kargs: Sequence[Any] = ()) -> None:
        """Note a building block of the call this thread is issuing, and its message size (``xccl preflight``
        prices an emulated call as the sum of its parts)."""
        entry = self.current
        if entry is not None:
            if entry.parts is None:
                entry.parts = []
                entry.part_bytes = []
            entry.parts.append(spec.name)
            if entry.part_bytes is not None:
                entry.part_bytes.append(message_bytes(spec, kargs))

    def done(self) -> None:
        """This thread's call was issued (its parts are all noted)."""
        self._local.entry = None

    def entries(self) -> list[Entry]:
        """The entries still held, oldest first."""
        with self._lock:
            held = [e for e in list(self.ring) if e is not None]
        return sorted(held, key=lambda e: e.record_id)


def finish(flight: Flight, entry: Entry, work: Any) -> None:
    """The call was issued: stamp it complete now (synchronous), or hand the entry to xccl's handle (which stamps
    it when it finds the work done), else when the backend's future completes."""
    flight.done()
    if work is None or not isinstance(work, _WORK):  # done, or a fused op's result
        entry.completed = _time_ns()
    elif hasattr(work, "entry"):  # _faults.TypedWork: no callback unless someone asks for the future
        work.entry = entry
    else:
        _on_completion(work, entry)


def _on_completion(work: Any, entry: Entry) -> None:
    """Stamp ``entry`` when the backend's future for ``work`` completes (unknown for a handle without one)."""
    try:
        fut = work.get_future()
    except (RuntimeError, AttributeError):
        return
    fut.add_done_callback(entry.done)


# ------------------------------------------------------------------------------------------ the process's ring


@dataclass
class FlightPart(Part):
    """The flight recorder's part of the process state."""

    #: The ring, once a group asked for it; None: not yet (or off, see ``off``).
    ring: Flight | None = None
    off: bool = False
    #: The dump trigger watcher (``_flight_dump``), once started.
    watch: Any = None


FLIGHT: Final = Part.register(FlightPart())


def recorder() -> Flight | None:
    """The process's ring (created on first use from the environment: :func:`capacity`), or None when off."""
    if FLIGHT.ring is None and not FLIGHT.off:
        size = capacity()
        if size:
            FLIGHT.ring = Flight(size)
        else:
            FLIGHT.off = True
    return FLIGHT.ring


# ------------------------------------------------------------------------------------------------------ the hook


class _Recorder:
    """The flight recorder's hook of one group: its sequence numbers, and the stages that record its calls."""

    __slots__ = ("flight", "p2p", "seq", "st")

    def __init__(self, st: Any, flight: Flight) -> None:
        self.st: Final = st
        self.flight: Final = flight
        #: The group's sequence numbers: collectives and point-to-point calls counted separately, as torch's
        #: recorder does (the last one given is the group's ``last_enqueued_collective``).
        self.seq = 0
        self.p2p = 0

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Record the call, its times and its completion.

        :meth:`Flight.begin`, :func:`user_site` and :func:`finish` written out in one function: this stage runs on
        every call of every group (the recorder is on by default), and a Python call costs about 0.1 us.
        """
        flight, st = self.flight, self.st
        local, ring, size, count = flight._local, flight.ring, flight.size, flight._count
        describers, p2p, work_type, known = _DESCRIBERS, _P2P, _WORK, _INTERNAL_CODE

        def recorded(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            describe = describers.get(spec)
            if describe is None:
                describe = describers[spec] = _describer(spec)
            inputs, outputs = describe(kargs)
            # The user's frame (user_site). This stage is the outermost: its caller is xccl's dispatch, skipped.
            frame: types.FrameType | None = _getframe(2)
            site = None
            while frame is not None:
                internal = known.get(frame.f_code)
                if internal is None:
                    internal = _internal(frame)
                if not internal:
                    site = frame.f_code, frame.f_lineno
                    break
                frame = frame.f_back
            frame = None
            if spec.key in p2p:
                self.p2p += 1
                entry = Entry(next(count), st, spec.name, self.seq, self.p2p, True, inputs, outputs, site, _time_ns())
                entry.peer = int(kargs[1]) if kargs[1] is not None else -1
            elif spec.comm is None:
                self.seq += 1
                entry = Entry(next(count), st, spec.name, self.seq, self.p2p, False, inputs, outputs, site, _time_ns())
            else:  # a fused op: its communication as torch's analyzer matches it, and its matmul operands
                self.seq += 1
                entry = Entry(next(count), st, spec.name, self.seq, self.p2p, False, *spec.comm(kargs, st.size), site,
                              _time_ns())
                entry.operands = inputs
            ring[entry.record_id % size] = entry
            local.entry = entry
            entry.started = entry.created
            try:
                work = inner(spec, kargs, kernel, async_op)
            finally:
                local.entry = None
            if work is None or (type(work) is not work_type and not isinstance(work, work_type)):
                entry.completed = _time_ns()  # done, or a fused op's result
            elif hasattr(work, "entry"):  # _faults.TypedWork: it stamps the entry when it finds the work done
                work.entry = entry
            else:
                _on_completion(work, entry)
            return work

        return recorded

    def inner_stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Note an emulation's building blocks as parts of the call being issued."""
        part = self.flight.part

        def noted(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            part(spec, kargs)
            return inner(spec, kargs, kernel, async_op)

        return noted


def hook(st: Any) -> _Recorder | None:
    """The flight recorder's hook of a group (``_hooks.OBSERVERS``), None when the recorder is off."""
    flight = recorder()
    return None if flight is None else _Recorder(st, flight)


def last_enqueued(st: Any) -> int:
    """The last collective sequence number the recorder gave on ``st``'s group (0: none)."""
    return next((h.seq for h in st.hooks if isinstance(h, _Recorder)), 0)
