"""The SDK boundary in simulation: torch_template's calls answered on CPU, for ``XCCL_SIMULATE=template``.

The simulated node has ``XCCL_SIM_TEMPLATE_DEVICES`` devices (default 8); ``TEMPLATE_VISIBLE_DEVICES`` narrows them as the
SDK would, so a launch that finds too few devices on the hardware fails here too. The tensors stay on the CPU and
the collectives run on xccl's simulated process group (``_simprofile``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

from xccl.plugin import InitError

__all__ = ["SIM_DEVICES_ENV", "SimTemplateSdk"]

#: Devices of the simulated node.
SIM_DEVICES_ENV: Final = "XCCL_SIM_TEMPLATE_DEVICES"


class SimTemplateSdk:
    """A node of simulated Example Devices devices."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.current: int | None = None

    def device_count(self) -> int:
        total = int(os.environ.get(SIM_DEVICES_ENV, "8"))
        visible = os.environ.get("TEMPLATE_VISIBLE_DEVICES")
        if visible is None:
            return total
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        bad = [v for v in ids if not v.isdigit() or int(v) >= total]
        if bad:
            raise InitError(f"TEMPLATE_VISIBLE_DEVICES={visible!r} names devices {bad} that this node does not have "
                            f"(it has {total}: 0..{total - 1})")
        return len(ids)

    def set_device(self, index: int) -> None:
        self.current = index

    def options(self, ranks: Sequence[int] | None) -> Any:
        return None

    def versions(self) -> Mapping[str, str]:
        return {}
