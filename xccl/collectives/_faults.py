"""Backend faults as typed errors.

A dead peer and a silent peer look like this from gloo (torch 2.13, measured by ``tests/test_faults.py``)::

    RuntimeError: [.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28361. ...
    RuntimeError: [.../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:51091: Connection reset by peer. ...
    RuntimeError: [.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation ...

They become :class:`~xccl.PeerFailure` and :class:`~xccl.CollectiveTimeout`, carrying rank, op, group and elapsed
time, with the backend's exception chained (``raise ... from exc``) so that nothing is hidden: the original text
is both quoted in the message and reachable as ``__cause__``. Anything unrecognised is re-raised unchanged.

A vendor's own messages come first: a plugin declares what its error codes mean
(:attr:`~xccl.plugin.VendorRuntime.faults`: HCCL's EI0002 is a collective that outlasted ``HCCL_EXEC_TIMEOUT``,
EI0006 a communicator that could not connect within ``HCCL_CONNECT_TIMEOUT``); a connect failure names the members
that never reached the group's first collective (``_state.missing_members``).

This is a hook of every group's pipeline (``_hooks``): its stage translates what the call raises; an asynchronous
call's fault surfaces later, in ``Work.wait()``, so its handle is a :class:`TypedWork` whose ``wait()`` translates
too (the synchronous path gains no object). It is a ``torch.distributed.Work``, so xccl's c10d process group returns
it to torch (whose synchronous wrappers then wait on it: typed faults reach ``torch.distributed`` callers) and to
C++ callers through the pybind trampoline, whose ``work->wait()`` runs this ``wait()``: the functional collectives'
``wait_tensor``, DDP's wait on its unused-parameter map.

What C++ waits on is often the work's *future*, not the work: DDP's reducer waits on each bucket's future at the end
of the backward pass, and a C++ future carries an error as text only (a Python callback's exception becomes a
``RuntimeError`` there, ``torch/csrc/jit/python/pybind_utils.h``: ``PythonFutureWrapper::then``). What carries a
Python exception through the autograd engine unchanged is a final callback of the backward pass that raises it
(``Variable._execution_engine.queue_callback``: the engine stores the Python error and raises it at the caller's
``backward()``, ``torch/csrc/autograd/python_engine.cpp``). So a work handed out while a backward pass runs (this
thread is in a graph task: ``torch._C._current_graph_task_id()``) is also waited for, typed, by one final callback
per graph task: queued at the first such work, it runs before the reducer's own (the reducer queues its callback
after it issued the last bucket), and waits for every work the task was given. A fault is then the typed error at
``loss.backward()``, on every survivor; without one, the works were complete or about to be, and the reducer finds
them done.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, final

import torch

from ..errors import CollectiveTimeout, PeerFailure, XcclError
from ..plugin._vendor_runtime import Fault, VendorFault
from ..plugin._work import ForwardingWork, future_of
from ._flight import STAMPS, stamp
from ._health._liveness import Verdict, lost_peers
from ._state import PROCESS, _bare, missing_members

__all__ = ["LISTENERS", "TypedWork", "classify", "handled_by_caller", "hook", "notify", "translate", "watched_loss"]

#: Called with (error name, global rank, op, group name) whenever a backend fault is raised typed: the flight
#: recorder dumps then (``_flight_dump`` adds itself).
LISTENERS: list[Callable[[str, int, str, str], None]] = []

#: Lower-case fragments of a backend message that mean a peer's process or connection is gone.
#: gloo: "Connection reset by peer", "Connection closed by peer", "Broken pipe"; NCCL: "remote process exited",
#: ncclRemoteError; TCPStore: "Connection reset", "Socket Timeout" is *not* here (that is a timeout).
_PEER_GONE: Final = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
                     "remote process exited", "ncclremoteerror", "socket closed", "end of file")
#: Fragments that mean the backend gave up waiting. gloo: "Timed out waiting 5000ms for recv operation";
#: NCCL watchdog: "Watchdog caught collective operation timeout"; TCPStore: "wait timeout after 5000ms".
_TIMEOUT: Final = ("timed out", "timeout")
_WAITED: Final = re.compile(r"(\d+)\s*ms\b")


def classify(text: str) -> type[XcclError] | None:
    """The typed error class a backend message stands for (:class:`PeerFailure`, :class:`CollectiveTimeout`) or None.

    A dead peer is tested first: gloo's reset messages mention a "hanging" worker but never a timeout, while a
    timeout message never mentions a closed connection.
    """
    low = text.lower()
    if any(s in low for s in _PEER_GONE):
        return PeerFailure
    if any(s in low for s in _TIMEOUT):
        return CollectiveTimeout
    return None


def _waited(text: str) -> float:
    """Seconds a backend says it waited ("Timed out waiting 5000ms"), when the caller did not time the call."""
    match = _WAITED.search(text)
    return int(match.group(1)) / 1000.0 if match else 0.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _timeout_hint() -> str:
    world, settings = PROCESS.world, PROCESS.watchdog
    if settings is not None and settings.exec_timeout:
        return (f"the vendor ends a collective after {settings.exec_env}={settings.exec_timeout:g} s, its own "
                f"execution timeout (set {settings.exec_env} to change it)")
    seconds = f"{world.timeout.total_seconds():g} s" if world is not None else "the timeout"
    return f"the timeout is {seconds} (xccl.init(timeout=...) or XCCL_TIMEOUT)"


def _vendor_kind(ctx: Any, text: str) -> Fault | None:
    """What the vendor's own message means, from the plugin's declared faults (first match)."""
    runtime = getattr(ctx, "runtime", None)  # a dispatch context; tests may pass a lighter one
    faults: tuple[VendorFault, ...] = () if runtime is None else runtime.plugin.vendor_runtime().faults
    return next((fault.kind for fault in faults if fault.fragment in text), None)


def _connect_failure(exc: BaseException, ctx: Any, where: dict[str, Any]) -> CollectiveTimeout:
    """The typed error for a communicator that could not connect: who never arrived, and what bounds it."""
    settings = PROCESS.watchdog
    var = f"{settings.connect_env}={settings.connect_timeout:g} s" if settings and settings.connect_timeout else (
        "the vendor's connect timeout")
    late = missing_members(ctx.group, ctx.ranks)
    who = (f"rank(s) {late} had not reached their first collective on this group" if late else
           "every member had arrived, so the peers gave up before this rank did" if late == [] else
           "some member did not reach its first collective on this group in time")
    return CollectiveTimeout(
        f"the vendor could not connect the group's communicator within {var} ({_first_line(exc)}): {who}. The "
        "vendor connects a group at its first collective, so a rank that reaches it late (a first compile, a slow "
        "checkpoint load) makes its peers give up: call xccl.runtime.connect(group) on every rank right after "
        f"creating the group, which connects it while the ranks are together, or raise {var.split('=')[0]}",
        **where,
    )


def translate(exc: BaseException, ctx: Any, op: str, started: float | None = None) -> BaseException:
    """The typed error for a backend exception raised during ``op`` on ``ctx``'s group, or ``exc`` itself.

    Args:
        exc: what the backend raised.
        ctx: the group's :class:`~xccl.collectives._state.GroupState`.
        op: the public collective's name.
        started: ``time.monotonic()`` when the call began, for the elapsed time.

    The caller chains the result (``raise translate(exc, ...) from exc``).
    """
    if isinstance(exc, XcclError):
        return exc
    typed = _typed(exc, ctx, op, started)
    if typed is not exc:
        notify(type(typed).__name__, ctx.ranks[ctx.rank], op, str(ctx.name))
    return typed


def notify(kind: str, rank: int, op: str, group: str) -> None:
    """A typed fault ``kind`` is being raised on global rank ``rank`` in ``op`` on ``group``: tell the
    :data:`LISTENERS` (the flight recorder dumps, here and on every rank)."""
    for listener in LISTENERS:
        listener(kind, rank, op, group)


def _typed(exc: BaseException, ctx: Any, op: str, started: float | None) -> BaseException:
    vendor = _vendor_kind(ctx, str(exc))
    kind = classify(str(exc)) if vendor is None else PeerFailure if vendor is Fault.PEER_LOST else CollectiveTimeout
    if kind is None:
        return exc
    elapsed = time.monotonic() - started if started is not None else _waited(str(exc))
    where: dict[str, Any] = {"rank": ctx.ranks[ctx.rank], "op": op, "group": ctx.name, "elapsed": elapsed}
    if vendor is Fault.CONNECT:
        return _connect_failure(exc, ctx, where)
    members = list(ctx.ranks)
    if kind is CollectiveTimeout:
        # A survivor that was not talking to a lost rank only times out (its neighbours gave up on the step). When
        # a rank is found gone (or another survivor already named it), this is that peer's failure, with the same
        # ranks on every survivor; a silent rank that is alive stays a timeout.
        verdict = lost_peers(members)
        if verdict is not None and verdict.ranks:
            return _peer_failure(_first_line(exc), members, verdict, where, waited=True)
        return CollectiveTimeout(
            f"no answer from a peer of ranks {members} ({_first_line(exc)}). A peer is hung, slow, dead without "
            f"closing its connection, or called a different collective; {_timeout_hint()}. "
            "Look at the other ranks' logs; xccl.init(check=True) (or XCCL_CHECK=1) turns mismatched calls into "
            "CollectiveMismatch naming what each rank called",
            **where,
        )
    # Which peer: gloo's text names a connection, not a rank (and not always the lost one's); look (_liveness).
    return _peer_failure(_first_line(exc), members, lost_peers(members), where)


def watched_loss(verdict: Verdict, ctx: Any, op: str, started: float) -> PeerFailure:
    """The :class:`PeerFailure` the health watch raises (``_health``): a look found ``verdict``'s ranks lost while
    this call on ``ctx``'s group waited, the backend having reported nothing."""
    where: dict[str, Any] = {"rank": ctx.ranks[ctx.rank], "op": op, "group": ctx.name,
                             "elapsed": time.monotonic() - started}
    notify("PeerFailure", ctx.ranks[ctx.rank], op, str(ctx.name))
    return _peer_failure("xccl's health watch looked while the call waited; the backend had reported nothing",
                         list(ctx.ranks), verdict, where)


