"""xccl-ascend: the xccl plugin for Huawei Ascend NPUs (HCCL through torch_npu), and its CPU simulation.

``xccl.init(vendor="ascend")`` selects it on an Ascend host; ``XCCL_SIMULATE=ascend`` (or
``xccl.init(vendor="ascend", simulate=True)``) runs the same code path on CPU with HCCL's rules enforced.
Importing this package never imports torch_npu.
"""

from collections.abc import Callable
from typing import Any

from ._constraints import ProductLine, product_line
from ._hccl_config import HCCL_CONFIG_KEYS, set_hccl_config, validate_hccl_config
from ._plugin import AscendPlugin, plugin
from ._probe import HostReport, find_cann, parse_visible_devices, probe_host

__all__ = [
    "HCCL_CONFIG_KEYS",
    "AscendPlugin",
    "HostReport",
    "ProductLine",
    "find_cann",
    "parse_visible_devices",
    "plugin",
    "probe_host",
    "product_line",
    "reset_mc2_domain",
    "set_hccl_config",
    "sim_npu_backend",
    "validate_hccl_config",
]


def reset_mc2_domain() -> None:
    """Forget the communication domain this process's fused kernels used (Atlas A2 allows one per model).

    Call it when a new model starts whose fused ops run on another group.
    """
    from ._runtime import MC2_DOMAIN

    MC2_DOMAIN.reset()


def sim_npu_backend(**kwargs: Any) -> Callable[..., Any]:
    """``torchair.get_npu_backend(**kwargs)`` in simulation, for code that compiles the way Ascend's tutorials do,
    ``torch.compile(model, backend=torchair.get_npu_backend())``: TorchAir's backend without xccl's lowering (see
    docs/vendors/ascend.md, graph mode). On the hardware, call TorchAir's own.
    """
    from ._torchair_sim import get_npu_backend

    return get_npu_backend(**kwargs)
