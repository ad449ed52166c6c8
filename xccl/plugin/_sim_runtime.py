"""The vendor's run time in simulation, as its :class:`~xccl.plugin.VendorRuntime` declares it.

The capability table makes the simulated group refuse what the vendor refuses (``_sim``); this module makes it
*fail* where the vendor fails, so that a test on the simulation goes red where the hardware would: the watchdog,
the execution timeout, lazy connect and the SDK's patches of ``torch.distributed``, as docs/plugin-guide.md (section
9) tables them. Where the simulation differs: the execution timeout's error is raised by ``wait()``, not at the
next synchronisation of the stream; gloo closes the connections of a collective that timed out, so a rank that
arrives after its peers gave up sees them gone at once (as does a member that arrives after its peers gave up
connecting), where the vendor's would wait out its own timeout; a plain send or recv connects no communicator (HCCL
gives each pair of ranks one of its own, not simulated). Tests that cannot wait a vendor's shortest connect timeout
(HCCL: 120 s) set ``XCCL_SIM_CONNECT_TIMEOUT``. Memory per communicator is not simulated, but a size the vendor
refuses (torch_npu: ``HCCL_BUFFSIZE`` not positive) fails the group's connect with the vendor's message.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import importlib
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from torch._C._distributed_c10d import PrefixStore

from ..ops._parts import Part
from ._fake_world import transport
from ._sim_stream import STREAM, StreamWork, VendorWork
from ._vendor_runtime import CommMemory, Completion, ErrorHandling, LazyConnect, TorchPatch, VendorRuntime, Watchdog
from ._work import Work

__all__ = [
    "SIM_CONNECT_ENV",
    "sim_wait",
    "GroupRuntime",
    "WatchSettings",
    "install_patches",
    "installed_patches",
    "process_mode",
    "remove_patches",
    "watch_settings",
]

logger = logging.getLogger(__name__)

#: How often the simulated watchdog looks at the collectives in flight (torch_npu: kWatchdogThreadSleepMillis).
_POLL: Final = 0.05
#: How often a rank waiting to connect looks at the store.
_CONNECT_POLL: Final = 0.01
#: ``Backend`` methods that need only two ranks, not the group's communicator, unless batched.
_POINT_TO_POINT: Final = frozenset({"send", "recv", "recv_anysource"})
#: Seconds the simulated connect waits instead of the vendor's connect timeout (a test's shortcut: CANN takes
#: ``HCCL_CONNECT_TIMEOUT`` of 120 s at least); the vendor's timeout is still the one its messages give.
SIM_CONNECT_ENV: Final = "XCCL_SIM_CONNECT_TIMEOUT"
#: Connect-timeout warnings given in this process (variable=value), one each.
_OUT_OF_RANGE: set[str] = set()

# --------------------------------------------------------------------------------------------------- watchdog

#: The mode per variable, read once per process: torch_npu keeps the first value it reads (a ``const static``).
_MODES: dict[str, ErrorHandling] = {}
_MODES_LOCK = threading.Lock()


def process_mode(watchdog: Watchdog) -> ErrorHandling:
    """The watchdog's mode in this process, read from the environment the first time a group needs it.

    Raises:
        RuntimeError: the variable is not 0, 1, 2 or 3 (the vendor's check when it creates its first group).
    """
    with _MODES_LOCK:
        mode = _MODES.get(watchdog.mode_env)
        if mode is None:
            try:
                mode = watchdog.mode(os.environ)
            except ValueError as exc:
                raise RuntimeError(str(exc)) from None
            _MODES[watchdog.mode_env] = mode
        return mode


@final
@dataclass(frozen=True, slots=True)
class WatchSettings:
    """What the vendor makes of one group's timeout."""

    mode: ErrorHandling
    #: Seconds after which the watchdog fires (:data:`math.inf`: never).
    timeout: float
    #: Seconds after which the vendor's own execution timeout fails a collective (:data:`math.inf`: never).
    exec_timeout: float
    #: The vendor's warning at group creation, or None.
    warning: str | None


def watch_settings(watchdog: Watchdog, requested: float, env: Mapping[str, str], mode: ErrorHandling
                   ) -> WatchSettings:
    """The vendor's rules for a group created with a timeout of ``requested`` seconds, in ``mode`` and ``env``."""
    pinned = {**env, watchdog.mode_env: str(mode.value)}  # the process's mode, whatever the variable says now
    exec_s = watchdog.exec_timeout(env)
    return WatchSettings(
        mode=mode,
        timeout=math.inf if mode is ErrorHandling.NO_HANDLING else watchdog.group_timeout(requested, pinned),
        exec_timeout=math.inf if exec_s == 0 else exec_s,
        warning=watchdog.creation_warning(requested, pinned),
    )


@dataclass(slots=True)
class _Watched:
    """One collective in flight, as the watchdog sees it."""

    work: Any
    started: float
    timeout: float
    mode: ErrorHandling
    describe: str
    rank: int
    fired: bool = False


class _WatchdogThread(Part):
    """One thread per process watching every simulated collective in flight, as torch_npu's watchdog does.

    A part of the process's state: ``xccl.shutdown`` stops it (the works it watches hold their groups' connections
    and store); a new world's first collective starts it again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: list[_Watched] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._at_exit = False

    def watch(self, entry: _Watched) -> None:
        with self._lock:
            self._inflight.append(entry)
            if self._thread is None or not self._thread.is_alive():
                if not self._at_exit:
                    # Stopped before the interpreter tears down: a daemon thread still inside work.is_completed()
                    # (C++) while the process's static objects are destroyed ended jobs with "terminate called
                    # without an active exception" (SIGABRT) after training had finished.
                    atexit.register(self.stop)
                    self._at_exit = True
                self._stopping.clear()
                self._thread = threading.Thread(target=self._loop, name="xccl-sim-watchdog", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End the thread and drop the works it watched (``xccl.shutdown``, interpreter exit)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * _POLL + 1.0)
        with self._lock:
            self._inflight.clear()

    reset = stop

    def _loop(self) -> None:
        while not self._stopping.wait(_POLL):
            now = time.monotonic()
            with self._lock:
                entries = list(self._inflight)
            done = []
            for entry in entries:
                try:
                    completed = bool(entry.work.is_completed())
                except RuntimeError:
                    completed = True  # failed: its wait() reports it
                if completed:
                    done.append(entry)
                elif not entry.fired and now - entry.started > entry.timeout:
                    entry.fired = True
                    _fire(entry, now)
            if done:
                with self._lock:
                    self._inflight = [e for e in self._inflight if e not in done]


_WATCHDOG: Final = Part.register(_WatchdogThread())


def _fire(entry: _Watched, now: float) -> None:
    """What the vendor's watchdog does when a collective outlasts its timeout (torch_npu's ``checkTimeout`` and
    ``handleException``)."""
    message = (f"[Rank {entry.rank}] Watchdog caught collective operation timeout: {entry.describe} ran for "
               f"{round((now - entry.started) * 1000)} milliseconds before timing out.")
    logger.error("%s (simulated)", message)
    if not entry.mode.tears_down:
        return  # CleanUpOnly / NoHandling: the process lives; the collective fails by the execution timeout
    # torch_npu rethrows on its watchdog thread, which terminates the process: nothing reaches Python.
    sys.stderr.write(
        f"{message}\nSome collective operations have failed or timed out. To avoid data inconsistency, we are taking "
        f"the entire process down.\nterminate called after throwing an instance of 'std::runtime_error'\n  what():  "
        f"{message} (xccl simulation of the vendor's watchdog)\n"
    )
    sys.stderr.flush()
    os.abort()


# ------------------------------------------------------------------------------------------------------ works


# ------------------------------------------------------------------------------------------------ per group


class GroupRuntime:
    """The declared run time of one simulated group: its watchdog, execution timeout, lazy connect and batches.

    Args:
        runtime: the vendor's declaration.
        opts: torch's ``_DistributedBackendOptions`` for the group.
        vendor: the vendor's process-group class name, for the watchdog's messages (``"ProcessGroupHCCL"``).
    """

    def __init__(self, runtime: VendorRuntime, opts: Any, vendor: str) -> None:
        self._rank: Final = int(opts.group_rank)
        self._vendor: Final = vendor.removeprefix("ProcessGroup") or vendor
        self._seq = 0
        wd = runtime.watchdog
        self.settings: Final = (None if wd is None
                                else watch_settings(wd, opts.timeout.total_seconds(), os.environ, process_mode(wd)))
        self._exec_error: Final = "" if wd is None or self.settings is None or math.isinf(
            self.settings.exec_timeout) else wd.exec_error.format(exec_s=self.settings.exec_timeout)
        if self.settings is not None and self.settings.warning:
            warnings.warn(self.settings.warning, UserWarning, stacklevel=2)
        lazy = runtime.lazy_connect
        self._connector: Final = None if lazy is None else _Connector(lazy, opts, runtime.comm_memory)
        if lazy is not None:
            _warn_out_of_range(lazy)
        #: Whether the vendor's works complete on a device stream, where a lost peer holds it (``_sim_stream``).
        self._streamed: Final = runtime.completion is not Completion.BLOCKING
        self._teardown_waits: Final = runtime.teardown_syncs != ""
        #: The works held back while coalescing (None: not coalescing).
        self._batch: list[Any] | None = None

    def gloo_timeout(self, requested: _dt.timedelta) -> _dt.timedelta:
        """The timeout the simulated group's gloo gets: the vendor's execution timeout where it has one."""
        s = self.settings
        if s is None or math.isinf(s.exec_timeout):
            return requested
        return _dt.timedelta(seconds=s.exec_timeout)

    @property
    def connected(self) -> bool | None:
        """Whether the group's communicator connected (None: the vendor connects at creation)."""
        return None if self._connector is None else self._connector.connected

    def before(self, key: str) -> None:
        """Before a collective (``Backend`` method ``key``): connect on the group's first, raising the vendor's
        connect error. A plain send or recv is left out: HCCL runs it on a communicator of its own per pair of ranks
        (Ascend/pytorch@462f4e1 ``ProcessGroupHCCL.cpp:4428-4439``, ``:4771-4783``), which only those two connect
        and which is not simulated; in a batch (:meth:`coalescing`) it runs on the group's communicator, which
        every member connects."""
        if (self._connector is not None and not self._connector.connected
                and (key not in _POINT_TO_POINT or self._batch is not None)):
            self._connector.connect()

    def after(self, method: str, work: Any) -> Any:
        """After a collective was issued: watch it and give its failures the vendor's text; while coalescing, hold
        it back and return None, as HCCL returns no work before ``endCoalescing``."""
        if self._batch is not None:
            if work is not None:
                self._batch.append(work)
            return None
        s = self.settings
        if work is None and not self.held():
            return None  # a collective behind a stuck one gets a work that waits on the stream
        if self._streamed:
            work = StreamWork(work, math.inf if s is None else s.exec_timeout, self._exec_error)
        elif s is None:
            return work
        if s is not None and not math.isinf(s.timeout):
            self._seq += 1
            describe = (f"Work{self._vendor}(SeqNum={self._seq}, OpType={method.upper()}, "
                        f"Timeout(ms)={round(s.timeout * 1000)})")
            _WATCHDOG.watch(_Watched(work, time.monotonic(), s.timeout, s.mode, describe, self._rank))
        return work if self._streamed else VendorWork(work, self._exec_error)

    def held(self) -> bool:
        """Whether a collective issued now is queued behind one stuck on the device's stream: it never reaches
        the wire (``_sim_stream``)."""
        return self._streamed and STREAM.held()

    def shutdown(self) -> None:
        """The vendor's teardown of the group: HCCL's synchronises the group's streams first
        (``ProcessGroupHCCL::shutdown``), so it waits for a stuck collective as a synchronisation does."""
        if self._teardown_waits:
            STREAM.synchronize()

    @contextlib.contextmanager
    def coalescing(self) -> Iterator[list[Any]]:
        """The vendor's ``startCoalescing`` ... ``endCoalescing`` (HCCL's group start and end,
        ``ProcessGroupHCCL.cpp:6260-6375``), around the calls of one batch.

        Point-to-point calls inside connect the group's communicator (``:4428-4439``: no pair communicator while
        coalescing), and their works are held back: the list yielded gets the batch's one work at the end (none
        when nothing was issued), as ``endCoalescing`` returns it. A failure inside ends the batch too, so the
        group is usable afterwards.

        Raises:
            RuntimeError: a batch is already open on the group (torch's ``_coalescing_manager`` refuses that too).
        """
        if self._batch is not None:
            raise RuntimeError("ProcessGroup has non-empty op list at the start of coalescing")
        self._batch = []
        out: list[Any] = []
        try:
            yield out
        finally:
            works, self._batch = self._batch, None
        if works:
            out.append(self.after("coalesced", Work(works)))


