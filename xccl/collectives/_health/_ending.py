"""The end of a process whose vendor can neither time out nor abort a collective stuck on a lost peer (SCCL).

On such a vendor a collective with a dead chip stays on the device's stream for ever, and so does whatever the host
then synchronises with (``.item()``, a checkpoint's copy to the host, a teardown): nothing in the process can
release it, and a launcher that restarts the job on a worker's exit (torchrun) waits with it. So when the health
watch finds ranks lost (its verdict, :func:`at_verdict`) and the vendor says its stuck collectives never return
(``VendorRuntime.stuck_forever``), the process gets :func:`exit_after` seconds to raise, handle and end, or to shut
xccl down (``xccl.shutdown``, ``destroy_process_group`` through xccl's atexit teardown); after that it ends itself:
one line on stderr that names the lost ranks, then :data:`EXIT_CODE`, so that torchrun restarts the job in seconds
rather than never (docs/elastic.md, "A vendor that cannot abort"). Where the vendor has an abort (Ascend's
``stop_device``), the verdict runs it instead, and the host's waits return with its error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Final

from ...ops._settings import seconds

__all__ = ["DEFAULT_AFTER", "ENV", "EXIT_CODE", "at_verdict", "disarm", "exit_after"]

#: The exit status of a process that ended itself after a lost peer: sysexits' ``EX_TEMPFAIL`` (a temporary
#: failure; the same job can be retried). torchrun counts it as a failed worker and restarts the job.
EXIT_CODE: Final = 75
ENV: Final = "XCCL_LOSS_EXIT_AFTER"
#: Seconds from the verdict to the end, unless ``XCCL_LOSS_EXIT_AFTER`` says otherwise.
DEFAULT_AFTER: Final = 5.0

_lock = threading.Lock()
_armed: threading.Event | None = None  # set: disarmed


def exit_after() -> float:
    """Seconds from the verdict to the process's end (0: never), from ``XCCL_LOSS_EXIT_AFTER``.

    Raises:
        InitError: the variable is not a number of seconds >= 0 (``xccl.init`` asks first, so a bad value fails
            there).
    """
    return seconds(ENV, DEFAULT_AFTER, zero="never ends a process whose vendor cannot abort")


def at_verdict(runtime: Any, rank: int, lost: Sequence[int]) -> None:
    """The health watch found ``lost`` gone from this rank's group: run the vendor's abort of the device's tasks
    where it has one (``Runtime.stop_device``), else, where its stuck collectives never return, arm the end."""
    if runtime.stop_device():
        return
    why = runtime.plugin.vendor_runtime().stuck_forever
    after = exit_after()
    if not why or not after:
        return
    global _armed
    with _lock:
        if _armed is not None and not _armed.is_set():
            return  # armed by an earlier verdict: its clock runs
        _armed = threading.Event()
        line = (f"xccl: rank {rank} ends itself with exit code {EXIT_CODE}: ranks {sorted(lost)} were lost, and on "
                f"{runtime.plugin.name} the collective stuck on them never returns ({why.split(' (')[0]}); restart "
                "the job and resume from the last checkpoint (torchrun --max-restarts; docs/elastic.md)\n").encode()
        threading.Thread(target=_end, args=(_armed, after, line), name="xccl-loss-exit", daemon=True).start()


def _end(disarmed: threading.Event, after: float, line: bytes) -> None:
    if disarmed.wait(after):
        return
    try:
        os.write(2, line)
    finally:
        os._exit(EXIT_CODE)  # not sys.exit: the main thread may be blocked on the device for ever


def disarm() -> None:
    """xccl was shut down after the verdict (the end of ``xccl.shutdown``): the process handled the loss."""
    with _lock:
        if _armed is not None:
            _armed.set()
