"""``xccl.dump_trace()``: write this rank's flight record now (``xccl.collectives._flight``, ``_flight_dump``)."""

from __future__ import annotations

from ..collectives import _flight_dump

__all__ = ["dump_trace"]


def dump_trace(reason: str = "dump_trace") -> str | None:
    """Write this rank's flight record, in torch's flight-recorder layout, to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``.

    The file is what ``torch._C._distributed_c10d._dump_fr_trace()`` returns for NCCL or gloo groups, for the
    collectives that went through xccl: ``python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX`` and
    ``xccl trace DIR`` read a directory of them. Only this rank writes (a typed fault makes every rank write).

    Args:
        reason: recorded in the dump (its ``xccl`` key).

    Returns:
        The file written, or None when the recorder is off (``XCCL_TRACE=0`` or ``TORCH_FR_BUFFER_SIZE=0``).

    Example::

        >>> import xccl
        >>> xccl.dump_trace() is None  # before xccl.init: nothing recorded
        True
    """
    return _flight_dump.dump(reason)
