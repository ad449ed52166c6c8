"""What a vendor's SDK does at run time, declared as data: completion, watchdog, lazy connect, memory, patches.

The capability table says which calls a vendor accepts; this says what happens around them, which is where a first
job on real hardware fails (torch_npu's watchdog takes the process down, HCCL connects a communicator at its first
collective, SCCL's ``Work.wait()`` returns at once...). A plugin declares it once, in
:meth:`Plugin.vendor_runtime`; xccl acts on it on the hardware and the simulation reproduces it
(``xccl.plugin._sim_runtime``), field by field as docs/plugin-guide.md (section 9) tables it. Every field carries
the upstream source it was read from (``source``), which ``docs/fidelity.md`` lists.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

__all__ = [
    "CommMemory",
    "Completion",
    "ErrorHandling",
    "Fault",
    "LazyConnect",
    "TorchPatch",
    "VendorFault",
    "VendorRuntime",
    "Watchdog",
]


class Completion(enum.Enum):
    """What ``Work.wait()`` of the vendor's collectives waits for on the host."""

    #: ``wait()`` returns once the collective completed (gloo).
    BLOCKING = "blocking"
    #: ``wait()`` makes the caller's stream wait and returns; a host-side barrier synchronises the device (NCCL,
    #: HCCL: ``WorkHCCL::synchronizeInternal`` calls ``npuSynchronizeDevice`` for barrier work only).
    STREAM = "stream"
    #: ``wait()`` and ``isCompleted()`` return at once for every work, barrier included (SCCL): nothing orders the
    #: host after a collective.
    AT_ONCE = "at once"


class ErrorHandling(enum.Enum):
    """What a vendor's watchdog does when a collective outlasts the group's timeout (torch's and torch_npu's
    ``*_ASYNC_ERROR_HANDLING`` values)."""

    #: 0: nothing; the collective keeps waiting.
    NO_HANDLING = 0
    #: 1: rethrow on the watchdog's thread, taking the whole process down (torch_npu 2.13's watchdog aborts no
    #: communicator first: Ascend/pytorch@462f4e1 ``ProcessGroupHCCL.cpp:965-981,2114-2117``).
    TEAR_DOWN = 1
    #: 2: nothing but a log line in torch_npu 2.13: its watchdog neither aborts the communicators nor raises
    #: (``SHOULD_CLEAN_UP`` is used nowhere; ``handleException`` only logs in this mode; ``wait()`` rethrows only under
    #: ``TORCH_HCCL_BLOCKING_WAIT``), so the process lives and a hung collective fails by the vendor's own execution
    #: timeout (Ascend/pytorch@462f4e1 ``ProcessGroupHCCL.hpp:244``, ``ProcessGroupHCCL.cpp:965-981,1036-1094``).
    CLEAN_UP_ONLY = 2
    #: 3: tear the process down too, without cleaning up (``SHOULD_TEAR_DOWN(3)``, ``ProcessGroupHCCL.hpp:219-224,246``).
    SKIP_CLEAN_UP = 3

    @property
    def tears_down(self) -> bool:
        """Whether the watchdog takes the process down when it fires (torch's ``SHOULD_TEAR_DOWN``: 1 and 3)."""
        return self in (ErrorHandling.TEAR_DOWN, ErrorHandling.SKIP_CLEAN_UP)


