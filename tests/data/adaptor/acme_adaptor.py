"""A vendor's adaptor, as torch_npu's replacement of ``dist.gather`` is one: the user's code calls it, and it calls
on into torch and xccl. Its frames are not the user's (``Plugin.adaptor_modules``)."""

from collections.abc import Callable
from typing import Any


def gather(call: Callable[[], Any]) -> Any:
    """What ``torch_npu.distributed.distributed_c10d._gather`` is to ``dist.gather``."""
    return _forward(call)


def _forward(call: Callable[[], Any]) -> Any:
    return call()


def fail() -> None:
    """The adaptor refusing a call (torch_npu raising before the collective)."""
    _forward(_raise)


def _raise() -> None:
    raise RuntimeError("the adaptor refused the call")
