"""The SDK boundary: every call the plugin makes into torch_template, behind one small interface.

The runtime (``_runtime``) is the same code on the hardware and in simulation; only the object implementing
:class:`TemplateSdk` differs: :class:`RealTemplateSdk` here imports torch_template when it is built (the plugin selected,
on the hardware), ``_sdk_sim.SimTemplateSdk`` stands in for it on CPU. Keep every use of torch_template in this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from xccl.plugin import BackendUnavailable

from ._probe import SDK, SDK_DIST, _version

__all__ = ["RealTemplateSdk", "TemplateSdk"]


class TemplateSdk(Protocol):
    """What the runtime needs from torch_template."""

    #: Device type of the tensors: ``"template"``, or ``"cpu"`` in simulation.
    device_type: str

    def device_count(self) -> int:
        """Devices this process sees."""
        ...

    def set_device(self, index: int) -> None:
        """Make device ``index`` current."""
        ...

    def options(self, ranks: Sequence[int] | None) -> Any:
        """The process-group options for a group over ``ranks`` (None: the world), or None for the defaults."""
        ...

    def versions(self) -> Mapping[str, str]:
        """The SDK versions found, checked against the capability table's ``min_sdk`` floors."""
        ...


class RealTemplateSdk:
    """torch_template itself.

    Raises:
        BackendUnavailable: torch_template cannot be imported; the message says what is missing and how to fix it.
    """

    def __init__(self) -> None:
        try:
            import torch_template  # noqa: F401  - registers the "templatecl" backend and torch.template
        except ImportError as exc:
            raise BackendUnavailable(
                "template", f"{SDK} cannot be imported ({exc})",
                f"pip install 'xccl-template[device]' (or {SDK_DIST}, the release matching torch {torch.__version__}); "
                "check the driver's libraries are on the loader path",
            ) from exc
        self.device_type = "template"
        self._module: Any = getattr(torch, self.device_type)  # VENDOR: the device module the SDK adds to torch

    def device_count(self) -> int:
        return int(self._module.device_count())

    def set_device(self, index: int) -> None:
        self._module.set_device(index)

    def options(self, ranks: Sequence[int] | None) -> Any:
        return None  # VENDOR: the library's ProcessGroup options, if its groups take any

    def versions(self) -> Mapping[str, str]:
        return {SDK: _version(SDK_DIST)}
