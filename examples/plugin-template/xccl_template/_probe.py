"""Can the plugin run here? Answered from what is on disk, without importing torch_template.

xccl probes every installed plugin on every machine that lists plugins (``xccl doctor``, ``xccl.plugins()``,
``xccl.init(vendor="auto")``), most of them without the hardware. Importing an SDK there can break ``import torch``
(an SDK whose runtime libraries are missing) or claim a device type; ``find_spec`` and package metadata find the
SDK without importing it, and device nodes are files.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from importlib import metadata
from typing import Final

from xccl.plugin import ProbeResult

__all__ = ["DEVICE_NODES", "SDK", "SDK_DIST", "probe"]

#: The SDK's import name and its distribution (what pip installs).
SDK: Final = "torch_template"
SDK_DIST: Final = "torch-template"
#: Where the driver exposes the devices. VENDOR: the driver's device nodes.
DEVICE_NODES: Final = "/dev/template[0-9]*"


def probe() -> ProbeResult:
    """Available when the SDK is installed and a device node exists; the facts go to ``xccl doctor``."""
    # The top-level package only: finding a dotted module's spec imports its parents, which a probe must not.
    if importlib.util.find_spec(SDK.partition(".")[0]) is None:
        return ProbeResult.unavailable(
            f"{SDK} is not installed",
            f"pip install 'xccl-template[device]' (or {SDK_DIST}, the release matching your torch); to try the plugin "
            "without the hardware: XCCL_SIMULATE=template",
        )
    facts = {"sdk": _version(SDK_DIST)}
    devices = sorted(glob.glob(DEVICE_NODES))
    if not devices:
        return ProbeResult.unavailable(
            f"{SDK} is installed but no Example Devices device was found ({DEVICE_NODES})",
            "install the Example Devices driver and check that the devices are visible in this container",
            **facts,
        )
    visible = os.environ.get("TEMPLATE_VISIBLE_DEVICES")
    return ProbeResult.ok(devices=str(len(devices)), **facts, **({"TEMPLATE_VISIBLE_DEVICES": visible} if visible else {}))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"
