"""What the CPU simulation of ProcessGroupSCCL enforces (manifest B2/B3).

:func:`sccl_profile` describes SCCL for :mod:`xccl.plugin`: the ``sccl`` backend name, the c10d methods
ProcessGroupSCCL implements (the others raise what the vendor raises), its eight dtypes, its four reduce ops, and
its creator's checks on ``pg_options``. Where the hardware would compute garbage instead of raising (split sizes
ignored by all_to_all_single, an empty chip map, a chip map that disagrees with the device the rank selected) the
simulation raises, so that a script that runs in simulation does not silently go wrong on the TPUs.

The simulated node is Sophgo's documented SG2260 board (:data:`BOARD`, :mod:`xccl_sophgo._c2c`): a node's chip map
is checked against its C2C ring before the process group exists, and a map that is no ring is replaced by the ring,
as ``torch_tpu.tpu.set_chip_map`` does on the hardware with the driver's topology.
"""

from __future__ import annotations

from typing import Final

from xccl.plugin import SimProfile

from ._c2c import SG2260
from ._sdk import SimulatedSCCLOptions, current_simulated_chip
from ._table import NATIVE_REDUCE_OPS, SCCL_DTYPES

__all__ = ["BOARD", "NATIVE_OPS", "REDUCE_OP_MESSAGES", "check_sccl_options", "sccl_profile"]

#: The board the simulation runs on (its first ``XCCL_SOPHGO_SIM_DEVICES`` chips).
BOARD: Final = SG2260

#: c10d ``Backend`` method -> None where ProcessGroupSCCL implements it, else the message it raises. Methods left
#: out (``_reduce_scatter_base``, ``alltoall``, the coalesced ones) raise the c10d base class's
#: "Backend sccl does not support <method>", since ProcessGroupSCCL does not override them.
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
        raise RuntimeError(
            f"ProcessGroupSCCL: chip_map {chip_map} has {len(chip_map)} entries but the group has {group_size} "
            "ranks; chip_map must give a chip for every rank of the group"
        )
    current = current_simulated_chip()
    if current is not None and chip_map[group_rank] != current:
        raise RuntimeError(
            f"ProcessGroupSCCL: chip_map {chip_map} gives group rank {group_rank} chip {chip_map[group_rank]}, but "
            f"this process selected chip {current} with torch_tpu.tpu.set_device (refused by the xccl simulation: "
            "the communicator and the tensors would be on different chips)"
        )


def sccl_profile() -> SimProfile:
    """The simulation profile of ProcessGroupSCCL."""
    return SimProfile(
        backend="sccl",
        vendor_name="ProcessGroupSCCL",
        native_ops=NATIVE_OPS,
        dtypes=SCCL_DTYPES,
        reduce_ops=NATIVE_REDUCE_OPS,
        uneven_all_to_all=False,
        check_options=check_sccl_options,
        reduce_op_messages=REDUCE_OP_MESSAGES,
    )