@final
@dataclass(frozen=True, slots=True)
class Watchdog:
    """The vendor's watchdog over each process group's collectives, and the vendor's own execution timeout.

    The methods read the vendor's variables the way the vendor reads them, so that xccl's policy
    (``xccl.collectives._watchdog``) and the simulation (``xccl.plugin._sim_runtime``) agree with the hardware.
    """

    #: Variable that selects :class:`ErrorHandling` by value, e.g. ``"TORCH_HCCL_ASYNC_ERROR_HANDLING"``.
    mode_env: str
    #: The mode when the variable is unset.
    default_mode: ErrorHandling
    #: Variable holding the vendor's own device-side execution timeout in seconds (``"HCCL_EXEC_TIMEOUT"``), or
    #: ``""`` when it has none.
    exec_timeout_env: str
    #: That timeout's default, seconds (HCCL: 1836).
    exec_timeout_default: float
    #: Seconds the vendor adds to the execution timeout for a group created without a timeout of its own
    #: (HCCL: 1800, so its watchdog outlasts HCCL's own timeout and the plog is written).
    default_margin: float
    #: Where this was read, e.g. ``"Ascend/pytorch@462f4e1 ProcessGroupHCCL.cpp:1233-1251"``.
    source: str
    #: Older names of :attr:`mode_env`, read when it is unset (``"HCCL_ASYNC_ERROR_HANDLING"``).
    mode_env_aliases: tuple[str, ...] = ()
    #: The group timeout the vendor takes for "none given": torch's default (30 minutes), which it replaces by
    #: the execution timeout plus :attr:`default_margin`.
    torch_default: float = 1800.0
    #: The modes in which the vendor replaces that default and warns about a timeout at or below the execution
    #: timeout (HCCL: TearDown only).
    floor_modes: frozenset[ErrorHandling] = frozenset({ErrorHandling.TEAR_DOWN})
    #: The vendor's warning at group creation when the timeout is at or below the execution timeout, with
    #: ``{timeout_ms}`` and ``{exec_ms}``; ``""``: it does not warn.
    warning: str = ""
    #: What a collective that outlasts the execution timeout fails with (the vendor's text, ``{exec_s}`` for the
    #: timeout); ``""``: the vendor has no execution timeout.
    exec_error: str = ""
    #: The modes the vendor accepts (torch_npu 2.7.1 and 2.8.0: 0 and 1; it refuses the others at group creation).
    modes: frozenset[ErrorHandling] = frozenset(ErrorHandling)

    def mode(self, env: Mapping[str, str]) -> ErrorHandling:
        """The mode in force for ``env``: :attr:`mode_env`, else an alias, else :attr:`default_mode`.

        Raises:
            ValueError: the variable is not one of :attr:`modes` (the vendor refuses it when a group is created).
        """
        name = self.mode_source(env)
        if name is None:
            return self.default_mode
        raw = env[name].strip()
        values = sorted(m.value for m in self.modes)
        try:
            mode = ErrorHandling(int(raw))
            if mode in self.modes:
                return mode
        except ValueError:
            pass
        listed = ", ".join(map(str, values[:-1])) + ("," if len(values) > 2 else "")  # torch_npu's own wording
        raise ValueError(f"{self.mode_env} should be {listed} or {values[-1]} (got {name}={raw!r})")

    def mode_source(self, env: Mapping[str, str]) -> str | None:
        """The variable that sets the mode in ``env`` (:attr:`mode_env` or an alias), or None when unset."""
        return next((n for n in (self.mode_env, *self.mode_env_aliases) if n in env), None)

    def exec_timeout(self, env: Mapping[str, str]) -> float:
        """The execution timeout in seconds (0: never; :data:`math.inf` when the vendor has none).

        A negative or unreadable value means the default, as torch_npu's ``GetHCCLExecTimeout`` reads it.
        """
        if not self.exec_timeout_env:
            return math.inf
        value = _int_of(env.get(self.exec_timeout_env, ""))
        return self.exec_timeout_default if value is None or value < 0 else float(value)

    def vendor_default(self, env: Mapping[str, str]) -> float:
        """The watchdog timeout the vendor picks for a group created without one: execution timeout plus margin
        (:data:`math.inf` when the execution timeout is 0, "never")."""
        exec_s = self.exec_timeout(env)
        return math.inf if exec_s in (0.0, math.inf) else exec_s + self.default_margin

    def group_timeout(self, requested: float, env: Mapping[str, str]) -> float:
        """The watchdog timeout the vendor gives a group created with ``requested`` seconds, in ``env``."""
        if self.mode(env) in self.floor_modes and requested == self.torch_default:
            return self.vendor_default(env)
        return requested

    def creation_warning(self, requested: float, env: Mapping[str, str]) -> str | None:
        """The vendor's warning when a group is created with ``requested`` seconds in ``env``, or None."""
        exec_s = self.exec_timeout(env)
        if (not self.warning or self.mode(env) not in self.floor_modes or requested == self.torch_default
                or exec_s == math.inf or requested > exec_s):
            return None
        return self.warning.format(timeout_ms=round(requested * 1000), exec_ms=round(exec_s * 1000))


