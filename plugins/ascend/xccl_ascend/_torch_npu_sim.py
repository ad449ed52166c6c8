"""torch_npu's replacements of ``torch.distributed`` functions, as the simulated SDK applies them on "import".

Each function follows torch_npu 2.13's own (Ascend/pytorch@462f4e1, ``torch_npu/distributed/nn/functional.py`` and
``torch_npu/distributed/distributed_c10d.py``), with two substitutions: the simulated NPU's device type is the CPU's,
and where torch_npu reaches the group's HCCL backend (``group._get_backend(npu)``) the simulation reaches the
simulated HCCL group, so HCCL's own checks still apply while xccl's dispatch is bypassed, as on the hardware.
:data:`REPLACEMENTS` maps every target the plugin declares (``_vendor.ascend_runtime().patches``) to its stand-in.

``batch_isend_irecv`` takes torch_npu's branch for the simulated CANN (``XCCL_SIM_CANN_VERSION``, default 9.0.0)
and chip (``XCCL_SIM_ASCEND_SOC``, default A2 = ``Ascend910B1``): from CANN 9.0 on Ascend910B1..B4_1 and
Ascend910_9362..9392, torch's coalescing manager over the group's own send/recv, which is xccl's dispatch; otherwise
one ``batch_isend_irecv`` on the HCCL backend. Both run on the group's communicator, in one batch
(``GroupRuntime.coalescing``: the group connects, no work before the batch ends), where torch's coalescing manager
would call ``group._start_coalescing(npu)``, which reaches ProcessGroupHCCL through the group's registered NPU backend:
in simulation that backend is gloo's, which has no coalescing.

What is not reproduced: HCCL's gather in torch_npu's "compatible" mode (off by default).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from xccl.plugin import Work, simulated_group_of, version_below

from ._simprofile import sim_device_name

__all__ = ["NPU", "REPLACEMENTS"]

#: The simulated NPU's device type.
NPU: Final = "cpu"


def _hccl(group: Any) -> Any:
    """What torch_npu's ``group._get_backend(torch.device("npu"))`` is in simulation: the simulated HCCL group."""
    found = simulated_group_of(group)
    return found if found is not None else group._get_backend(torch.device(NPU))


def allgather_base_backward_hccl(ctx: Any, grad_output: torch.Tensor) -> tuple[None, torch.Tensor, None]:
    """torch_npu's ``_allgather_base_backward_hccl`` (``nn/functional.py:8-30``): its backend-name check included."""
    if dist.get_backend(group=ctx.group) in (dist.Backend.NCCL, dist.Backend.XCCL, dist.Backend.HCCL):  # type: ignore[attr-defined]
        world_size = dist.get_world_size(group=ctx.group)
        out_size = list(grad_output.size())
        if out_size[0] % world_size != 0:
            raise RuntimeError(
                f"Tensor with dimensions: {out_size} does not have first dimension divisible by world_size: "
                f"{world_size}"
            )
        out_size[0] = out_size[0] // world_size
        gx = torch.empty(out_size, device=grad_output.device, dtype=grad_output.dtype)
        dist._reduce_scatter_base(gx, grad_output, dist.ReduceOp.SUM, ctx.group)
    else:
        raise RuntimeError("Backend not supported!")
    return (None, gx, None)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0, group: Any = None,
           async_op: bool = False) -> Any:
    """torch_npu's ``_gather`` (``distributed_c10d.py:167-279``), default (non-compatible) mode: an all_gather on
    the group's HCCL backend, after a ``broadcast_object_list`` of the root's sizes."""
    c10d._check_single_tensor(tensor, "tensor")
    if gather_list:
        c10d._check_tensor_list(gather_list, "gather_list")
    else:
        gather_list = []
    c10d._ensure_all_tensors_same_dtype(tensor, gather_list)
    if c10d._rank_not_in_group(group):
        c10d._warn_not_in_group("gather")
        return None
    my_rank = dist.get_rank()
    c10d._validate_output_list_for_rank(my_rank, dst, gather_list)
    group_size = c10d._get_group_size(group)
    recv_size_list: list[Any] = (
        [None for _ in range(group_size)] if my_rank != dst else [t.size() for t in gather_list]
    )
    if group is None or group is c10d.GroupMember.WORLD:
        group = c10d._get_default_group()
    if tensor.device.type != NPU:
        output_tensors = [gather_list] if dst == my_rank else []
        opts = dist.GatherOptions()
        opts.rootRank = dist.get_group_rank(group, dst)
        work = group.gather(output_tensors, [tensor], opts)
    else:
        if my_rank == dst:
            warnings.warn("HCCL doesn't support gather at the moment. Implemented with allgather instead.",
                          stacklevel=2)
        dist.broadcast_object_list(recv_size_list, dst, group)
        if not gather_list:
            gather_list = [torch.empty(size, dtype=tensor.dtype, device=tensor.device) for size in recv_size_list]
        work = _hccl(group).allgather([gather_list], [tensor])
    if async_op:
        return work
    work.wait()
    return None


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group: Any = None) -> None:
    """torch_npu's ``_gather_object`` (``distributed_c10d.py``, after ``_gather``): torch's own, except that it calls
    torch_npu's ``_gather`` (above), whose signature has no ``group_dst``; torch 2.13's ``gather_object`` passes one
    to whatever ``dist.gather`` is, so without this replacement every DCP save and load fails on the stand-in."""
    if c10d._rank_not_in_group(group):
        c10d._warn_not_in_group("gather_object")
        return
    my_rank = dist.get_rank()
    c10d._validate_output_list_for_rank(my_rank, dst, object_gather_list)
    device = c10d._get_pg_default_device(group)
    input_tensor, local_size = c10d._object_to_tensor(obj, device, group)
    group_size = dist.get_world_size(group=group)
    sizes = torch.zeros(group_size, dtype=torch.long, device=device)
    size_list = [sizes[i].unsqueeze(dim=0) for i in range(group_size)]
    dist.all_gather(size_list, local_size, group=group)
    max_size = int(max(size_list).item())  # type: ignore[type-var]
    input_tensor.resize_(max_size)
    outputs: list[torch.Tensor] = []
    if my_rank == dst:
        coalesced = torch.empty(max_size * group_size, dtype=torch.uint8, device=device)
        outputs = [coalesced[max_size * i: max_size * (i + 1)] for i in range(group_size)]
    gather(input_tensor, gather_list=outputs if my_rank == dst else None, dst=dst, group=group)
    if my_rank != dst or object_gather_list is None:
        return
    for i, tensor in enumerate(outputs):
        object_gather_list[i] = c10d._tensor_to_object(tensor.type(torch.uint8), size_list[i], group)


