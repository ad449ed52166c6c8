"""The real SDK boundary: Sophgo's torch_tpu. The only module of the plugin that imports it.

Imported by the runtime only when the plugin is selected on hardware, never by the probe or in simulation. Every
``torch_tpu`` attribute used here is checked against manifest section B by ``tests/test_manifest.py``, which
parses this source: keep each use a literal ``torch_tpu.<...>`` expression so that the check sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist
import torch_tpu  # noqa: TID251 - this module is the plugin's SDK boundary, imported lazily by the runtime

from xccl.plugin import BackendUnavailable, InitError

__all__ = ["TorchTpu"]


class TorchTpu:
    """``torch_tpu`` behind the :class:`~xccl_sophgo._sdk.TpuSdk` interface.

    Raises:
        BackendUnavailable: the imported torch_tpu is not Sophgo's, or registered no ``sccl`` backend.
    """

    def __init__(self) -> None:
        self._options_cls: Final = _options_class()
        # ProcessGroup.cpp registers "SCCL" from a static constructor when libtorch_tpu loads.
        if not hasattr(dist.Backend, "SCCL"):
            raise BackendUnavailable(
                "sophgo",
                "torch_tpu was imported but registered no 'sccl' torch.distributed backend",
                "use a torch-tpu build with SCCL (CHIP_ARCH=sg2260) from Sophgo's release",
            )

    def device_count(self) -> int:
        """``torch_tpu.tpu.device_count()``."""
        return int(torch_tpu.tpu.device_count())

    def set_device(self, local_rank: int) -> None:
        """``torch_tpu.tpu.set_device(local_rank)``, which maps the local rank through ``CHIP_MAP``."""
        torch_tpu.tpu.set_device(local_rank)

    def current_device(self) -> int:
        """``torch_tpu.tpu.current_device()``: the physical chip index."""
        return int(torch_tpu.tpu.current_device())

    def device(self, chip: int) -> torch.device:
        """``tpu:<chip>``, as in Sophgo's example."""
        return torch.device("tpu", chip)

    def options(self, chip_map: Sequence[int]) -> object:
        """A ``ProcessGroupSCCLOptions`` with ``chip_map`` set (its ``timeout`` is overwritten by the creator)."""
        options = self._options_cls()
        options.chip_map = list(chip_map)
        return options

    def chip_map(self, given: Sequence[int] | None, local_world_size: int) -> tuple[int, ...]:
        """``torch_tpu.tpu.set_chip_map(options, chip_map=given)``: Sophgo's own check against the board's C2C ring,
        and its replacement of a map that is not one. It reads ``LOCAL_WORLD_SIZE`` itself and prefers ``CHIP_MAP``
        to its argument: the runtime sets the one and clears the other for the call (and writes ``CHIP_MAP``
        afterwards).

        Raises:
            InitError: the driver found no ring for this many chips.
        """
        options = self._options_cls()
        try:
            torch_tpu.tpu.set_chip_map(options, use_rank_table=False, chip_map=None if given is None else list(given))
        except RuntimeError as exc:  # TPUGetC2CRing failed (csrc/core/TPUDeviceManager.cpp:611-612)
            raise InitError(f"torch_tpu.tpu.set_chip_map found no C2C ring of {local_world_size} chips: {exc}; "
                            "start 2, 4 or 8 ranks per node") from exc
        return tuple(int(c) for c in options.chip_map)


    def close(self) -> None:
        """Nothing: what importing torch_tpu patched stays, as it does without xccl."""


def _options_class() -> Any:
    """``ProcessGroupSCCLOptions``: exported at top level on sg2260/sg2260e, always in ``torch_tpu._C``."""
    if hasattr(torch_tpu, "ProcessGroupSCCLOptions"):
        return torch_tpu.ProcessGroupSCCLOptions
    if hasattr(torch_tpu, "_C") and hasattr(torch_tpu._C, "ProcessGroupSCCLOptions"):
        return torch_tpu._C.ProcessGroupSCCLOptions
    where = getattr(torch_tpu, "__file__", "?")
    if hasattr(torch_tpu, "tpu") and hasattr(torch_tpu.tpu, "set_chip_map"):
        raise BackendUnavailable(
            "sophgo",
            f"Sophgo's torch_tpu at {where} has no ProcessGroupSCCLOptions (SCCL is built for sg2260 only)",
            "set CHIP_ARCH=sg2260 and use Sophgo's SG2260 build of torch-tpu",
        )
    raise BackendUnavailable(
        "sophgo",
        f"the imported torch_tpu ({where}) has no ProcessGroupSCCLOptions: it is not Sophgo's torch-tpu (the PyPI "
        "package torch-tpu is Google's TorchTPU)",
        "uninstall it (`pip uninstall torch-tpu`) and install Sophgo's torch-tpu from Sophgo's release",
    )

