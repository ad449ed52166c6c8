"""xccl's policy for a vendor's watchdog: which mode, and which timeout each process group gets.

A vendor that declares a :class:`~xccl.plugin.Watchdog` (torch_npu over HCCL) has two timeouts: its own
device-side *execution timeout* (``HCCL_EXEC_TIMEOUT``, 1836 s by default), which fails a collective with the
vendor's error, and the *watchdog* of torch's process group, which fires after the group's timeout and, in its
default TearDown mode, takes the whole process down from its own thread: no exception reaches Python, on any rank.
The policy:

* **the mode**: CleanUpOnly (2) unless the user set the vendor's variable (``TORCH_HCCL_ASYNC_ERROR_HANDLING``),
  set before the first group exists because the vendor reads it once per process. A failure then reaches Python
  (HCCL's error at the execution timeout, which xccl types) instead of killing the process, so every rank can
  report, save or exit cleanly and an elastic launcher restarts the job. This relies on one property of mode 2
  only: its watchdog does not take the process down. In torch_npu 2.13 it does nothing else either (it only logs:
  no abort of the communicators, no exception at the next ``wait()``; Ascend/pytorch@462f4e1
  ``ProcessGroupHCCL.cpp:965-981``, ``:1083-1094``), so failure detection is bounded by the execution timeout
  alone, and the watchdog's timeout (execution timeout + margin) changes nothing. Not relied on, and not known:
  whether mode 2 keeps the process alive when an event query fails with an error that is not the device's
  (``:849-857`` throws on the watchdog's thread in every mode; the hardware's first hour settles it);
* **the group's timeout**: never at or below the execution timeout (the floor), so that the vendor reports a hung
  collective first and the watchdog never fires before it. A group created without a timeout (torch's 30-minute
  default, which the vendor reads as "none") gets the vendor's own default, execution timeout plus margin (HCCL:
  +1800 s), in every mode; a timeout at or below the floor is raised to that; a timeout above it is kept;
* **one warning** per process when a timeout given by the user is not what bounds a collective (naming what does).

Every group of xccl's backend goes through the policy in its creator (``_process_group``), world, sub-groups and
groups third-party code creates alike. :class:`WatchdogSettings` (``PROCESS.watchdog``) is what ``World``, the
typed faults and ``xccl doctor`` report.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Final, final

from ..plugin._vendor_runtime import ErrorHandling, VendorRuntime, Watchdog

__all__ = ["CHOSEN_MODE", "NEVER", "GroupTimeout", "WatchdogSettings", "choose_mode", "group_timeout", "settings_of"]

#: The mode xccl sets when the user set none.
CHOSEN_MODE: Final = ErrorHandling.CLEAN_UP_ONLY
#: What "no timeout" becomes where the vendor would wait forever (an execution timeout of 0): ten years.
NEVER: Final = _dt.timedelta(days=3650)


@final
@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """The vendor's watchdog and timeouts in force in this process."""

    #: The watchdog's mode.
    mode: ErrorHandling
    #: Who chose it: ``"set by xccl"``, ``"TORCH_HCCL_ASYNC_ERROR_HANDLING=1 (set by the user)"``, or the vendor's
    #: default when xccl adopted a world it did not create.
    mode_source: str
    #: The vendor's execution timeout in seconds (0: never).
    exec_timeout: float
    #: The variable that sets it (``"HCCL_EXEC_TIMEOUT"``).
    exec_env: str
    #: The watchdog timeout the vendor gives a group created without one, seconds (:data:`math.inf`: never).
    default_timeout: float
    #: The connect timeout of a lazily connected communicator, seconds, and its variable; None: none.
    connect_timeout: float | None = None
    connect_env: str = ""

    def collective_bound(self, group_timeout: float) -> float:
        """Seconds after which a collective on a group with this watchdog timeout fails: the sooner of the
        execution timeout and the watchdog."""
        return group_timeout if self.exec_timeout == 0 else min(group_timeout, self.exec_timeout)

    def describe(self) -> str:
        """One line for messages and ``xccl doctor``."""
        exec_s = "never" if self.exec_timeout == 0 else f"{self.exec_timeout:g} s"
        default = "never" if math.isinf(self.default_timeout) else f"{self.default_timeout:g} s"
        connect = "" if self.connect_timeout is None else f", {self.connect_env}={self.connect_timeout:g} s"
        return (f"watchdog mode {self.mode.value} ({self.mode.name}, {self.mode_source}), {self.exec_env}={exec_s}, "
                f"default group timeout {default}{connect}")


