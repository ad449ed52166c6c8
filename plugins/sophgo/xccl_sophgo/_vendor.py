"""What Sophgo's torch_tpu does at run time, declared as data (:class:`xccl.plugin.VendorRuntime`).

Cheap (imported by the entry point's module): no SDK import. xccl acts on the declaration on the hardware and the
simulation reproduces it; every item names the line of sophgo/torch-tpu@fe9b478 it was read from.
"""

from __future__ import annotations

from typing import Final

from xccl.plugin import Completion, TorchPatch, VendorRuntime

__all__ = ["ADAPTOR_PATCHES", "SCCL_RUNTIME"]

_ADAPTOR: Final = "sophgo/torch-tpu@fe9b478 torch_tpu/accelerator/adaptor/torch_adaptor/distributed.py"
#: When the adaptor's patches exist at all.
_WHEN: Final = ("once `import torch_tpu.accelerator` loaded Sophgo's torch adaptor, which is on unless "
                "ENABLE_TORCH_ADAPTOR=0, DISABLE_ADAPTOR=1 or DS_DISABLE_TPU=1 is set before the import")
_SWITCH: Final = "accelerator/adaptor/__init__.py:1-3, accelerator/utils.py (environ_flag defaults to 1)"


def _one_rank_noop(target: str, lines: str) -> TorchPatch:
    return TorchPatch(f"torch.distributed.{target}", "on a group of one rank returns a handle that does nothing",
                      f"{_ADAPTOR}:{lines}", _WHEN)


#: The replacements of ``torch.distributed`` functions by Sophgo's torch adaptor, all conditional: torch_tpu's
#: import alone applies none (the plugin imports ``torch_tpu``, never ``torch_tpu.accelerator``). Only the first is
#: simulated (``xccl_sophgo._adaptor_sim``, under ENABLE_TORCH_ADAPTOR=1): with it, xccl refuses the world it did
#: not get (``xccl.init`` raises InitError), so the others never meet an xccl world.
ADAPTOR_PATCHES: Final = (
    TorchPatch(
        "torch.distributed.init_process_group",
        "passes backend='sccl' whatever backend it is given (with a chip map 0..world_size-1 when pg_options has "
        "none)",
        f"{_ADAPTOR}:83-97,127; {_SWITCH}",
        _WHEN,
    ),
    TorchPatch(
        "torch.distributed.new_group",
        "makes a group of one rank on gloo whatever backend is given, and gives a group without pg_options the "
        "world's chip map",
        f"{_ADAPTOR}:102-119,128",
        _WHEN,
    ),
    TorchPatch(
        "torch.distributed.all_reduce",
        "reduces bool, int8, uint8 and int64 as int32 and float64 as float32 (narrowed silently), and does nothing "
        "on a group of one rank",
        f"{_ADAPTOR}:55-72,124",
        _WHEN,
    ),
    TorchPatch(
        "torch.distributed.reduce",
        "reduces bool, int8, uint8 and int64 as int32 and float64 as float32 (narrowed silently), and does nothing "
        "on a group of one rank",
        f"{_ADAPTOR}:36-53,123",
        _WHEN,
    ),
    _one_rank_noop("broadcast", "27-34,122"),
    _one_rank_noop("all_gather_into_tensor", "74-81,125-126"),
    _one_rank_noop("isend", "18-25,130,132"),
    _one_rank_noop("irecv", "18-25,131,133"),
)

#: Why a collective with a dead chip never returns (``no_shrink``, ``stuck_forever``).
_NEVER_RETURNS: Final = (
    "it has no timeout, no error path and no abort, so a collective with the dead chip stays on the TPU stream that "
    "compute shares, and nothing can drain it (sophgo/torch-tpu@fe9b478 "
    "torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.cpp:168-191, third_party/sccl/include/sccl.h:41-45,67-96)")

#: SCCL's run-time behaviour. Completion: WorkSCCL::isCompleted() and wait() return true at once, for every op,
#: barrier included (ProcessGroupSCCL.cpp:183-191, 745-782); the op is queued on the current TPU stream.
SCCL_RUNTIME: Final = VendorRuntime(
    completion=Completion.AT_ONCE,
    completion_source="sophgo/torch-tpu@fe9b478 torch_tpu/csrc/distributed/c10d/ProcessGroupSCCL.cpp:183-191,745-782",
    patches=ADAPTOR_PATCHES,
    no_shrink=f"SCCL cannot survive a lost chip in place: {_NEVER_RETURNS}",
    stuck_forever=_NEVER_RETURNS,
)
