"""The SDK boundary: the few torch_tpu calls the plugin makes, behind one small interface.

The runtime (:mod:`xccl_sophgo._runtime`) does everything else itself, identically in both modes; only these calls
differ:

* :class:`SimulatedTpu` - a node of simulated chips: ``set_device`` maps the local rank through ``CHIP_MAP``
  exactly as ``torch_tpu.tpu.set_device`` does and checks the chip exists; the chip map is checked against the
  C2C ring of Sophgo's documented SG2260 board (:mod:`xccl_sophgo._c2c`); options are
  :class:`SimulatedSCCLOptions`.
* ``TorchTpu`` in :mod:`xccl_sophgo._torch_tpu` - Sophgo's torch_tpu, imported only when that module is.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from typing import Final, Protocol

import torch

from xccl.plugin import InitError

from . import _adaptor_sim
from ._c2c import board, vendor_chip_map

__all__ = ["SIM_DEVICES_ENV", "SimulatedSCCLOptions", "SimulatedTpu", "TpuSdk", "current_simulated_chip"]

#: Chips per simulated node (default 8: an SG2260 server, as in Sophgo's 8-rank example).
SIM_DEVICES_ENV: Final = "XCCL_SOPHGO_SIM_DEVICES"


class TpuSdk(Protocol):
    """What the runtime needs from torch_tpu."""

    def device_count(self) -> int:
        """Number of TPUs on this node."""
        ...

    def set_device(self, local_rank: int) -> None:
        """``torch_tpu.tpu.set_device(local_rank)``: the chip is ``CHIP_MAP[local_rank]``."""
        ...

    def current_device(self) -> int:
        """The physical index of the current chip."""
        ...

    def device(self, chip: int) -> torch.device:
        """The torch device tensors of this rank live on."""
        ...

    def options(self, chip_map: Sequence[int]) -> object:
        """A ``ProcessGroupSCCLOptions`` carrying ``chip_map``."""
        ...

    def chip_map(self, given: Sequence[int] | None, local_world_size: int) -> tuple[int, ...]:
        """The node's chip map as ``torch_tpu.tpu.set_chip_map`` settles it: ``given`` if it is a C2C ring of the
        board (or needs no check), else the driver's ring (:func:`xccl_sophgo._c2c.vendor_chip_map`).

        Like ``set_chip_map`` (``torch_tpu/tpu/utils.py:193-229``) it reads the node's size from
        ``LOCAL_WORLD_SIZE`` only (default 1: then a given map is taken unchecked and no map is ``[0, 1]``) and
        prefers ``CHIP_MAP`` to ``given``: the runtime sets both for the call. ``local_world_size`` is for
        messages."""
        ...

    def close(self) -> None:
        """Undo what this SDK object did to the process (the simulated torch adaptor's patch). What the real
        torch_tpu patched when imported stays patched, as it does without xccl."""
        ...


class SimulatedSCCLOptions:
    """Stands in for ``torch_tpu.ProcessGroupSCCLOptions`` in simulation: the same two fields.

    Like the pybind class it is mutable and not a ``torch.distributed.Backend.Options``.
    """

    __slots__ = ("chip_map", "timeout")

    def __init__(self) -> None:
        #: Group rank -> physical chip.
        self.chip_map: list[int] = []
        #: Overwritten by the SCCL creator with the group's timeout.
        self.timeout: _dt.timedelta = _dt.timedelta(minutes=30)

    def __repr__(self) -> str:
        return f"ProcessGroupSCCLOptions(chip_map={self.chip_map})"


# The chip this process set, like the driver's per-process current device; read by the simulated SCCL creator
# to check that a group's chip map agrees with the device the rank computes on.
_current_chip: int | None = None


def current_simulated_chip() -> int | None:
    """The chip the simulated ``set_device`` selected in this process, or None before any."""
    return _current_chip


class SimulatedTpu:
    """A simulated Sophgo node: ``XCCL_SOPHGO_SIM_DEVICES`` chips (default 8); tensors stay on the CPU."""

    def __init__(self) -> None:
        raw = os.environ.get(SIM_DEVICES_ENV, "8").strip()
        if not raw.isdigit() or int(raw) < 1:
            raise InitError(f"{SIM_DEVICES_ENV}={raw!r}: expected the number of simulated TPUs per node, e.g. 8")
        self._count: Final = int(raw)
        if _adaptor_sim.adaptor_requested():
            # Stands for `import torch_tpu.accelerator` with the torch adaptor on (xccl_sophgo._adaptor_sim).
            _adaptor_sim.apply(SimulatedSCCLOptions)

    def close(self) -> None:
        """Remove the simulated torch adaptor's patch, if applied."""
        _adaptor_sim.remove()

    def device_count(self) -> int:
        """The simulated chip count."""
        return self._count

    def set_device(self, local_rank: int) -> None:
        """Select ``CHIP_MAP[local_rank]`` (or ``local_rank`` without ``CHIP_MAP``), as torch_tpu does.

        Raises:
            RuntimeError: the chip does not exist on the simulated node (the driver would refuse it).
            IndexError, ValueError: ``CHIP_MAP`` is too short or not numbers, as in Sophgo's own mapping.
        """
        global _current_chip
        raw = os.environ.get("CHIP_MAP")
        # torch_tpu/tpu/utils.py map_local_rank_to_device_idx: int(x) of each comma-separated entry.
        chip = [int(x) for x in raw.split(",")][local_rank] if raw else local_rank
        if not 0 <= chip < self._count:
            raise RuntimeError(
                f"simulated TPU: set_device({local_rank}) selects chip {chip}, but this node has chips "
                f"0..{self._count - 1} ({SIM_DEVICES_ENV}={self._count})"
            )
        _current_chip = chip

    def current_device(self) -> int:
        """The selected chip, modulo ``TPU_VISIBLE_NUM`` when set (as torch_tpu reports it)."""
        chip = 0 if _current_chip is None else _current_chip
        visible = os.environ.get("TPU_VISIBLE_NUM", "").strip()
        return chip % int(visible) if visible.isdigit() and int(visible) > 0 else chip

    def device(self, chip: int) -> torch.device:
        """Simulated ranks compute on the CPU."""
        return torch.device("cpu")

    def options(self, chip_map: Sequence[int]) -> object:
        """A :class:`SimulatedSCCLOptions` carrying ``chip_map``."""
        options = SimulatedSCCLOptions()
        options.chip_map = list(chip_map)
        return options

    def chip_map(self, given: Sequence[int] | None, local_world_size: int) -> tuple[int, ...]:
        """``set_chip_map``'s decision on the simulated node (SG2260's links among its chips), from what it reads:
        ``LOCAL_WORLD_SIZE`` (default 1) for the node's size, and ``CHIP_MAP`` before ``given``
        (``torch_tpu/tpu/utils.py:193-204``); ``local_world_size`` is what the caller believes, unused, as there.
        """
        size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        raw = os.environ.get("CHIP_MAP")
        if raw:
            given = [int(c) for c in raw.split(",")]
        return vendor_chip_map(given, size, board(self._count))