def coalesces(device_name: str, cann: str) -> bool:
    """Whether torch_npu 2.13's ``_batch_isend_irecv`` takes torch's coalescing manager on this chip and CANN
    (``distributed_c10d.py:67``: ``_is_gte_cann_version("9.0.0")``, read once at import; ``:108-119``: the chip
    names compared as strings)."""
    chip = ("Ascend910B1" <= device_name <= "Ascend910B4_1") or ("Ascend910_9362" <= device_name <= "Ascend910_9392")
    return chip and not version_below(cann, "9.0.0")


def batch_isend_irecv(p2p_op_list: list[dist.P2POp]) -> list[Any]:
    """torch_npu's ``_batch_isend_irecv`` (``distributed_c10d.py:87-164``): with CANN 9.0 or newer on Atlas A2/A3,
    torch's coalescing manager over the group's own isend/irecv (xccl's dispatch on xccl's group); otherwise one
    call of the HCCL backend's ``batch_isend_irecv`` with the ops' types, tensors and group ranks (the simulated
    HCCL group runs them as its own sends and receives). Either way one batch on the group's communicator."""
    from ._torchair_sim import sim_cann_version

    group = p2p_op_list[0].group
    device = p2p_op_list[0].tensor.device
    is_multi_pg = True
    # A group that is not the simulated HCCL group (a gloo group: the simulated NPU's device type is the CPU's)
    # takes torch_npu's branch for other devices, as its CPU tensors would on the hardware.
    if device.type != NPU or simulated_group_of(c10d._get_default_group() if group is None else group) is None:
        reqs = []
        for op in p2p_op_list:
            work = op.op(op.tensor, op.peer, op.group, op.tag)
            if work:
                reqs.append(work)
        return reqs
    if group is None:
        group = c10d._get_default_group()
        is_multi_pg = False
    # torch_npu reads the CANN version once, at import; the simulation reads it per call, so a test may set it.
    # (It also coalesces over torch's fake backend, which is never the simulated HCCL group's.)
    if coalesces(sim_device_name(os.environ), sim_cann_version()):
        c10d._check_p2p_op_list(p2p_op_list)
        with _coalescing_manager(group) as works:
            for op in p2p_op_list:
                peer = {"group_dst" if op.op is dist.isend else "group_src": op.group_peer}
                op.op(op.tensor, group=op.group, tag=op.tag, **peer)
        return works
    backend = _hccl(group)
    with _coalescing_manager(group) as works:  # one HcclBatchSendRecv on the group's communicator (:4771-4783)
        for op in p2p_op_list:
            if op.tensor.device.type != NPU:
                raise RuntimeError(f"No backend type associated with device type {op.tensor.device.type}")
            peer = dist.get_group_rank(group, op.peer) if is_multi_pg else op.peer
            send = op.op.__name__ == "isend"
            backend.send([op.tensor], peer, op.tag) if send else backend.recv([op.tensor], peer, op.tag)
    return [works[0] if works else Work()]


@contextlib.contextmanager
def _coalescing_manager(group: Any) -> Iterator[list[Any]]:
    """torch's ``_coalescing_manager(group, npu, async_ops=True)`` for a batch of point-to-point calls (no op list
    to fuse) on the simulated HCCL group: ``group._start_coalescing(npu)`` and ``_end_coalescing`` reach its batch,
    where on the hardware they reach ProcessGroupHCCL through the group's NPU backend; yields the works, as
    ``cm.works`` (the batch's one work, none for an empty batch)."""
    sim = simulated_group_of(group)
    if sim is None:
        raise RuntimeError(f"{group!r} is not a simulated HCCL group")
    with sim.simulated_runtime.coalescing() as works:
        yield works


#: Every declared target and its stand-in (the gather, gather_object and batch_isend_irecv aliases under ``distributed_c10d``
#: are the same functions, as in torch_npu).
REPLACEMENTS: Final[dict[str, Callable[..., Any]]] = {
    "torch.distributed.nn.functional._AllGatherBase.backward": allgather_base_backward_hccl,
    "torch.distributed.gather": gather,
    "torch.distributed.distributed_c10d.gather": gather,
    "torch.distributed.gather_object": gather_object,
    "torch.distributed.distributed_c10d.gather_object": gather_object,
    "torch.distributed.batch_isend_irecv": batch_isend_irecv,
    "torch.distributed.distributed_c10d.batch_isend_irecv": batch_isend_irecv,
}
