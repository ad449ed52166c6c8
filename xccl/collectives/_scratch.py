"""Scratch buffers of the emulations, reused per group, dtype and size class.

A composition needs temporaries: the received chunks of reduce_scatter via all_to_all, the concatenated input and
output of list all_to_all, the padded buffers of the uneven collectives. Fresh host buffers cost their size in
page faults every call (on the development VM a new 64 MiB buffer costs about 45 ms, two thirds of a 64 MiB gloo
all_to_all_single), which is why the compositions ran at 0.5x gloo's own ops with fresh buffers and 1.2-1.4x with
memory reused (``benchmarks/emulation.py``).

Each group keeps a :class:`Scratch` (``GroupState.scratch``). :meth:`Scratch.take` lends a buffer as a
:class:`Lease`; the composition gives it back when its work is complete: at the end of a blocking call, or in the
``then`` step of an asynchronous call's handle, which runs once the inner collective completed (``wait()`` or
``is_completed()``). So a buffer is never lent twice while a collective that uses it may still be in flight: a
second call made before the first one's ``wait()`` gets another buffer.

Memory is bounded: idle buffers are kept up to :data:`LIMIT_BYTES` per group (oldest dropped first), and a buffer
larger than that is never kept. ``xccl.shutdown()`` drops every group's state and with it the pools; destroying
one of xccl's process groups clears its pool (:func:`~xccl.collectives._state.forget`).

Only host (CPU) buffers are pooled. Accelerator builds of torch have a caching allocator that reuses device
blocks already, and in the order of the streams that use them, which a pool keyed by size alone would not know.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Final, final

import torch

__all__ = ["LIMIT_BYTES", "Lease", "Scratch", "size_class"]

#: Idle bytes a group's pool keeps at most (a 64 MiB reduce_scatter needs one 64 MiB buffer; list all_to_all two).
LIMIT_BYTES: Final = 256 << 20
#: Idle buffers a group's pool keeps at most, whatever their size.
LIMIT_COUNT: Final = 16
_MIN_CLASS: Final = 4096


def size_class(nbytes: int) -> int:
    """The capacity, in bytes, of a buffer that serves ``nbytes``: steps of a quarter of a power of two above 4 KiB,
    so a buffer is at most 25% larger than asked for and nearby sizes share one."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    step = 1 << max(nbytes.bit_length() - 3, 0)  # a quarter of the power of two below nbytes
    return -(-nbytes // step) * step


@final
class Lease:
    """A buffer lent by a :class:`Scratch`: ``tensor`` is a 1-D view of exactly the size asked for."""

    __slots__ = ("_buffer", "_key", "_pool", "tensor")

    def __init__(self, pool: Scratch | None, key: tuple[Any, ...], buffer: torch.Tensor, numel: int) -> None:
        self._pool = pool
        self._key = key
        self._buffer = buffer
        self.tensor: torch.Tensor = buffer[:numel]

    def release(self) -> None:
        """Give the buffer back (once; later calls do nothing). The caller must not use ``tensor`` after this."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give(self._key, self._buffer)


@final
class Scratch:
    """One group's pool of reusable host buffers (see the module docstring)."""

    __slots__ = ("_idle", "_lock", "closed", "idle_bytes", "limit")

    def __init__(self, limit: int = LIMIT_BYTES) -> None:
        #: Idle bytes kept at most; 0 disables pooling.
        self.limit = limit
        #: (device, dtype, capacity) and a serial -> idle buffer, oldest first.
        self._idle: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        #: Bytes held by idle buffers.
        self.idle_bytes = 0
        #: True once cleared for good: buffers given back afterwards are dropped.
        self.closed = False

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> Lease:
        """Lend a buffer of ``numel`` elements of ``dtype`` on ``device`` (contents undefined)."""
        itemsize = dtype.itemsize
        if device.type != "cpu" or self.limit <= 0 or numel * itemsize > self.limit:
            return Lease(None, (), torch.empty(numel, dtype=dtype, device=device), numel)
        capacity = size_class(numel * itemsize)
        key = (device, dtype, capacity)
        with self._lock:
            for k in self._idle:
                if k[:3] == key:
                    buffer = self._idle.pop(k)
                    self.idle_bytes -= capacity
                    return Lease(self, key, buffer, numel)
        return Lease(self, key, torch.empty(capacity // itemsize, dtype=dtype, device=device), numel)

    def _give(self, key: tuple[Any, ...], buffer: torch.Tensor) -> None:
        capacity: int = key[2]
        with self._lock:
            if self.closed:
                return
            self._idle[(*key, id(buffer))] = buffer
            self.idle_bytes += capacity
            while self.idle_bytes > self.limit or len(self._idle) > LIMIT_COUNT:
                old_key, _ = self._idle.popitem(last=False)
                self.idle_bytes -= old_key[2]

    def clear(self, *, close: bool = False) -> None:
        """Drop every idle buffer (``close``: and every buffer given back from now on)."""
        with self._lock:
            self._idle.clear()
            self.idle_bytes = 0
            self.closed = self.closed or close

    def idle(self) -> list[torch.Tensor]:
        """The idle buffers, oldest first (for tests and diagnostics)."""
        with self._lock:
            return list(self._idle.values())

    def __len__(self) -> int:
        return len(self._idle)

    def __repr__(self) -> str:
        return f"<Scratch {len(self._idle)} idle buffers, {self.idle_bytes} bytes>"
