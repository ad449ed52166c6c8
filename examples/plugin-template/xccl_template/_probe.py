"""Can the backend run here? Answered cheaply, without importing the vendor SDK.

A real plugin checks what is on disk: ``importlib.util.find_spec("your_sdk")`` (finds, does not import),
``importlib.metadata.version("your-sdk")``, device nodes under ``/dev``, a driver library on the loader path.
Importing the SDK here would run on every machine that merely lists plugins, and some SDKs break ``import torch``
when their runtime is missing.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from typing import Final

from xccl.plugin import ProbeResult

__all__ = ["SDK_MODULE", "probe"]

#: The module the runtime imports once the plugin is selected (this template's "SDK" is torch's gloo backend).
SDK_MODULE: Final = "torch.distributed"


def probe() -> ProbeResult:
    """Available when the SDK module can be found; its version is reported to ``xccl doctor``."""
    if importlib.util.find_spec(SDK_MODULE) is None:
        return ProbeResult.unavailable(
            f"{SDK_MODULE} is not installed",
            "install a torch build with distributed support (pip install torch)",
        )
    return ProbeResult.ok(sdk=SDK_MODULE, torch=metadata.version("torch"))
