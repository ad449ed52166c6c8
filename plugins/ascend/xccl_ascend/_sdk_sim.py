"""The SDK boundary in simulation: torch_npu's calls computed on CPU over the simulated ``hccl`` group.

What is simulated, and how faithfully:

* devices: ``XCCL_SIM_ASCEND_DEVICES`` NPUs (default 8), filtered by ``ASCEND_RT_VISIBLE_DEVICES`` with torch_npu's
  parsing rules, so a launch that would find no device on the hardware fails here too;
* the chip: ``XCCL_SIM_ASCEND_SOC`` is ``A2`` (default, ``Ascend910B1``), ``A3`` (``Ascend910_9391``) or any chip
  name (``Ascend910ProA`` simulates a chip without MC2 kernels);
* CANN: ``XCCL_SIM_CANN_VERSION`` (default: the CANN Ascend pairs with the simulated torch_npu, 8.3.RC1 for 2.8.0 and
  9.0.0 for 2.13.0, ``_releases``), read when asked, as the runtime's ``find_cann`` is on the hardware;
* ``get_hccl_comm_name``: ``"group_name_" + <torch's group name>``, as torch_npu names the communicator
  (``ProcessGroupHCCL`` sets ``pg_name_`` to it and copies it into ``hcclCommName``; ``hccl_config["group_name"]``
  goes to ``hcclUdi`` instead). Rank 0 of the group broadcasts it, so, as on the hardware (which creates the
  communicator there), the call is collective: a rank that skips it leaves the others waiting until the timeout.
  The broadcast runs on the vendor's group itself (``c10d_kernel`` over the simulated HCCL group), not through
  ``torch.distributed`` on xccl's group: on the hardware it happens inside HCCL, which no layer above records. The
  name is cached per group, as HCCL keeps its communicator;
* the torch_npu release: ``XCCL_SIM_TORCH_NPU`` (default: the release paired with the installed torch, 2.8.0 on
  torch 2.8, ``_releases``) decides which APIs exist and what they do (``_releases.Release``): a version
  (``2.12.0``) is a release wheel, built from a release branch (``v2.12.0-26.1.0``, ``v2.7.1-7.2.0``); a branch name
  (``v2.12.0``, ``v2.12.0-26.1.0``) is a build of that branch. ``torch_npu.distributed.all_to_all_vc`` exists on
  the development branches v2.7.1 (adc41e6) and v2.9.0 to v2.12.0 (da74682, cf90439, 0b74b65, a63ae3a:
  ``torch_npu/distributed/__init__.py:2``) only: not on v2.8.0 (c419498), on no release branch (-7.2.0, -7.3.0,
  -26.0.0, -26.1.0 of 2.7.1 to 2.12.0) and in none of the three 2.13.0 tags (462f4e1, 94c0533, 46936d1), so with
  the default release calling it raises the AttributeError the hardware raises;
* torch_npu's patches of torch.distributed (``_vendor.ascend_runtime().patches``): a runtime that "imports"
  the SDK (``SimSdk(imported=True)``, as :class:`~xccl_ascend._runtime.AscendRuntime` builds it) applies
  the stand-ins of ``_torch_npu_sim`` and :meth:`SimSdk.close` undoes them;
* uneven collectives: the same semantics through padding (all_gather, reduce_scatter) and ``all_to_all_single``
  with split sizes (HCCL's ``alltoall_base`` honours them, and so does the simulated group);
* fused kernels: the matmul in float32 on CPU, the collective over the vendor's group (its c10d method: inside the
  MC2 kernel on the hardware, which neither torch.distributed nor xccl's recorder sees, so the simulation must not
  add a call they would record), the result cast back to the input dtype; the kernel finds its group from ``hcom``
  as HCCL does, and an unknown name fails;
* graph mode: TorchAir, up to its conversion to GE (``_torchair_sim``): graphs are traced as TorchAir traces them,
  lowered to stand-ins for the vendor's graph ops, checked node by node against TorchAir's converters and run on
  CPU.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from xccl.plugin import (
    Collective,
    InitError,
    KernelContext,
    c10d_kernel,
    finish,
    install_patches,
    remove_patches,
    simulated_group_of,
    simulated_stream,
)

from ._probe import parse_visible_devices
from ._releases import SIM_TORCH_NPU_ENV
from ._releases import release as npu_release
from ._simprofile import sim_device_name
from ._torch_npu_sim import REPLACEMENTS
from ._torchair_lower import GraphOps
from ._torchair_sim import register_fx_node_ge_converter, sim_cann_version, sim_graph_ops, simulated_torchair
from ._vendor import ascend_runtime

__all__ = [
    "ALL_TO_ALL_VC_BRANCHES", "SIM_DEVICES_ENV", "SIM_SOC_ENV", "SIM_TORCH_NPU_ENV", "SimSdk", "sim_device_name",
    "has_all_to_all_vc", "sim_torch_npu",
]

#: Chip to simulate: ``A2``, ``A3`` or a chip name.
SIM_SOC_ENV: Final = "XCCL_SIM_ASCEND_SOC"
#: Physical NPUs of the simulated host.
SIM_DEVICES_ENV: Final = "XCCL_SIM_ASCEND_DEVICES"
#: What a wait on the device raises once its tasks were stopped (torch_npu's workEnqueue and NPUQueue after
#: ``stop_device``: Ascend/pytorch@462f4e1 ``ProcessGroupHCCL.cpp:3402-3407``, ``NPUQueue.cpp:538-541``).
FORCE_STOP: Final = "FORCE STOP. The device's tasks were stopped (torch_npu.npu.stop_device; simulated)"
#: The development branches that export ``torch_npu.distributed.all_to_all_vc`` (Ascend/pytorch: v2.7.1 adc41e6,
#: v2.9.0 da74682, v2.10.0 cf90439, v2.11.0 0b74b65, v2.12.0 a63ae3a). No release branch (``-7.x.0``,
#: ``-26.x.0``), v2.8.0 (c419498) or 2.13.0 tag exports it, so no release wheel has it.
ALL_TO_ALL_VC_BRANCHES: Final = frozenset({(2, 7, 1), (2, 9, 0), (2, 10, 0), (2, 11, 0), (2, 12, 0)})
_NAME_BYTES: Final = 128  # HCCL's communicator names are char[128]

_SUM: Final = dist.ReduceOp.SUM


def _vendor_group(group: Any) -> Any:
    """The simulated HCCL group under ``group`` (xccl's, or the vendor's own): where HCCL's own communication runs."""
    found = simulated_group_of(group)
    return group if found is None else found


