"""What a vendor's SDK does at run time, declared as data: completion, watchdog, lazy connect, memory, patches.

The capability table says which calls a vendor accepts; this says what happens around them, which is where a first
job on real hardware fails: torch_npu's watchdog takes the process down when a collective outlasts the group's
timeout, HCCL connects a communicator at its first collective and gives up after ``HCCL_CONNECT_TIMEOUT``, every
HCCL communicator takes ``HCCL_BUFFSIZE`` of device memory, SCCL's ``Work.wait()`` returns at once, torch_npu
replaces functions of ``torch.distributed`` when it is imported.

A plugin declares its vendor's behaviour once, in :meth:`Plugin.vendor_runtime`, and xccl uses the one declaration
twice, as it uses the capability table:

* **on the hardware**, to act on it: the timeout the vendor's watchdog gets, how a barrier blocks the host where
  ``wait()`` does not, what ``xccl doctor`` reports (memory per communicator, watchdog settings);
* **in simulation**, to reproduce it: the simulated process group completes work, watches it, connects lazily and
  applies the vendor's patches as the declaration says, so that a test on the simulation fails where the hardware
  would. The conformance kit runs every declared behaviour (``xccl.testing.conformance``).

Every field carries the upstream source it was read from (``source``), which ``docs/fidelity.md`` lists.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, final

__all__ = [
    "CommMemory",
    "Completion",
    "ErrorHandling",
    "LazyConnect",
    "TorchPatch",
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
    #: 1: abort the communicators and rethrow on the watchdog's thread, taking the whole process down.
    TEAR_DOWN = 1
    #: 2: abort the communicators; the failure is raised to Python at the next ``wait()`` or collective.
    CLEAN_UP_ONLY = 2
    #: 3: raise to Python without aborting the communicators.
    SKIP_CLEAN_UP = 3


@final
@dataclass(frozen=True, slots=True)
class Watchdog:
    """The vendor's watchdog over each process group's collectives."""

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


@final
@dataclass(frozen=True, slots=True)
class LazyConnect:
    """A communicator connected at the group's first collective, not when the group is created."""

    #: Variable holding the connect timeout in seconds, e.g. ``"HCCL_CONNECT_TIMEOUT"``.
    timeout_env: str
    #: Its default, seconds (HCCL: 120).
    timeout_default: float
    #: Where this was read.
    source: str


@final
@dataclass(frozen=True, slots=True)
class CommMemory:
    """Device memory every communicator takes, whatever it carries."""

    #: Variable holding the size in MB, e.g. ``"HCCL_BUFFSIZE"``.
    env: str
    #: Its default, MB (HCCL: 200).
    default_mb: int
    #: Where this was read.
    source: str


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


#: The behaviour of a plugin that declares none.
PLAIN: Final = VendorRuntime()
