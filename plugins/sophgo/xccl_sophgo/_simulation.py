"""What the CPU simulation of ProcessGroupSCCL enforces (manifest B2/B3).

:func:`sccl_profile` describes SCCL for :mod:`xccl.plugin`: the ``sccl`` backend name, the c10d methods
ProcessGroupSCCL implements (the others raise what the vendor raises), its eight dtypes, its four reduce ops, and
its creator's checks on ``pg_options``. Where the hardware would compute garbage instead of raising (split sizes
ignored by all_to_all_single, an empty chip map, a chip map that disagrees with the device the rank selected) the
simulation raises, so that a script that runs in simulation does not silently go wrong on the TPUs.

The simulated node is Sophgo's documented SG2260 board (:data:`BOARD`, :mod:`xccl_sophgo._c2c`): a node's chip map
is checked against its C2C ring before the process group exists, and a map that is no ring is replaced by the ring,
as ``torch_tpu.tpu.set_chip_map`` does on the hardware with the driver's topology.

What a group's ``chip_map`` means to libsccl is closed source (``scclCommInitRank(comm, nranks, id, rank,
chip_map)``, ``ProcessGroupSCCL.cpp:235-246``, gets the group's size and rank and the map, nothing else). What is
published, and what the simulation infers from it:

* the tutorial's maps have one chip per rank, "for the correspondence of processes and devices", listed in ring
  order (``03_Tutorial.rst:81-94,229``): a map of exactly the group's size gives group rank ``i`` chip
  ``chip_map[i]``, must be this rank's chip, and must be a C2C ring in map order;
* Sophgo's own code gives every sub-group the node's (or the world's) whole map (sophgo/vllm-tpu@b010f67
  ``vllm_tpu/hack/distributed.py``, ``GroupCoordinator.__init__``: ``set_chip_map`` per group; torch-tpu's adaptor,
  ``torch_adaptor/distributed.py:102-116``: the world's map copied) [inferred: a map longer than the group is the
  node's ring, on which libsccl finds each member by the chip it selected]: it must be a C2C ring in map order and
  contain this rank's chip.

A sub-group given only its members' chips (``[0, 2, 6, 7]`` for ranks 0-3 on the eight-chip ring) is then a map of
the group's size that is no ring (7 and 0 are not linked), and is refused. A map that repeats a chip spans several
nodes, which Sophgo does not document: only this rank's entry is checked.
"""

from __future__ import annotations

from typing import Final

from xccl.plugin import SimProfile

from ._c2c import SG2260
from ._sdk import SimulatedSCCLOptions, current_simulated_chip
from ._table import NATIVE_REDUCE_OPS, SCCL_DTYPES

__all__ = [
    "BASE_CLASS", "BOARD", "NATIVE_OPS", "REDUCE_OP_MESSAGES", "base_class_message", "check_sccl_options",
    "sccl_profile",
]

#: The board the simulation runs on (its first ``XCCL_SOPHGO_SIM_DEVICES`` chips).
BOARD: Final = SG2260


def base_class_message(method: str) -> str:
    """What c10d's ``Backend`` base class raises for ``method`` (its C++ name) on ProcessGroupSCCL, which does not
    override it: ``"Backend " + getBackendName() + " does not support <method>"``, and ProcessGroupSCCL's
    ``getBackendName()`` is ``"SCCL"`` (sophgo/torch-tpu@fe9b478 ``ProcessGroupSCCL.hpp:23,65-66``), upper case,
    unlike the backend name torch.distributed registers (``sccl``)."""
    return f"Backend SCCL does not support {method}"


#: c10d ``Backend`` method -> None where ProcessGroupSCCL implements it, else the message it raises itself (the
#: manifest's). The methods it does not override raise c10d's base-class message instead (:data:`BASE_CLASS`).
NATIVE_OPS: Final = {
    "allreduce": None,
    "broadcast": None,
    "reduce": None,
    "allgather": None,
    "_allgather_base": None,
    "gather": None,
    "scatter": None,
    "alltoall_base": None,
    "barrier": None,
    # Implemented in the source (scclSend/scclRecv) although the doc marks them ✖; the capability table follows
    # the doc and does not call them, but a user calling dist.send on the group reaches what the source has.
    "send": None,
    "recv": None,
    "reduce_scatter": "ProcessGroupSCCL does not support reduce_scatter",
}

