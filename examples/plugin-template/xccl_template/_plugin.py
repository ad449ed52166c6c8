"""The entry point's target: identity, probe, capability table, simulation profile, run-time behaviour and rank
table of Example Devices, all cheap. Nothing here imports torch_template: the runtime, which does, is built only once the
plugin is selected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from xccl.plugin import (
    PLUGIN_API_VERSION,
    CapabilityTable,
    Completion,
    Plugin,
    ProbeResult,
    RankTableFormat,
    Runtime,
    SimProfile,
    VendorRuntime,
)

from . import _probe
from ._ranktable import TemplateRankTable
from ._table import template_table

__all__ = ["TemplatePlugin", "plugin"]


class TemplatePlugin(Plugin):
    """Example Devices devices over templatecl (torch_template), or the library's rules simulated on CPU."""

    name = "template"                   # the entry-point name: xccl.init(vendor="template")
    vendor = "Example Devices"
    device_type = "template"     # torch device type of the tensors on the hardware
    backend = "templatecl"             # the torch.distributed backend torch_template registers
    accelerator = True                  # auto-detection prefers an available accelerator over the CPU
    visible_devices_env = "TEMPLATE_VISIBLE_DEVICES"  # the variable that restricts the devices a process sees
    sdk_packages = ("torch-template",)    # listed by `xccl doctor`, with their versions
    api_version = PLUGIN_API_VERSION    # the plugin contract this was written for

    def probe(self) -> ProbeResult:
        """Is torch_template installed, is a device there? Read from disk, importing nothing (``_probe``)."""
        return _probe.probe()

    def capabilities(self) -> CapabilityTable:
        """What xccl may run natively, emulated or not at all (``_table``)."""
        return template_table(self.name)

    def simulation(self) -> SimProfile:
        """The library's rules, enforced by xccl's CPU simulation (``_simprofile``)."""
        from ._simprofile import template_profile

        return template_profile()

    def vendor_runtime(self) -> VendorRuntime:
        """What torch_template does around its collectives, as data: xccl acts on it on the hardware and the simulation
        reproduces it. Every value below is the default, plain torch.distributed; change each one the SDK's
        documentation contradicts (docs/plugin-guide.md, "The vendor's run-time behaviour")."""
        return VendorRuntime(
            completion=Completion.BLOCKING,  # VENDOR: Work.wait() returns when done (STREAM: once queued; AT_ONCE)
            watchdog=None,                   # VENDOR: the SDK's watchdog over each group, if any (Watchdog(...))
            lazy_connect=None,               # VENDOR: communicators connected at their first collective (LazyConnect)
            comm_memory=None,                # VENDOR: device memory each communicator takes (CommMemory(...))
            patches=(),                      # VENDOR: torch.distributed functions the SDK replaces on import
        )

    def adaptor_modules(self) -> tuple[str, ...]:
        """Modules whose frames are torch_template's, not the user's: where the SDK replaces torch.distributed functions
        (the ``patches`` above), call sites name the user's line above them (docs/plugin-guide.md, section 9a).
        VENDOR: the SDK's package, e.g. ("torch_template",), with its source; () when it patches nothing."""
        return ()

    def rank_table_formats(self) -> Sequence[RankTableFormat]:
        """The rank-table format of Example Devices clusters, for ``xccl rank-table`` and ``xccl doctor``."""
        return (TemplateRankTable(),)

    def runtime(self, *, simulate: bool) -> Runtime:
        """The runtime; imports torch_template unless ``simulate``."""
        from ._runtime import TemplateRuntime

        return TemplateRuntime(self, simulate=simulate)


#: The entry point's target.
plugin: Final = TemplatePlugin()
