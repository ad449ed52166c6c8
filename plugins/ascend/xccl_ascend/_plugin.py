"""The entry point's target: identity, probe, capability table and simulation profile of Ascend, all cheap.

Nothing here imports torch_npu: the probe reads metadata, environment and ``/dev`` (``_probe``), and the runtime,
which may import it, is built only when the plugin is selected.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from xccl.plugin import (
    BackendUnavailable,
    CapabilityTable,
    CostModel,
    Plugin,
    ProbeResult,
    RankTableFormat,
    Runtime,
    SimProfile,
    VendorRuntime,
)

from ._capabilities import ascend_table
from ._probe import probe_host
from ._ranktable import HcclFormat
from ._vendor import ascend_runtime

__all__ = ["ADAPTOR_MODULES", "AscendPlugin", "plugin"]

#: Modules between the user's ``torch.distributed`` call and xccl: torch_npu's patches
#: (``torch_npu/_init/patches/distributed_patches.py:26-62`` at Ascend/pytorch@462f4e1 replace ``dist.gather``,
#: ``batch_isend_irecv`` and others with functions of ``torch_npu.distributed``), TorchAir's ``patch_for_hcom``
#: (``python/torchair/__init__.py:53-70`` at Ascend/torchair@fced8842 replaces ``dist.all_reduce``, ``all_gather``,
#: ``broadcast``, ``all_to_all(_single)``), and this plugin's stand-ins for them in simulation.
ADAPTOR_MODULES: Final = ("torch_npu", "torchair", "xccl_ascend")


class AscendPlugin(Plugin):
    """Huawei Ascend NPUs over HCCL (torch_npu), or HCCL's rules simulated on CPU."""

    name = "ascend"
    vendor = "Huawei Ascend (HCCL)"
    device_type = "npu"
    backend = "hccl"
    accelerator = True
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    sdk_packages = ("torch_npu",)  # listed by `xccl doctor`

    def probe(self) -> ProbeResult:
        """torch_npu by metadata, its torch pin, CANN's libraries, visible NPUs, the rank table (see ``_probe``)."""
        report = probe_host()
        return ProbeResult(report.available, report.reason, report.fix, dict(report.facts))

    def cost_model(self) -> CostModel:
        """The first generation's cost model (its figures and their sources, or unknown: ``_cost``)."""
        return self.cost_models()[0]

    def cost_models(self) -> Sequence[CostModel]:
        """Every generation's cost model, from ``_cost.MODELS``."""
        from ._cost import MODELS

        return MODELS

    def capabilities(self) -> CapabilityTable:
        """HCCL's table (``_capabilities``)."""
        return ascend_table()

    def vendor_runtime(self) -> VendorRuntime:
        """torch_npu's and HCCL's run time: stream completion, the watchdog (TearDown by default) and HCCL's
        execution timeout, lazy connect, HCCL_BUFFSIZE per communicator, torch_npu's patches (``_vendor``)."""
        return ascend_runtime()

    def simulation(self) -> SimProfile:
        """HCCL's profile for xccl's CPU simulation (``_simprofile``).

        Raises:
            BackendUnavailable: torch_npu is already imported here (torch auto-loads it), so its real ``hccl``
                backend is registered and cannot be replaced by the simulated one.
        """
        if "torch_npu" in sys.modules:
            raise BackendUnavailable(
                self.name,
                "torch_npu is already imported in this process (torch auto-loads an installed torch_npu), so its "
                "real 'hccl' backend is registered and the simulated one cannot replace it",
                "start Python with TORCH_DEVICE_BACKEND_AUTOLOAD=0 to simulate Ascend on a machine with torch_npu",
            )
        from ._simprofile import hccl_profile

        return hccl_profile()

    def adaptor_modules(self) -> tuple[str, ...]:
        """torch_npu (its replacements of ``dist.gather``, ``batch_isend_irecv``..., in
        ``torch_npu.distributed``), TorchAir (``patch_for_hcom`` replaces ``dist.all_reduce``...) and this plugin,
        whose ``_torch_npu_sim`` stands in for torch_npu's in simulation (sources: ``_fidelity``, "adaptor frames")."""
        return ADAPTOR_MODULES

    def rank_table_formats(self) -> Sequence[RankTableFormat]:
        """HCCL's rank table (CANN's ``RANK_TABLE_FILE``, versions 1.0 and 1.2)."""
        return (HcclFormat(),)

    def runtime(self, *, simulate: bool) -> Runtime:
        """The Ascend runtime; imports torch_npu unless ``simulate``."""
        from ._runtime import AscendRuntime

        return AscendRuntime(self, simulate=simulate)


#: The entry point's target (``xccl.plugins``: ``ascend``).
plugin: Final = AscendPlugin()