#: The c10d methods ProcessGroupSCCL does not override (``ProcessGroupSCCL.hpp:75-142``) -> c10d's base-class message
#: (:func:`base_class_message`, C++ method names): listed because xccl's default message names the backend as
#: torch.distributed registers it, ``sccl``.
BASE_CLASS: Final = {
    **{m: base_class_message(m) for m in ("_reduce_scatter_base", "alltoall", "allreduce_coalesced",
                                          "allgather_coalesced", "allgather_into_tensor_coalesced",
                                          "reduce_scatter_tensor_coalesced")},
    "recv_anysource": base_class_message("recvAnysource"),
}


#: What ``toSCCLReduceOp`` raises for each reduce op it does not map (``ProcessGroupSCCL.cpp:361-375``): one
#: message per op, AVG and PREMUL_SUM included.
REDUCE_OP_MESSAGES: Final = {op: f"Cannot use ReduceOp.{op.upper()} with SCCL"
                             for op in ("band", "bor", "bxor", "premul_sum", "avg")}


def check_sccl_options(options: object | None, group_rank: int, group_size: int) -> None:
    """The checks ``createProcessGroupSCCL(dist_backend_opts, Options&)`` makes, plus two the hardware implies.

    Raises:
        TypeError: ``options`` is None or not a ProcessGroupSCCLOptions: the pybind creator takes ``Options&``
            and cannot bind anything else [inferred: pybind's "incompatible function arguments"].
        RuntimeError: the chip map is shorter than the group (SCCL's check); empty (the communicator would get no
            chip mapping); or this rank's entry is not the chip its process selected with ``set_device``.
    """
    if not isinstance(options, SimulatedSCCLOptions):
        raise TypeError(
            "createProcessGroupSCCL(): incompatible function arguments; pg_options must be a "
            f"torch_tpu.ProcessGroupSCCLOptions, got {type(options).__name__} (SCCL cannot be created without "
            "options: pass pg_options=ProcessGroupSCCLOptions() with chip_map set)"
        )
    chip_map = list(options.chip_map)
    if not chip_map:
        raise RuntimeError(
            "ProcessGroupSCCL: chip_map is empty (refused by the xccl simulation: SCCL would initialise its "
            "communicator without a chip mapping); set ProcessGroupSCCLOptions.chip_map to the group's chips"
        )
    if len(chip_map) < group_size:
        # The creator's own check and words (ProcessGroupSCCL.cpp:794-796), then what they mean.
        raise RuntimeError(
            f"chip map size must be same with the nranks (ProcessGroupSCCL: chip_map {chip_map} has {len(chip_map)} "
            f"entries but the group has {group_size} ranks; chip_map must give a chip for every rank of the group)"
        )
    current = current_simulated_chip()
    one_node = len(set(chip_map)) == len(chip_map)
    if len(chip_map) == group_size or not one_node:
        if current is not None and chip_map[group_rank] != current:
            raise RuntimeError(
                f"ProcessGroupSCCL: chip_map {chip_map} gives group rank {group_rank} chip {chip_map[group_rank]}, "
                f"but this process selected chip {current} with torch_tpu.tpu.set_device (refused by the xccl "
                "simulation: the communicator and the tensors would be on different chips)"
            )
    elif current is not None and current not in chip_map:
        raise RuntimeError(
            f"ProcessGroupSCCL: chip_map {chip_map} (the node's map) does not hold chip {current}, which this process "
            "selected with torch_tpu.tpu.set_device (refused by the xccl simulation)"
        )
    if one_node and group_size > 1 and not BOARD.is_ring(chip_map):
        raise RuntimeError(
            f"ProcessGroupSCCL: chip_map {chip_map} is not a C2C ring in map order: SCCL runs its ring over the map's "
            "chips, each directly linked to the next and the last to the first (refused by the xccl simulation "
            "[inferred]; Sophgo's code gives every group the node's whole map, which is one)"
        )


def sccl_profile() -> SimProfile:
    """The simulation profile of ProcessGroupSCCL."""
    return SimProfile(
        backend="sccl",
        vendor_name="ProcessGroupSCCL",
        native_ops={**NATIVE_OPS, **BASE_CLASS},
        dtypes=SCCL_DTYPES,
        reduce_ops=NATIVE_REDUCE_OPS,
        uneven_all_to_all=False,
        check_options=check_sccl_options,
        reduce_op_messages=REDUCE_OP_MESSAGES,
    )