@final
@dataclass(frozen=True, slots=True)
class LazyConnect:
    """A communicator connected at the group's first collective, not when the group is created: a collective's or
    a batch's of point-to-point calls (``batch_isend_irecv``) connects the group's, which every member must reach;
    a plain send or recv one of its own for the pair of ranks (HCCL, as NCCL), which only those two connect."""

    #: Variable holding the connect timeout in seconds, e.g. ``"HCCL_CONNECT_TIMEOUT"``.
    timeout_env: str
    #: Its default, seconds (HCCL: 120).
    timeout_default: float
    #: Where this was read.
    source: str
    #: What a rank's first collective fails with when a member does not arrive in time (the vendor's text).
    error: str = ""
    #: The values the vendor documents for :attr:`timeout_env`, seconds (HCCL: 120 to 7200); a value outside is
    #: taken as the nearest bound, with :meth:`out_of_range`'s warning. Whether the vendor clamps it too, or
    #: refuses it, only the hardware tells; clamping cannot fail where the vendor succeeds.
    minimum: float = 0.0
    #: See :attr:`minimum`.
    maximum: float = math.inf
    #: Where :attr:`minimum` and :attr:`maximum` were read.
    range_source: str = ""

    def timeout(self, env: Mapping[str, str]) -> float:
        """The connect timeout in seconds for ``env``: the default when unset, unreadable or not positive, else the
        value within [:attr:`minimum`, :attr:`maximum`]."""
        value = self._value(env)
        return self.timeout_default if value is None else min(max(value, self.minimum), self.maximum)

    def out_of_range(self, env: Mapping[str, str]) -> str | None:
        """What xccl warns when ``env`` sets the timeout outside the documented range, or None."""
        value = self._value(env)
        if value is None or self.minimum <= value <= self.maximum:
            return None
        return (f"{self.timeout_env}={value:g} is outside [{self.minimum:g}, {self.maximum:g}], the range the vendor "
                f"documents ({self.range_source or 'its documentation'}): taken as {self.timeout(env):g} s. The "
                "vendor may refuse it instead; set a value in the range")

    def _value(self, env: Mapping[str, str]) -> float | None:
        value = _int_of(env.get(self.timeout_env, ""))
        return float(value) if value is not None and value > 0 else None


@final
@dataclass(frozen=True, slots=True)
class CommMemory:
    """Device memory every communicator takes, whatever it carries."""

    #: Variable holding the size of each of a communicator's buffers, MB, e.g. ``"HCCL_BUFFSIZE"``.
    env: str
    #: Its default, MB (HCCL: 200).
    default_mb: int
    #: Where this was read.
    source: str
    #: Variable holding the buffer size of each point-to-point communicator (one per pair of ranks that send to each
    #: other), ``""`` when the vendor has none (HCCL: ``"P2P_HCCL_BUFFSIZE"``).
    p2p_env: str = ""
    #: Its default, MB (HCCL: 20).
    p2p_default_mb: int = 0
    #: Buffers of that size each communicator takes (HCCL: 2, one to send and one to receive).
    buffers: int = 1
    #: Where a group's options (its ``pg_options``) set the buffer size for that group in place of :attr:`env`, as
    #: ``"attribute.key"`` of a mapping attribute (HCCL: ``"hccl_config.hccl_buffer_size"``); ``""``: nowhere.
    config_key: str = ""
    #: The vendor's message when :attr:`env` is set to a value that is not positive, raised when it creates a
    #: communicator; ``""``: the vendor takes any value (and a value that is not positive means the default).
    refusal: str = ""

    def mb(self, env: Mapping[str, str]) -> int:
        """:attr:`env` in ``env``, MB (the default when unset; unreadable or not positive: the default where the
        vendor declares no :attr:`refusal`, else what the vendor reads, which it refuses)."""
        return _mb(env.get(self.env, ""), self.default_mb, strict=bool(self.refusal))

    def p2p_mb(self, env: Mapping[str, str]) -> int:
        """:attr:`p2p_env` in ``env``, MB (0 when the vendor has none)."""
        return _mb(env.get(self.p2p_env, ""), self.p2p_default_mb) if self.p2p_env else 0

    def refused(self, env: Mapping[str, str]) -> str | None:
        """The vendor's :attr:`refusal` when ``env`` sets :attr:`env` to a value it refuses, else None."""
        if not self.refusal or not env.get(self.env, "").strip():
            return None
        return self.refusal if self.mb(env) <= 0 else None

    def comm_mb(self, env: Mapping[str, str], options: object | None = None) -> int:
        """Device memory of one communicator, MB: :attr:`buffers` x its buffer size, which the group's ``options``
        (its ``pg_options``) set at :attr:`config_key`, else :attr:`env`."""
        size = self.configured_mb(options)
        return self.buffers * max(self.mb(env) if size is None else size, 0)

    def configured_mb(self, options: object | None) -> int | None:
        """The buffer size the group's ``options`` set at :attr:`config_key`, MB, or None."""
        if options is None or not self.config_key:
            return None
        attr, _, key = self.config_key.rpartition(".")
        settings = getattr(options, attr, None) if attr else options
        value = settings.get(key) if isinstance(settings, Mapping) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def p2p_comm_mb(self, env: Mapping[str, str]) -> int:
        """Device memory of one point-to-point communicator, MB (0 when the vendor has none)."""
        return self.buffers * self.p2p_mb(env)


