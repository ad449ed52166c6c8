"""The flight recorder: what every collective through xccl was, where the user called it, and when it completed.

A hook of every group's pipeline (``_hooks``): each call a group runs (``xccl.<op>``, ``torch.distributed.<op>`` on
xccl's process group, DDP and FSDP2 through it, the fused ops, the graph ops at run time) becomes one :class:`Entry`
in a process-wide ring of the last N calls. An entry keeps:

* the group (name, description, members) and its per-group sequence number (``collective_seq_id``; point-to-point
  calls count separately, ``p2p_seq_id``, as in torch's recorder);
* the op as the user called it and, for an emulation (or a fused op's portable version), the names of its parts
  (the hook's inner stage appends each building block to the call the group is issuing);
* dtypes and shapes (never the tensors: the ring must not keep memory alive);
* the user's call site: the first frame outside xccl, torch and the vendor's or framework's adaptor (the rule of
  ``ops/_warn.py``);
* timestamps (``time.time_ns()``, the clock torch's recorder uses): ``created`` when dispatch saw the call, which
  is also ``started`` (xccl cannot see when a device starts a kernel: best effort),
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

import collections
import itertools
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..errors import InitError
from ..ops import _warn
from ..ops._specs import Access, Kind
from ..ops._vocab import Collective
from ._state import Part

__all__ = [
    "DEFAULT_ENTRIES", "FLIGHT", "STAMPS", "Entry", "Flight", "Mark", "capacity", "hook", "mark", "message_bytes",
    "recorder", "stamp", "user_frame",
]

#: Entries kept when the recorder is on without a size (torch's default for ``TORCH_FR_BUFFER_SIZE`` is 2000).
DEFAULT_ENTRIES: Final = 2000
_time_ns: Final = time.time_ns
_getframe: Final = sys._getframe
#: Whether a frame is not the user's (xccl, torch, the deprecation wrappers, the adaptors): ``ops/_warn.py``'s
#: rule, and its cache of the answer per code object.
_internal: Final = _warn.internal
_INTERNAL_CODE: Final = _warn.INTERNAL_CODE
_TENSOR: Final = torch.Tensor
_DTYPE: Final = torch.dtype
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
    """One recorded call, as the ring's readers see it (built from the ring's record when read)."""

    __slots__ = ("completed", "created", "group", "inputs", "is_p2p", "note", "op", "operands", "outputs", "p2p_seq",
                 "part_bytes", "parts", "peer", "record_id", "seq", "site", "started")

    def __init__(self, rec: list[Any]) -> None:
        spec = rec[_SPEC]
        #: Process-wide order of the call (torch's ``record_id``).
        self.record_id: int = rec[_ID]
        #: The group's state (name, members, description are read at dump time).
        self.group: Any = rec[_GROUP]
        #: The op as the user called it (``all_reduce``, ``all_gather_into_tensor``...).
        self.op: str = spec.name
        #: Per-group sequence numbers: collectives and point-to-point calls counted separately, from 1 (torch's).
        self.seq: int = rec[_SEQ]
        self.p2p_seq: int = rec[_P2P_SEQ]
        self.is_p2p: bool = spec.key in _P2P
        #: ``(shape, dtype)`` of each tensor read, and of each tensor written.
        inputs, outputs = rec[_INPUTS], rec[_OUTPUTS]
        if type(outputs) is _DTYPE:  # the op's one tensor, read and written (Spec.solo_index): its shape, dtype
            inputs = outputs = ((inputs, outputs),)
        elif spec.pair is not None:  # the tensor read, the tensor written (Spec.pair): each (shape, dtype)
            inputs, outputs = (inputs,), (outputs,)
        self.inputs: tuple[Any, ...] = inputs
        self.outputs: tuple[Any, ...] = outputs
        #: The user's frame: its code object and line (formatted only when dumped).
        code = rec[_CODE]
        self.site: tuple[types.CodeType, int] | None = None if code is None else (code, _line(code, rec[_LASTI]))
        #: Peer group rank of a point-to-point call (-1 otherwise).
        self.peer: int = rec[_EXTRA] if self.is_p2p else -1
        #: A fused op's matmul operands, ``(shape, dtype)`` each (its ``inputs`` and ``outputs`` are its
        #: communication's, as torch's analyzer matches them).
        self.operands: tuple[Any, ...] = rec[_EXTRA] if spec.comm is not None else ()
        #: What a :class:`Mark` says (an event of the group's life, not a call: ``shrink_group``); "" for a call.
        self.note: str = rec[_EXTRA] if type(spec) is Mark else ""
        #: The emulation's parts, in issue order, and the bytes each read or wrote, whichever is larger (nccl-tests'
        #: message size); None: a native call.
        parts = rec[_PARTS]
        self.parts: list[str] | None = None if parts is None else list(parts[0])
        self.part_bytes: list[int] | None = None if parts is None else list(parts[1])
        #: ``time.time_ns()`` at the call, when handed to the backend (the same moment: xccl cannot see when a
        #: device starts a kernel), when known complete (0: not yet).
        self.created: int = rec[_CREATED]
        self.started: int = self.created
        self.completed: int = rec[_COMPLETED]

    def __repr__(self) -> str:
        return f"<xccl flight entry #{self.record_id} {self.op} seq {self.seq} on group {self.group.name!r}>"


# A record in the ring: one list per call (one allocation; the stage below is on every call's path), read through
# Entry. Its fields, by index (the user's frame as its code object and the offset of its last instruction: the line
# is found from them when the entry is read, since ``frame.f_lineno`` scans the code's line table up to that
# offset, which costs microseconds in a long function such as a training loop):
_ID, _GROUP, _SPEC, _SEQ, _P2P_SEQ, _INPUTS, _OUTPUTS, _CODE, _LASTI, _CREATED, _COMPLETED, _PARTS, _EXTRA = range(13)


def _line(code: types.CodeType, lasti: int) -> int:
    """The line of the instruction at byte offset ``lasti`` of ``code`` (what ``frame.f_lineno`` gives)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


