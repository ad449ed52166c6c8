"""The entry point's target: identity, a cheap probe, the capability table. Imports no SDK."""

from __future__ import annotations

from typing import Final

from xccl.plugin import PLUGIN_API_VERSION, CapabilityTable, Plugin, ProbeResult, Runtime

from . import _probe
from ._table import template_table

__all__ = ["TemplatePlugin", "plugin"]


class TemplatePlugin(Plugin):
    """A vendor backend in ~20 lines: set the identity, override what differs from plain torch.distributed."""

    name = "template"             # the entry-point name: xccl.init(vendor="template")
    vendor = "Example Devices"
    device_type = "cpu"           # a real accelerator: "npu", "tpu", ... (tensors live there)
    backend = "gloo"              # the torch.distributed backend: "hccl", "sccl", ...
    accelerator = False           # True for a device plugin: auto-detection then prefers it over the CPU
    api_version = PLUGIN_API_VERSION  # the plugin contract this was written for; xccl lists a mismatch

    def probe(self) -> ProbeResult:
        """Cheap: no SDK import (see ``_probe``)."""
        return _probe.probe()

    def capabilities(self) -> CapabilityTable:
        """The table (see ``_table``)."""
        return template_table(self.name)

    def runtime(self, *, simulate: bool) -> Runtime:
        """Built once the plugin is selected; imports the heavy parts."""
        from ._runtime import TemplateRuntime

        return TemplateRuntime(self, simulate=simulate)


#: The entry point's target.
plugin: Final = TemplatePlugin()