def _warn_out_of_range(lazy: LazyConnect) -> None:
    """Warn, once per process and value, that the connect timeout is outside the vendor's documented range."""
    message = lazy.out_of_range(os.environ)
    if message is None:
        return
    key = f"{lazy.timeout_env}={os.environ.get(lazy.timeout_env, '')}"
    if key not in _OUT_OF_RANGE:
        _OUT_OF_RANGE.add(key)
        warnings.warn(f"{message} (xccl simulation)", UserWarning, stacklevel=3)


class _Connector:
    """A group's lazy connect over its store: every member must arrive within the connect timeout."""

    def __init__(self, lazy: LazyConnect, opts: Any, memory: CommMemory | None = None) -> None:
        self._lazy: Final = lazy
        self._memory: Final = memory
        self._store: Final = PrefixStore("xccl.sim.connect", opts.store)
        self._rank: Final = int(opts.group_rank)
        self._size: Final = int(opts.group_size)
        self.connected = False

    def connect(self) -> None:
        refused = None if self._memory is None else self._memory.refused(os.environ)
        if refused is not None:
            raise RuntimeError(refused)  # the vendor reads the buffer size when it creates the communicator
        if not transport().waits:
            self.connected = True  # a fake world's other ranks exist only by assumption: they all arrive
            return
        timeout = self._lazy.timeout(os.environ)
        store = self._store
        store.set(f"arrived/{self._rank}", "1")
        everyone = [f"arrived/{r}" for r in range(self._size)]
        deadline = time.monotonic() + sim_wait(timeout)
        while True:
            if store.check(["gave_up"]):
                raise RuntimeError(self._lazy.error.format(timeout_s=timeout))
            if store.check(everyone):
                self.connected = True
                return
            if time.monotonic() > deadline:
                with contextlib.suppress(Exception):
                    store.set("gave_up", str(self._rank))
                raise RuntimeError(self._lazy.error.format(timeout_s=timeout))
            time.sleep(_CONNECT_POLL)