#: Handle classes that stamp their call's record complete themselves when they find the work done (an ``entry``
#: attribute the recorder sets to the record): ``_faults.TypedWork``.
STAMPS: Final[set[type]] = set()


def stamp(rec: list[Any], _fut: Any = None) -> None:
    """Stamp a record complete, once (a handle that found the work done, or the backend future's callback)."""
    if not rec[_COMPLETED]:
        rec[_COMPLETED] = _time_ns()


def user_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The first frame from ``frame`` outwards outside xccl, torch and the adaptors: the user's call (None when the
    call came from C++ alone). The rule is ``ops/_warn.py``'s :func:`~xccl.ops._warn.internal`; its cache is read
    here first."""
    known = _INTERNAL_CODE
    while frame is not None:
        entry = known.get(id(frame.f_code))
        if not (_internal(frame) if entry is None else entry[1]):
            return frame
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
    """The process's ring of the last ``size`` calls (one per process, as torch's recorder)."""

    __slots__ = ("_count", "_lock", "ring")

    def __init__(self, size: int) -> None:
        #: The records, oldest first (a deque drops the oldest as it appends: no index to compute per call).
        self.ring: Final[collections.deque[list[Any]]] = collections.deque(maxlen=size)
        self._count: Final = itertools.count()
        self._lock: Final = threading.Lock()

    def entries(self) -> list[Entry]:
        """The entries still held, oldest first."""
        with self._lock:
            held = list(self.ring)
        # Threads append in about the order they took their ids (a mixed group's worker and the main thread).
        return sorted((Entry(r) for r in held), key=lambda e: e.record_id)


def _on_completion(work: Any, rec: list[Any]) -> None:
    """Stamp ``rec`` when the backend's future for ``work`` completes (unknown for a handle without one)."""
    try:
        fut = work.get_future()
    except (RuntimeError, AttributeError):
        return
    fut.add_done_callback(partial(stamp, rec))


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

    __slots__ = ("current", "flight", "p2p", "seq", "st")

    def __init__(self, st: Any, flight: Flight) -> None:
        self.st: Final = st
        self.flight: Final = flight
        #: The group's sequence numbers: collectives and point-to-point calls counted separately, as torch's
        #: recorder does (the last one given is the group's ``last_enqueued_collective``).
        self.seq = 0
        self.p2p = 0
        #: The record of the call issued last on the group (its emulation's building blocks are noted on it).
        self.current: list[Any] | None = None

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Record the call, its times and its completion.

        Written out in one function, touching as little as it can: this stage is on every call of every group
        (the recorder is on by default), and measured between two processes on two shared cores, a few hundred
        nanoseconds of work here (a thread-local store, an object with sixteen fields) cost microseconds per call
        (``benchmarks/flight_recorder.py``).
        """
        flight, st = self.flight, self.st
        record, count = flight.ring.append, flight._count
        describers, p2p, work_type, known, stamps = _DESCRIBERS, _P2P, _WORK, _INTERNAL_CODE, STAMPS

        def recorded(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            solo, pair = spec.solo_index, spec.pair
            extra: Any = None
            if solo is not None:  # all_reduce, broadcast, reduce: the tensor's shape and dtype (Entry reads them)
                t = kargs[solo]
                inputs, outputs = t.shape, t.dtype
                self.seq += 1
            elif pair is not None:  # all_gather_into_tensor, ...: the tensor read, the one written (Entry reads them)
                t, u = kargs[pair[0]], kargs[pair[1]]
                inputs, outputs = (t.shape, t.dtype), (u.shape, u.dtype)
                self.seq += 1
            else:
                describe = describers.get(spec)
                if describe is None:
                    describe = describers[spec] = _describer(spec)
                inputs, outputs = describe(kargs)
                if spec.key in p2p:
                    self.p2p += 1
                    extra = int(kargs[1]) if kargs[1] is not None else -1
                else:
                    self.seq += 1
                    if spec.comm is not None:  # a fused op: its communication as torch's analyzer matches it
                        extra = inputs
                        inputs, outputs = spec.comm(kargs, st.size)
            # This stage is the outermost: its caller is xccl's dispatch, whose caller is xccl's too (a public
            # function, a c10d method, a fused or graph op): the walk to the user's frame starts past both (each
            # frame it looks at is a new object to Python). The walk is user_frame's, written out (a call less).
            try:
                frame: Any = _getframe(3)
            except ValueError:  # called from C++ with no Python frame above xccl's (DDP's reducer)
                frame = None
            code = lasti = None
            while frame is not None:
                code = frame.f_code
                entry = known.get(id(code))
                if not (_internal(frame) if entry is None else entry[1]):
                    lasti = frame.f_lasti
                    break
                frame = frame.f_back
            else:
                code = None
            rid = next(count)
            rec = [rid, st, spec, self.seq, self.p2p, inputs, outputs, code, lasti, _time_ns(), 0, None, extra]
            record(rec)
            # Building blocks are issued inside their call (never a call inside another on the same group), so the
            # last call's record is the one to note them on: nothing to restore afterwards.
            self.current = rec
            work = inner(spec, kargs, kernel, async_op)
            if work is None:
                rec[_COMPLETED] = _time_ns()
            elif type(work) in stamps:  # _faults.TypedWork: it stamps the record when it finds the work done
                work.entry = rec
            elif isinstance(work, work_type):
                _on_completion(work, rec)
            else:
                rec[_COMPLETED] = _time_ns()  # a fused op's result
            return work

        return recorded

    def inner_stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Note an emulation's building blocks as parts of the call being issued, with their message sizes
        (``xccl preflight`` prices an emulated call as the sum of its parts)."""

        def noted(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            rec = self.current
            if rec is not None:
                if rec[_PARTS] is None:
                    rec[_PARTS] = ([], [])
                rec[_PARTS][0].append(spec.name)
                rec[_PARTS][1].append(message_bytes(spec, kargs))
            return inner(spec, kargs, kernel, async_op)

        return noted


@final
@dataclass(frozen=True, slots=True)
class Mark:
    """The "op" of a record that marks an event in a group's life (``shrink_group``), not a call: no sequence
    number, no tensors; its entry's :attr:`Entry.note` says what happened."""

    name: str
    key: None = None
    comm: None = None
    pair: None = None


def mark(st: Any, name: str, note: str) -> None:
    """Record the event ``name`` on ``st``'s group (when the recorder is on), completed, with ``note``."""
    flight = recorder()
    if flight is None:
        return
    try:
        frame = user_frame(_getframe(1))
    except ValueError:  # pragma: no cover - always called from Python
        frame = None
    now = _time_ns()
    rid = next(flight._count)
    code, lasti = (None, None) if frame is None else (frame.f_code, frame.f_lasti)
    flight.ring.append([rid, st, Mark(name), 0, 0, (), (), code, lasti, now, now, None, note])


def hook(st: Any) -> _Recorder | None:
    """The flight recorder's hook of a group (``_hooks.OBSERVERS``), None when the recorder is off."""
    flight = recorder()
    return None if flight is None else _Recorder(st, flight)


def last_enqueued(st: Any) -> int:
    """The last collective sequence number the recorder gave on ``st``'s group (0: none)."""
    return next((h.seq for h in st.hooks if isinstance(h, _Recorder)), 0)