@final
@dataclass(frozen=True, slots=True)
class GroupTimeout:
    """What the policy makes of one group's requested timeout."""

    #: The timeout the vendor's group gets.
    timeout: _dt.timedelta
    #: Why it differs from what the user asked, for the one warning; None when it does not, or nobody asked.
    note: str | None


def choose_mode(watchdog: Watchdog, env: MutableMapping[str, str]) -> str:
    """Set the vendor's mode variable to :data:`CHOSEN_MODE` unless the user set it; returns who chose the mode.

    Call before the vendor's first process group exists: the vendor reads the variable once per process.

    Raises:
        ValueError: the user's value is not a mode (0, 1, 2 or 3).
    """
    name = watchdog.mode_source(env)
    if name is not None:
        watchdog.mode(env)  # a bad value is refused now, with the variable named, rather than by the vendor
        return f"{name}={env[name].strip()} (set by the user)"
    if CHOSEN_MODE not in watchdog.modes:  # torch_npu 2.7.1/2.8.0 fail every group on a value other than 0 or 1
        return f"the vendor's default: {watchdog.mode_env} takes no {CHOSEN_MODE.value} in this release"
    env[watchdog.mode_env] = str(CHOSEN_MODE.value)
    return "set by xccl"


def settings_of(runtime: VendorRuntime, env: Mapping[str, str], mode_source: str) -> WatchdogSettings | None:
    """The settings in force for a vendor's declared run time in ``env`` (None: the vendor has no watchdog)."""
    wd = runtime.watchdog
    if wd is None:
        return None
    lazy = runtime.lazy_connect
    return WatchdogSettings(
        mode=wd.mode(env),
        mode_source=mode_source,
        exec_timeout=wd.exec_timeout(env),
        exec_env=wd.exec_timeout_env,
        default_timeout=wd.vendor_default(env),
        connect_timeout=None if lazy is None else lazy.timeout(env),
        connect_env="" if lazy is None else lazy.timeout_env,
    )


def group_timeout(watchdog: Watchdog, requested: _dt.timedelta, env: Mapping[str, str] | None = None) -> GroupTimeout:
    """The timeout a group of this vendor gets when ``requested`` was asked for (torch's default: none).

    Args:
        watchdog: the vendor's watchdog.
        requested: the timeout torch passed to the group's creator.
        env: the environment (default ``os.environ``).
    """
    env = os.environ if env is None else env
    exec_s = watchdog.exec_timeout(env)
    default = watchdog.vendor_default(env)
    default_td = NEVER if math.isinf(default) else _dt.timedelta(seconds=default)
    asked = requested.total_seconds()
    if asked == watchdog.torch_default:
        return GroupTimeout(default_td, None)  # none given: the vendor's own default, whatever the mode
    name = watchdog.exec_timeout_env
    if exec_s == 0:
        return GroupTimeout(requested, None)  # the vendor never times out: the watchdog is the only bound
    if asked <= exec_s:
        return GroupTimeout(default_td, (
            f"timeout={asked:g} s cannot bound collectives here: the vendor's own execution timeout ({name}="
            f"{exec_s:g} s) ends a collective that does not complete, and its watchdog must outlast it (at or below "
            f"it, the watchdog fires first and, in its default mode, takes the process down). The process groups get "
            f"{default:g} s ({name} + {watchdog.default_margin:g} s); collectives are bounded by {name}={exec_s:g} s: "
            f"set {name} lower to fail sooner"))
    return GroupTimeout(requested, (
        f"timeout={asked:g} s is longer than the vendor's own execution timeout ({name}={exec_s:g} s), which ends a "
        f"collective first: collectives are bounded by {exec_s:g} s; set {name} higher for collectives that must "
        "wait longer"))