def _peer_failure(seen: str, members: list[int], verdict: Verdict | None, where: dict[str, Any], *,
                  waited: bool = False) -> PeerFailure:
    lost = verdict.text if verdict is not None else None
    ranks = verdict.ranks if verdict is not None else ()
    # Ranks named alike on every survivor (_liveness: the first verdict wins) can be shrunk away in place, while
    # the store lives (the survivors meet there).
    then = ("shrink the world to the survivors (dist.shrink_group(err.ranks), docs/elastic.md) or restart the job "
            "(torchrun --max-restarts)" if ranks and verdict is not None and verdict.agreed else
            "restart the job (an elastic launcher such as torchrun --max-restarts does this)")
    how = "this rank timed out waiting on a peer that talked to it: " if waited else ""
    return PeerFailure(
        f"{lost or f'a peer of ranks {members} closed its connection'} ({how}{seen}). "
        f"{'' if lost else 'It probably died: its own log says why. '}The group cannot be used any more; {then}",
        ranks=ranks, **where,
    )


@final
class TypedWork(ForwardingWork):
    """An asynchronous collective's handle whose ``wait()`` raises typed faults.

    ``wait`` and ``synchronize`` translate a dead or silent peer as the synchronous path does, with the elapsed
    time counted from the call.

    Args:
        work: the handle the kernel returned.
        ctx: the group's dispatch context.
        op: the public collective's name.
        started: ``time.monotonic()`` at the call.
        outputs: the tensors the call writes (its future's value where the backend's work has no future).
    """

    __slots__ = ("_ctx", "_op", "_outputs", "_started", "entry")

    def __init__(self, work: Any, ctx: Any, op: str, started: float, outputs: Sequence[Any] = ()) -> None:
        super().__init__(work)
        self._ctx = ctx
        self._op = op
        self._started = started
        self._outputs = outputs
        #: The flight recorder's record of the call (``_flight``), stamped complete when this handle finds the work
        #: done: at ``wait()``, ``is_completed()``, or from the future once someone asks for it.
        self.entry: Any = None

    def is_completed(self) -> bool:
        """Whether the collective finished (successfully or not)."""
        done = bool(self.work.is_completed())
        if done and self.entry is not None:
            stamp(self.entry)
        return done

    def get_future(self) -> Any:
        """The backend's future (its errors are the backend's own: ``wait()`` is the typed path)."""
        fut = future_of(self.work, self._outputs)
        if self.entry is not None:
            # Who waits on the future (DDP's reducer) never calls wait(): its completion comes from the backend.
            fut.add_done_callback(partial(stamp, self.entry))
        return fut

    def _fault(self, exc: RuntimeError) -> BaseException:
        return translate(exc, self._ctx, self._op, self._started)

    def wait(self, timeout: _dt.timedelta | None = None) -> bool:
        """Wait for completion (``Work.wait``); raises :class:`~xccl.PeerFailure` or :class:`~xccl.CollectiveTimeout`."""
        done = super().wait(timeout)
        if (done or timeout is None) and self.entry is not None:
            stamp(self.entry)
        return done

    def synchronize(self) -> None:
        """``Work.synchronize`` with typed faults."""
        try:
            self.work.synchronize()
        except RuntimeError as exc:
            raise self._fault(exc) from exc

    def __repr__(self) -> str:
        return f"<xccl TypedWork {self._op} on group {self._ctx.name!r}: {self.work!r}>"