def _mb(raw: str, default: int, *, strict: bool = False) -> int:
    """A size in MB as the vendor reads it: the default when unset; ``strict``: the leading integer, 0 when there
    is none (C's ``strtol``), else the default for anything unreadable or negative."""
    raw = raw.strip()
    if not raw:
        return default
    if strict:
        digits = re.match(r"[+-]?\d+", raw)
        return int(digits.group(0)) if digits else 0
    value = _int_of(raw)
    return value if value is not None and value >= 0 else default


def _int_of(raw: str) -> int | None:
    """``raw`` as an integer, None when it is not one."""
    try:
        return int(raw.strip())
    except ValueError:
        return None


@final
@dataclass(frozen=True, slots=True)
class TorchPatch:
    """A function of ``torch.distributed`` that the vendor's SDK replaces with its own when it is imported."""

    #: What is replaced, as a dotted path, e.g. ``"torch.distributed.gather"``.
    target: str
    #: What the replacement does differently, for ``xccl doctor`` and the docs (one sentence).
    effect: str
    #: Where this was read.
    source: str
    #: When the SDK applies it, if not whenever it is imported (e.g. only once the user imports an optional
    #: module of the SDK). Empty: on every import of the SDK, so a simulated SDK must apply it too.
    condition: str = ""


class Fault(enum.Enum):
    """What a vendor's error message means, for xccl's typed errors."""

    #: A collective did not complete in time (a peer is slow, hung or called something else).
    TIMEOUT = "timeout"
    #: A communicator could not connect: a member did not reach the group's first collective in time.
    CONNECT = "connect"
    #: A peer's process or link is gone.
    PEER_LOST = "peer lost"


@final
@dataclass(frozen=True, slots=True)
class VendorFault:
    """A fragment of the vendor's error messages and what it means (``"EI0002"``: a collective timed out)."""

    #: Text the vendor's message contains, matched case-sensitively (error codes are upper case).
    fragment: str
    #: What it means.
    kind: Fault
    #: One sentence for the docs.
    meaning: str
    #: Where this was read.
    source: str
    #: What makes the simulation raise it, if not the watchdog's or the connect's message (``""``: nothing).
    simulated_by: str = ""


@final
@dataclass(frozen=True, slots=True)
class VendorRuntime:
    """A vendor's run-time behaviour; the defaults are plain ``torch.distributed`` over gloo."""

    #: What ``Work.wait()`` waits for.
    completion: Completion = Completion.BLOCKING
    #: The watchdog, or None when the vendor has none.
    watchdog: Watchdog | None = None
    #: Lazy communicator connect, or None when a group is connected when created.
    lazy_connect: LazyConnect | None = None
    #: Device memory per communicator, or None when negligible or unknown.
    comm_memory: CommMemory | None = None
    #: What the SDK replaces in ``torch.distributed`` when it is imported.
    patches: tuple[TorchPatch, ...] = ()
    #: The vendor's own error messages and what they mean, checked in order before xccl's generic reading.
    faults: tuple[VendorFault, ...] = ()
    #: Where :attr:`completion` was read.
    completion_source: str = ""
    #: Why a world of this vendor cannot be shrunk in place after a lost rank (``dist.shrink_group`` refuses it
    #: before tearing anything down; the recovery is a restart), with its source; "" when it can.
    no_shrink: str = ""
    #: Where the vendor's teardown of a group (``destroy_process_group``) synchronises the group's streams first, so
    #: that it waits for a collective stuck on a lost peer; "" when it does not.
    teardown_syncs: str = ""
    #: Why a collective stuck on a lost peer never returns (no execution timeout and no abort), with its source; ""
    #: when something ends it. Where set, a process the health watch finds has lost a peer ends itself
    #: (``XCCL_LOSS_EXIT_AFTER`` seconds later, exit code 75) unless it shut xccl down first.
    stuck_forever: str = ""

    @property
    def patches_on_import(self) -> tuple[TorchPatch, ...]:
        """The :attr:`patches` the SDK applies whenever it is imported (those without a condition)."""
        return tuple(p for p in self.patches if not p.condition)


#: The behaviour of a plugin that declares none.
PLAIN: Final = VendorRuntime()