def sim_torch_npu(env: Mapping[str, str] | None = None) -> tuple[str, tuple[int, int, int]]:
    """The simulated torch_npu release from ``XCCL_SIM_TORCH_NPU``, as text and as (major, minor, patch).

    Raises:
        InitError: the value is not a version such as ``2.12.0``.
    """
    raw = npu_release(env).version
    # A branch name: the version between the "v" and the release suffix ("v2.12.0-26.1.0").
    parts = raw.removeprefix("v").split("-", 1)[0].split("+", 1)[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
        patch = int("".join(c for c in parts[2].split("post")[0] if c.isdigit()) or 0) if len(parts) > 2 else 0
    except (IndexError, ValueError):
        raise InitError(f"{SIM_TORCH_NPU_ENV}={raw!r} is not a torch_npu release; set e.g. 2.13.0, 2.12.0 or the "
                        "development branch v2.12.0") from None
    return raw, (major, minor, patch)


def has_all_to_all_vc(release: str) -> bool:
    """Whether the torch_npu ``release`` (a value of ``XCCL_SIM_TORCH_NPU``) exports ``all_to_all_vc``: only a build
    of one of the :data:`ALL_TO_ALL_VC_BRANCHES` development branches does."""
    _, version = sim_torch_npu({SIM_TORCH_NPU_ENV: release})
    development = release.strip().startswith("v") and "-" not in release
    return development and version in ALL_TO_ALL_VC_BRANCHES


class SimSdk:
    """torch_npu's behaviour on CPU; see the module docstring.

    Args:
        env: the environment to read (default ``os.environ``).
        imported: behave as ``import torch_npu`` does: apply its patches of torch.distributed (undone by
            :meth:`close`). The runtime passes True; a test that only needs the SDK's calls leaves them off.
    """

    device_type = "cpu"

    def __init__(self, env: Mapping[str, str] | None = None, *, imported: bool = False) -> None:
        env = os.environ if env is None else env
        self._env = env
        #: The simulated torch_npu release.
        self.version, _ = sim_torch_npu(env)
        self._has_all_to_all_vc = has_all_to_all_vc(self.version)
        raw = env.get(SIM_DEVICES_ENV, "").strip() or "8"
        if not raw.isdigit():
            raise InitError(f"{SIM_DEVICES_ENV}={raw!r} is not a number of NPUs; set it to e.g. 8, or unset it")
        physical = int(raw)
        self._visible = parse_visible_devices(env.get("ASCEND_RT_VISIBLE_DEVICES"), physical)
        self._current = -1
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._groups: dict[str, weakref.ref[Any]] = {}
        self._patched = imported
        if imported:
            # The release in force patches what it patches (2.8.0 leaves _AllGatherBase.backward to torch).
            declared = ascend_runtime().patches
            install_patches("ascend", declared, {p.target: REPLACEMENTS[p.target] for p in declared})

    def close(self) -> None:
        """Undo what the simulated import did (torch_npu's patches of torch.distributed)."""
        if self._patched:
            self._patched = False
            remove_patches("ascend")

    def stop_device(self) -> None:
        """torch_npu's ``stop_device``: the simulated device's stream aborts what it holds and refuses new work."""
        simulated_stream().stop(FORCE_STOP)

    def restart_device(self) -> None:
        """torch_npu's ``restart_device``."""
        simulated_stream().restart()

    def has_all_to_all_vc(self) -> bool:
        """Whether the simulated release exports ``torch_npu.distributed.all_to_all_vc``."""
        return self._has_all_to_all_vc

    def comm_connected(self, group: Any) -> bool | None:
        """Whether ``group``'s communicator is connected (``get_hccl_comm_name(init_comm=False)`` is not empty)."""
        found = simulated_group_of(group)
        return None if found is None else found.simulated_runtime.connected

    def device_count(self) -> int:
        return len(self._visible)

    def set_device(self, index: int) -> None:
        if not 0 <= index < len(self._visible):
            raise RuntimeError(f"Invalid device ID {index}: {len(self._visible)} NPUs are visible (simulated)")
        self._current = index

    def device_name(self) -> str:
        # Read at each call, so a test can change the simulated chip between calls.
        return sim_device_name(self._env)

    def options(self, hccl_config: dict[str, int | str]) -> Any:
        from ._simprofile import SimHcclOptions

        return SimHcclOptions(hccl_config=dict(hccl_config))

    def comm_name(self, group: Any, rank: int) -> str:
        name = self._names.get(group)
        if name is not None:
            return name
        buf = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
        if group.rank() == 0:
            # torch_npu (ProcessGroupHCCL.cpp, tag compatibility_release-pytorch2.13.0 :1132 and :3803-3811).
            raw = f"group_name_{group.group_name}".encode()[: _NAME_BYTES - 1]
            buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        c10d_kernel(Collective.BROADCAST, _vendor_group(group))(buf, 0, False)  # type: ignore[misc]
        name = bytes(buf.tolist()).rstrip(b"\0").decode()
        self._names[group] = name
        self._groups[name] = weakref.ref(group)
        return name

    def _group_of(self, hcom: str, world_size: int | None = None) -> Any:
        ref = self._groups.get(hcom)
        group = ref() if ref is not None else None
        if group is None:
            raise RuntimeError(
                f"hcom {hcom!r} names no HCCL communicator of this process; get it from get_hccl_comm_name "
                "(xccl.comm_name) on the same group on every rank"
            )
        if world_size is not None and world_size != group.size():
            raise RuntimeError(f"world_size={world_size} but communicator {hcom!r} has {group.size()} ranks")
        return group

    # ---------------------------------------------------------------------------------------------- uneven

    def all_gather_into_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], ctx: KernelContext, async_op: bool
    ) -> Any:
        n, m, trail = len(sizes), max(sizes), input.shape[1:]
        padded_in = input.new_zeros((m, *trail))
        padded_in[: input.shape[0]].copy_(input)
        padded_out = output.new_empty((n * m, *trail))
        # As torch_npu calls the HCCL backend itself: the vendor group's c10d method, not torch.distributed.
        work = c10d_kernel(Collective.ALL_GATHER_INTO_TENSOR, ctx.native)(padded_out, padded_in, async_op)  # type: ignore[misc]

        def unpad() -> None:
            offset = 0
            for j, rows in enumerate(sizes):
                output[offset : offset + rows].copy_(padded_out[j * m : j * m + rows])
                offset += rows

        return finish(work, async_op, unpad)

    def reduce_scatter_tensor_uneven(
        self, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], op: Any, ctx: KernelContext, async_op: bool
    ) -> Any:
        n, m, trail = len(sizes), max(sizes), input.shape[1:]
        padded_in = input.new_zeros((n * m, *trail))
        for j, chunk in enumerate(torch.split(input, list(sizes))):
            padded_in[j * m : j * m + sizes[j]].copy_(chunk)
        padded_out = output.new_empty((m, *trail))
        work = c10d_kernel(Collective.REDUCE_SCATTER_TENSOR, ctx.native)(padded_out, padded_in, op, async_op)  # type: ignore[misc]
        mine = sizes[ctx.rank]

        def unpad() -> None:
            output.copy_(padded_out[:mine])

        return finish(work, async_op, unpad)

    def all_to_all_vc(
        self, output: torch.Tensor, input: torch.Tensor, matrix: Sequence[Sequence[int]], ctx: KernelContext, async_op: bool
    ) -> Any:
        if not self._has_all_to_all_vc:
            # What `torch_npu.distributed.all_to_all_vc` raises on a release without it.
            raise AttributeError("module 'torch_npu.distributed' has no attribute 'all_to_all_vc'")
        send = list(matrix[ctx.rank])
        recv = [row[ctx.rank] for row in matrix]
        a2a = c10d_kernel(Collective.ALL_TO_ALL_SINGLE_UNEVEN, ctx.native)
        return a2a(output.view(-1), input.view(-1), recv, send, async_op)  # type: ignore[misc]

    # ----------------------------------------------------------------------------------------------- fused

    def mm_reduce_scatter_base(self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int) -> torch.Tensor:
        _check_mc2_world_size(world_size)
        group = self._group_of(hcom, world_size)
        local = a.float() @ b.float()
        out = torch.empty((a.shape[0] // world_size, b.shape[1]), dtype=torch.float32)
        c10d_kernel(Collective.REDUCE_SCATTER_TENSOR, _vendor_group(group))(out, local, _SUM, False)  # type: ignore[misc]
        return out.to(a.dtype)

    def all_gather_base_mm(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, gather_output: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_mc2_world_size(world_size)
        group = self._group_of(hcom, world_size)
        gathered = a.new_empty((a.shape[0] * world_size, a.shape[1]))
        c10d_kernel(Collective.ALL_GATHER_INTO_TENSOR, _vendor_group(group))(gathered, a.contiguous(), False)  # type: ignore[misc]
        out = (gathered.float() @ b.float()).to(a.dtype)
        return out, gathered if gather_output else a.new_empty((0,))

    def mm_all_reduce_base(
        self, a: torch.Tensor, b: torch.Tensor, hcom: str, bias: torch.Tensor | None
    ) -> torch.Tensor:
        group = self._group_of(hcom)
        local = a.float() @ b.float()
        if bias is not None:
            local += bias.float()  # per the kernel's formula allreduce(x1 @ x2 + bias): on every rank
        c10d_kernel(Collective.ALL_REDUCE, _vendor_group(group))(local, _SUM, False)  # type: ignore[misc]
        return local.to(a.dtype)

    def graph_ops(self) -> GraphOps:
        return sim_graph_ops(self)

    def compile_backend(self, decompositions: Mapping[Any, Callable[..., Any]]) -> Callable[..., Any] | None:
        return simulated_torchair(decompositions, self.graph_ops().names, cann=sim_cann_version())

    def register_graph_converters(self, converters: Mapping[Any, Callable[..., Any]]) -> None:
        for op, converter in converters.items():
            register_fx_node_ge_converter(op)(converter)


def _check_mc2_world_size(world_size: int) -> None:
    """op-plugin's own check in both kernels, whatever the chip (MatmulReduceScatterBaseKernelNpuOpApi.cpp:33-37)."""
    if world_size not in (2, 4, 8, 16, 32):
        raise RuntimeError(f"world_size should be in [2, 4, 8, 16, 32], but the actual value is {world_size}.")