# ------------------------------------------------------------------------------------------------------ the hook

_monotonic: Final = time.monotonic
_graph_task: Final = torch._C._current_graph_task_id
#: Graph task id -> the works handed out while it ran, which its final callback waits for (``_guard``); at most a
#: few tasks are kept (a task that failed before its final callbacks never comes back for its works).
_IN_BACKWARD: dict[int, list[Any]] = {}
_KEPT: Final = 8
#: The handle classes whose ``wait()`` raises typed faults already (the mismatch detector adds its own).
TYPED: Final[set[type]] = {TypedWork}
STAMPS.add(TypedWork)


class _Faults:
    """The typed-faults hook of one group (see the module docstring)."""

    __slots__ = ("st",)

    def __init__(self, st: Any) -> None:
        self.st = st

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Translate what the call raises; hand out typed handles."""
        st = self.st
        # Innermost (no detector on the group), this stage calls the kernel itself: a frame less on every call.
        direct = inner is _bare

        def typed(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            started = _monotonic()
            try:
                work = kernel(*kargs, async_op) if direct else inner(spec, kargs, kernel, async_op)
            except RuntimeError as exc:
                error = translate(exc, st, spec.name, started)
                if error is exc:
                    raise
                raise error from exc
            if work is None or spec.fused:
                return work
            if type(work) not in TYPED:  # the detector's handles are typed already
                work = TypedWork(work, st, spec.name, started, kargs)
            if _graph_task() != -1:
                _guard(work)
            return work

        return typed


def hook(st: Any) -> _Faults:
    """Every group's typed faults (``_hooks.OBSERVERS``)."""
    return _Faults(st)


def _guard(work: Any) -> None:
    """Have the running backward pass wait for ``work``, typed, before it ends (see the module docstring)."""
    task = _graph_task()
    pending = _IN_BACKWARD.get(task)
    if pending is None:
        while len(_IN_BACKWARD) >= _KEPT:
            del _IN_BACKWARD[next(iter(_IN_BACKWARD))]
        pending = _IN_BACKWARD[task] = []
        torch.autograd.Variable._execution_engine.queue_callback(partial(_settle, task))
    pending.append(work)


def handled_by_caller(work: Any) -> None:
    """The caller handles ``work``'s faults itself: the running backward pass no longer waits for it at its end
    (:func:`_guard`, which raises there for DDP's reducer). For a caller that reports faults instead of raising
    them (torchft's process groups: ``xccl.integrations.torchft``), where raising would end the step it means to
    discard."""
    pending = _IN_BACKWARD.get(_graph_task())
    if pending is not None and any(w is work for w in pending):
        pending[:] = [w for w in pending if w is not work]


def _settle(task: int) -> None:
    """The final callback of graph task ``task``: wait for every work it handed out (a fault raises, typed)."""
    for work in _IN_BACKWARD.pop(task, ()):
        work.wait()
