"""The SDK boundary: every call xccl makes into torch_npu, behind one small interface.

The runtime (``_runtime``) is the same code on hardware and in simulation; only the object implementing
:class:`HcclSdk` differs. :class:`NpuSdk` here calls torch_npu (imported lazily, on first use, never by the cheap
plugin module); ``_sdk_sim.SimSdk`` computes the same results on CPU over the simulated ``hccl`` group. Every
torch_npu and TorchAir attribute used is in this module, and ``tests/test_manifest_symbols.py`` checks each one
against section A of the vendor API manifest.

Graph mode: :meth:`HcclSdk.graph_ops` gives the vendor ops xccl's graph ops are lowered to
(``_torchair_lower``), and :meth:`HcclSdk.compile_backend` the compile backend that takes the lowering: TorchAir
with the settings xccl's graphs need on the hardware, the simulated TorchAir in simulation (``_torchair_sim``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import torch

from xccl.plugin import BackendUnavailable, KernelContext

from ._torchair_lower import GraphOps

__all__ = ["TOPOLOGY_SORTING", "HcclSdk", "NpuSdk"]

#: TorchAir's topological sort for xccl's graphs: StableRDFS keeps the program order of the communication, which
#: every rank must issue alike (TorchAir forces it itself for more than one send/recv in a max-autotune graph;
#: seed 000; Ascend/torchair configs/experimental_config.py, npu_fx_compiler.py ``_process_send_recv``).
TOPOLOGY_SORTING: Final = "StableRDFS"


class HcclSdk(Protocol):
    """What the Ascend runtime needs from torch_npu."""

    #: Device type of the tensors: ``"npu"``, or ``"cpu"`` in simulation.
    device_type: str

    def device_count(self) -> int:
        """Visible NPUs (after ``ASCEND_RT_VISIBLE_DEVICES``)."""
        ...

    def set_device(self, index: int) -> None:
        """Make NPU ``index`` current."""
        ...

    def device_name(self) -> str:
        """The chip name, e.g. ``"Ascend910B1"``."""
        ...

    def options(self, hccl_config: dict[str, int | str]) -> Any:
        """A ``ProcessGroupHCCL.Options`` carrying ``hccl_config``."""
        ...

    def comm_name(self, group: Any, rank: int) -> str:
        """HCCL's communicator name for ``group``; creates the communicator, so every member must call it."""
        ...

    def all_gather_into_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], ctx: KernelContext, async_op: bool
    ) -> Any:
        """torch_npu's uneven all_gather: rank i contributes ``sizes[i]`` rows."""
        ...

    def reduce_scatter_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], op: Any, ctx: KernelContext, async_op: bool
    ) -> Any:
        """torch_npu's uneven reduce_scatter: rank i receives ``sizes[i]`` rows."""
        ...

    def has_all_to_all_vc(self) -> bool:
        """Whether the installed torch_npu exports ``torch_npu.distributed.all_to_all_vc`` (builds of
        the development branches v2.7.1 and v2.9.0-v2.12.0 do; the release wheels do not)."""
        ...

    def comm_connected(self, group: Any) -> bool | None:
        """Whether ``group``'s communicator exists yet (HCCL creates it at the group's first collective); None
        when unknown."""
        ...

    def all_to_all_vc(
        self, output: torch.Tensor, input: torch.Tensor, matrix: Sequence[Sequence[int]], ctx: KernelContext, async_op: bool
    ) -> Any:
        """torch_npu's all_to_all with a count matrix (``matrix[i][j]`` elements from rank i to rank j); only where
        :meth:`has_all_to_all_vc`."""
        ...

    def mm_reduce_scatter_base(self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int) -> torch.Tensor:
        """``reduce_scatter(a @ b)`` along dim 0, fused."""
        ...

    def all_gather_base_mm(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, gather_output: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(all_gather(a) @ b, all_gather(a))``, fused; the second is empty unless ``gather_output``."""
        ...

    def mm_all_reduce_base(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``all_reduce(a @ b + bias)``, fused (the bias is added on every rank before the sum)."""
        ...

    def graph_ops(self) -> GraphOps:
        """The vendor ops xccl's graph ops lower to (TorchAir's ``npu_define`` ops, torch_npu's MC2 ops)."""
        ...

    def stop_device(self) -> None:
        """Abort every task of the current device (``torch_npu.npu.stop_device``)."""
        ...

    def restart_device(self) -> None:
        """Let the current device take work again (``torch_npu.npu.restart_device``)."""
        ...

    def close(self) -> None:
        """Undo what loading the SDK did, where that can be undone (torch_npu's own import cannot be)."""
        ...

    def compile_backend(self, decompositions: Mapping[Any, Callable[..., Any]]) -> Callable[..., Any] | None:
        """The ``torch.compile`` backend graphs go to, tracing with ``decompositions`` (the lowering)."""
        ...

    def register_graph_converters(self, converters: Mapping[Any, Callable[..., Any]]) -> None:
        """Register GE converters with TorchAir (its public ``register_fx_node_ge_converter``), for the graphs
        users compile with TorchAir's own backend."""
        ...


def _hccl_backend(group: Any) -> Any:
    """The ProcessGroupHCCL behind ``group``, the way the manifest describes for this torch (A2)."""
    if _torch_newer_than_2_0_1():
        return group._get_backend(torch.device("npu"))
    return group  # torch <= 2.0.1: the group is the ProcessGroupHCCL itself


def _torch_newer_than_2_0_1() -> bool:
    parts = torch.__version__.split("+", 1)[0].split(".")
    try:
        return (int(parts[0]), int(parts[1]), int(parts[2][:1] or 0)) > (2, 0, 1)
    except (IndexError, ValueError):
        return True


class NpuSdk:
    """torch_npu 2.13.0 as manifest section A describes it.

    Raises:
        BackendUnavailable: importing torch_npu fails (no CANN, wrong torch); the message carries the cause.
    """

    device_type = "npu"

    def __init__(self) -> None:
        try:
            import torch_npu  # noqa: F401, TID251 - the one place the SDK is imported, once the plugin is selected
        except Exception as exc:  # any failure here means the vendor stack cannot load
            raise BackendUnavailable(
                "ascend",
                f"importing torch_npu failed: {type(exc).__name__}: {exc}",
                "run `xccl doctor` to see what is missing (usually CANN's set_env.sh was not sourced)",
            ) from exc

    def device_count(self) -> int:
        import torch_npu  # noqa: TID251

        return int(torch_npu.npu.device_count())

    def set_device(self, index: int) -> None:
        import torch_npu  # noqa: TID251

        torch_npu.npu.set_device(index)

    @functools.cache  # noqa: B019 - one SDK object per process, and the chip does not change under it
    def device_name(self) -> str:
        import torch_npu  # noqa: TID251

        return str(torch_npu.npu.get_device_name())

    def options(self, hccl_config: dict[str, int | str]) -> Any:
        import torch_npu  # noqa: TID251

        options = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
        options.hccl_config = dict(hccl_config)
        return options

    def comm_name(self, group: Any, rank: int) -> str:
        if _torch_newer_than_2_0_1():
            return str(_hccl_backend(group).get_hccl_comm_name(rank, init_comm=True))
        return str(_hccl_backend(group).get_hccl_comm_name(rank))

    def all_gather_into_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], ctx: KernelContext, async_op: bool
    ) -> Any:
        import torch_npu  # noqa: TID251

        return torch_npu.distributed.all_gather_into_tensor_uneven(
            output, input, output_split_sizes=list(sizes), group=ctx.group, async_op=async_op
        )

    def reduce_scatter_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], op: Any, ctx: KernelContext, async_op: bool
    ) -> Any:
        import torch_npu  # noqa: TID251

        return torch_npu.distributed.reduce_scatter_tensor_uneven(
            output, input, input_split_sizes=list(sizes), op=op, group=ctx.group, async_op=async_op
        )

    @functools.cache  # noqa: B019 - one SDK object per process; the installed release does not change under it
    def has_all_to_all_vc(self) -> bool:
        import torch_npu  # noqa: TID251

        # A runtime probe, not a version comparison: the API follows the release branch, not the version number
        # (the manifest read it in a 2.13.0 wheel that the three public 2.13.0 tags do not match).
        return hasattr(torch_npu.distributed, "all_to_all_vc")

    def comm_connected(self, group: Any) -> bool | None:
        import torch.distributed as dist

        try:
            # init_comm=False: the name if the communicator exists, "" otherwise, without creating it (what
            # torch_npu's own profiler asks, profiler_interface.py:379-383).
            return bool(_hccl_backend(group).get_hccl_comm_name(dist.get_rank(), init_comm=False))
        except (AttributeError, RuntimeError, TypeError):
            return None

    def all_to_all_vc(
        self, output: torch.Tensor, input: torch.Tensor, matrix: Sequence[Sequence[int]], ctx: KernelContext, async_op: bool
    ) -> Any:
        import torch_npu  # noqa: TID251

        return torch_npu.distributed.all_to_all_vc(
            output, input, [list(row) for row in matrix], group=ctx.group, async_op=async_op
        )

    # The fused kernels take their first tensor positionally: the schema names it ``self`` (gotcha 13).
    def mm_reduce_scatter_base(self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int) -> torch.Tensor:
        import torch_npu  # noqa: TID251

        out: torch.Tensor = torch_npu.npu_mm_reduce_scatter_base(a, b, hcom, world_size, reduce_op="sum", comm_turn=0)
        return out

    def all_gather_base_mm(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, gather_output: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch_npu  # noqa: TID251

        out, gathered = torch_npu.npu_all_gather_base_mm(
            a, b, hcom, world_size, gather_index=0, gather_output=gather_output, comm_turn=0
        )
        return out, gathered

    def mm_all_reduce_base(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, bias: torch.Tensor | None
    ) -> torch.Tensor:
        import torch_npu  # noqa: TID251

        out: torch.Tensor = torch_npu.npu_mm_all_reduce_base(a, b, hcom, reduce_op="sum", bias=bias, comm_turn=0)
        return out

    def stop_device(self) -> None:
        import torch_npu  # noqa: TID251

        torch_npu.npu.stop_device(torch_npu.npu.current_device())

    def restart_device(self) -> None:
        import torch_npu  # noqa: TID251

        torch_npu.npu.restart_device(torch_npu.npu.current_device())

    def close(self) -> None:
        pass  # torch_npu's import (its patches of torch.distributed included) lasts as long as the process

    def graph_ops(self) -> GraphOps:
        import torch_npu  # noqa: F401, TID251 - registers torch.ops.npu.* and installs the lazy ``torchair`` module
        import torchair  # noqa: F401, TID251 - its import defines torch.ops.npu_define.* (torch >= 2.3.1, manifest A5)

        define, npu = torch.ops.npu_define, torch.ops.npu
        return GraphOps(
            send=define._send.default,
            recv=define._recv.default,
            allgather_uneven=define.allgather_in_tensor_uneven.default,
            reduce_scatter_uneven=define.reduce_scatter_tensor_uneven.default,
            mm_reduce_scatter=npu.npu_mm_reduce_scatter_base.default,
            all_gather_mm=npu.npu_all_gather_base_mm.default,
            mm_all_reduce=npu.npu_mm_all_reduce_base.default,
        )

    def compile_backend(self, decompositions: Mapping[Any, Callable[..., Any]]) -> Callable[..., Any] | None:
        import torch_npu  # noqa: F401, TID251 - installs the lazy ``torchair`` module (manifest A5)
        import torchair  # noqa: TID251

        config = torchair.CompilerConfig()  # mode "max-autotune": the GE graph
        config.experimental_config.topology_sorting_strategy = TOPOLOGY_SORTING
        backend: Callable[..., Any] = torchair.get_npu_backend(
            compiler_config=config, custom_decompositions=dict(decompositions)
        )
        return backend

    def register_graph_converters(self, converters: Mapping[Any, Callable[..., Any]]) -> None:
        import torch_npu  # noqa: F401, TID251 - installs the lazy ``torchair`` module (manifest A5)
        import torchair  # noqa: TID251

        for op, converter in converters.items():
            torchair.register_fx_node_ge_converter(op)(converter)
