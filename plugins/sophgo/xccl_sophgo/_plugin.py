"""The entry point's target: identity, probe, capability table and simulation profile. Cheap.

Importing this module imports no SDK: the probe reads package metadata and device nodes
(:mod:`xccl_sophgo._probe`); torch_tpu is imported by the runtime, once the plugin is selected on hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from xccl.plugin import (
    CapabilityTable,
    CostModel,
    Plugin,
    ProbeResult,
    RankTableFormat,
    Runtime,
    SimProfile,
    VendorRuntime,
)

from . import _probe
from ._ranktable import SophgoFormat
from ._table import sophgo_table
from ._vendor import SCCL_RUNTIME

__all__ = ["ADAPTOR_MODULES", "SophgoPlugin", "plugin"]

#: Modules between the user's ``torch.distributed`` call and xccl: torch_tpu's torch adaptor
#: (``torch_tpu/accelerator/adaptor/torch_adaptor/distributed.py:122-131`` at sophgo/torch-tpu@fe9b478 wraps
#: ``dist.broadcast``, ``reduce``, ``all_reduce``, ``all_gather_into_tensor``, ``isend``, ``irecv``), its DeepSpeed
#: and Megatron adaptors under ``torch_tpu.accelerator.adaptor``, and this plugin's stand-in in simulation.
ADAPTOR_MODULES: Final = ("torch_tpu", "xccl_sophgo")


class SophgoPlugin(Plugin):
    """Sophgo TPUs (SG2260) over SCCL, through Sophgo's torch_tpu."""

    name = "sophgo"
    vendor = "Sophgo (sccl)"
    device_type = "tpu"
    backend = "sccl"
    accelerator = True
    # torch_tpu honours no visible-devices variable of its own (TPU_VISIBLE_DEVICES is read only by its
    # DeepSpeed adaptor); ranks reach chips through CHIP_MAP instead.
    visible_devices_env = None
    sdk_packages = ("torch_tpu",)  # listed by `xccl doctor`

    def probe(self) -> ProbeResult:
        """Sophgo's torch_tpu installed (told apart from Google's by metadata) and TPU device nodes present."""
        return _probe.probe()

    def cost_model(self) -> CostModel:
        """The first generation's cost model (its figures and their sources, or unknown: ``_cost``)."""
        return self.cost_models()[0]

    def cost_models(self) -> Sequence[CostModel]:
        """Every generation's cost model, from ``_cost.MODELS``."""
        from ._cost import MODELS

        return MODELS

    def capabilities(self) -> CapabilityTable:
        """SCCL's table (see :mod:`xccl_sophgo._table`)."""
        return sophgo_table()

    def vendor_runtime(self) -> VendorRuntime:
        """What torch_tpu does at run time (see :mod:`xccl_sophgo._vendor`)."""
        return SCCL_RUNTIME

    def simulation(self) -> SimProfile:
        """ProcessGroupSCCL's rules for the CPU simulation."""
        from ._simulation import sccl_profile

        return sccl_profile()

    def adaptor_modules(self) -> tuple[str, ...]:
        """torch_tpu (its torch adaptor replaces ``dist.all_reduce``, ``broadcast``, ``isend``...) and this plugin,
        whose ``_adaptor_sim`` stands in for it in simulation (sources: ``_fidelity``, "adaptor frames")."""
        return ADAPTOR_MODULES

    def rank_table_formats(self) -> Sequence[RankTableFormat]:
        """Sophgo's rank table (``tpu_gen_sccl_rank_table``'s format)."""
        return (SophgoFormat(),)

    def runtime(self, *, simulate: bool) -> Runtime:
        """The Sophgo runtime; imports torch_tpu unless ``simulate``."""
        from ._runtime import SophgoRuntime

        return SophgoRuntime(self, simulate=simulate)


#: The entry point's target.
plugin: Final = SophgoPlugin()
