"""Tools: the ``xccl`` command, the benchmark driver, the capability-table rendering, and the preflight.

``xccl.tools.preflight`` (``xccl preflight`` from Python, for notebooks and tests) loads on first use, as the
names of ``xccl`` itself do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

__all__ = ["CallSite", "Failure", "Report", "preflight"]

#: Public name -> the module that defines it, imported on first access.
_LAZY: Final = {
    "preflight": "xccl.tools._preflight",
    **dict.fromkeys(("CallSite", "Failure", "Report"), "xccl.tools._preflight_report"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xccl.tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ._preflight import preflight
    from ._preflight_report import CallSite, Failure, Report