def sim_wait(timeout: float) -> float:
    """Seconds the simulated connect waits: :data:`SIM_CONNECT_ENV` where set to a positive number, else
    ``timeout``."""
    raw = os.environ.get(SIM_CONNECT_ENV, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return timeout
    return value if value > 0 else timeout


# ---------------------------------------------------------------------------------------------------- patches


@dataclass(slots=True)
class _Installed:
    owners: int
    undo: list[tuple[Any, str, Any, bool]]


_PATCHED: dict[str, _Installed] = {}
_PATCH_LOCK = threading.Lock()


def _owner_of(target: str) -> tuple[Any, str]:
    """The object holding the last attribute of ``target`` (a dotted path starting with a module), and its name."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1]
    raise ValueError(f"patch target {target!r} names no importable module")


def install_patches(owner: str, declared: Sequence[TorchPatch], impls: Mapping[str, Callable[..., Any]]) -> None:
    """Apply a simulated SDK's replacements of ``torch.distributed`` functions, as the vendor's import does.

    Installing again under the same ``owner`` only counts (each install needs its :func:`remove_patches`).

    Args:
        owner: who installs them (the plugin's name).
        declared: the plugin's :attr:`VendorRuntime.patches`.
        impls: target -> the simulated replacement, one for every declared target and no other.

    Raises:
        ValueError: a declared patch has no simulated replacement, or a replacement was not declared.
    """
    targets = [p.target for p in declared]
    missing, extra = sorted(set(targets) - set(impls)), sorted(set(impls) - set(targets))
    if missing or extra:
        raise ValueError(f"simulated patches of {owner!r} do not match its declaration: missing {missing}, "
                         f"undeclared {extra}")
    with _PATCH_LOCK:
        installed = _PATCHED.get(owner)
        if installed is not None:
            installed.owners += 1
            return
        undo = []
        for target in targets:
            obj, name = _owner_of(target)
            had = name in vars(obj) if isinstance(obj, type) else hasattr(obj, name)
            # A class keeps its raw attribute (a staticmethod object), so that removing restores it exactly.
            original = vars(obj).get(name) if isinstance(obj, type) else getattr(obj, name, None)
            undo.append((obj, name, original, had))
            setattr(obj, name, impls[target])
        _PATCHED[owner] = _Installed(1, undo)
    logger.debug("simulated %s patches installed: %s", owner, ", ".join(targets))


def remove_patches(owner: str) -> None:
    """Undo :func:`install_patches` (once every install of ``owner`` is removed); nothing if none is installed."""
    with _PATCH_LOCK:
        installed = _PATCHED.get(owner)
        if installed is None:
            return
        installed.owners -= 1
        if installed.owners > 0:
            return
        del _PATCHED[owner]
        for obj, name, original, had in reversed(installed.undo):
            if had:
                setattr(obj, name, original)
            else:
                delattr(obj, name)


def installed_patches(owner: str) -> tuple[str, ...]:
    """The targets ``owner`` has installed now (empty when none)."""
    with _PATCH_LOCK:
        installed = _PATCHED.get(owner)
        if installed is None:
            return ()
        return tuple(f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', o.__name__)}.{n}"
                     if isinstance(o, type) else f"{o.__name__}.{n}" for o, n, _, _ in installed.undo)

