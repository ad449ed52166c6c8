"""The simulation of Sophgo's torch adaptor: ``import torch_tpu.accelerator`` rewrites ``init_process_group``.

``torch_tpu/accelerator/__init__.py`` imports ``adaptor``, whose ``__init__.py:1-3`` imports ``torch_adaptor``
unless ``DISABLE_ADAPTOR`` is set or ``ENABLE_TORCH_ADAPTOR`` is false; ``environ_flag`` defaults it to *true*
(``accelerator/utils.py``), so importing ``torch_tpu.accelerator`` is enough. ``torch_adaptor/__init__.py:1-6``
then imports ``distributed`` (``distributed_gloo`` when ``USE_HOST_GLOO`` is true, not simulated), which replaces
``torch.distributed.init_process_group`` by a wrapper that passes ``backend="sccl"`` whatever backend it was
called with (``distributed.py:83-97``). A world asked for on xccl's backend is then silently the vendor's own
group, without xccl's dispatch or emulations.

In simulation there is no ``torch_tpu.accelerator`` to import: ``ENABLE_TORCH_ADAPTOR`` set true stands for
having imported it with the adaptor on (on the hardware it is on by default once imported). The simulated SDK then
applies the same rewrite, and removes it when the runtime shuts down. The adaptor's other replacements
(``new_group``, ``all_reduce``, ``reduce``, ``broadcast``, ``all_gather_into_tensor``, ``isend``/``irecv``) are
declared in the plugin's :class:`~xccl.plugin.VendorRuntime` and not simulated.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Final

import torch.distributed as dist

__all__ = ["adaptor_requested", "apply", "remove"]

#: strtobool's spellings, which environ_flag uses.
_TRUE: Final = frozenset({"y", "yes", "t", "true", "on", "1"})

#: The function the simulated adaptor replaced, while it is applied.
_original: Callable[..., Any] | None = None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def adaptor_requested() -> bool:
    """Whether the simulation stands for ``import torch_tpu.accelerator`` with the torch adaptor on:
    ``ENABLE_TORCH_ADAPTOR`` set true, and neither ``DISABLE_ADAPTOR`` nor ``DS_DISABLE_TPU`` (which turn the
    whole adaptor off)."""
    return _flag("ENABLE_TORCH_ADAPTOR") and not _flag("DISABLE_ADAPTOR") and not _flag("DS_DISABLE_TPU")


def apply(options_class: Callable[[], Any]) -> None:
    """Replace ``torch.distributed.init_process_group`` as the adaptor does (once; applying again does nothing).

    Args:
        options_class: the SDK's ``ProcessGroupSCCLOptions``, for a call that passes no ``pg_options``.
    """
    global _original
    if _original is not None:
        return
    func = dist.init_process_group

    @functools.wraps(func)
    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None, world_size: int = -1,
                           rank: int = -1, store: Any = None, group_name: str = "", pg_options: Any = None) -> Any:
        # torch_adaptor/distributed.py:85-96: options and a chip map made up when missing, the backend replaced.
        if pg_options is None:
            pg_options = options_class()
        if world_size == -1:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if not getattr(pg_options, "chip_map", None):
            pg_options.chip_map = list(range(world_size))
        if rank == -1:
            rank = int(os.environ.get("RANK", "0"))
        kwargs = {} if timeout is None else {"timeout": timeout}
        return func(backend="sccl", init_method=init_method, world_size=world_size, rank=rank, store=store,
                    group_name=group_name, pg_options=pg_options, **kwargs)

    _original = func
    # The adaptor's signature is not torch's (no device_id); what replaces it here is what torch_tpu installs.
    dist.init_process_group = init_process_group  # type: ignore[assignment]


def remove() -> None:
    """Put back the ``init_process_group`` :func:`apply` replaced."""
    global _original
    if _original is not None:
        dist.init_process_group = _original
        _original = None
