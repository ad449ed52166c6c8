"""The Sophgo runtime: chip map, device, ``sccl`` options, communicator names, the all_gather constraint.

One code path for hardware and simulation; only the SDK object differs (:mod:`xccl_sophgo._sdk`). On hardware::

    placement = chip map for the job xccl hands over (Runtime.place), from RANK_TABLE_FILE / CHIP_MAP, checked
                against the C2C ring (xccl_sophgo._chipmap)
    os.environ["CHIP_MAP"] = "7,6,2,3"                                  (what set_device reads, comma-separated)
    torch_tpu.tpu.set_device(local_rank)                                -> chip CHIP_MAP[local_rank]
    init_process_group("sccl", pg_options=ProcessGroupSCCLOptions(chip_map=<chips of the node's ranks>))
    new_group(ranks, "sccl", pg_options=ProcessGroupSCCLOptions(chip_map=<the same: the node's whole map>))
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from xccl.plugin import (
    BackendUnavailable,
    Collective,
    ConstraintViolation,
    InitError,
    Job,
    KernelContext,
    Plugin,
    Runtime,
    c10d_kernel,
)

from ._chipmap import Placement, resolve_placement
from ._sdk import SimulatedTpu, TpuSdk

__all__ = ["SophgoRuntime", "load_sdk"]

LOG = logging.getLogger("xccl.sophgo")


def load_sdk(simulate: bool) -> TpuSdk:
    """The SDK boundary: simulated chips, or Sophgo's torch_tpu (imported here, only when not simulating).

    Raises:
        BackendUnavailable: torch_tpu cannot be imported, or is not Sophgo's.
    """
    if simulate:
        return SimulatedTpu()
    try:
        from ._torch_tpu import TorchTpu
    except ImportError as exc:
        raise BackendUnavailable(
            "sophgo",
            f"importing torch_tpu failed: {type(exc).__name__}: {exc}",
            "install Sophgo's torch-tpu from Sophgo's release and source its environment (libsophon on "
            "LD_LIBRARY_PATH, CHIP_ARCH=sg2260); `python -c 'import torch_tpu'` must work",
        ) from exc
    return TorchTpu()


class SophgoRuntime(Runtime):
    """Sets the TPU from the chip map and builds ``ProcessGroupSCCLOptions`` for every group.

    Args:
        plugin: the Sophgo plugin.
        simulate: run on CPU over gloo with simulated chips.
        sdk: the SDK boundary (default: :func:`load_sdk`).
    """

    def __init__(self, plugin: Plugin, *, simulate: bool, sdk: TpuSdk | None = None) -> None:
        super().__init__(plugin, simulate=simulate)
        self.sdk: TpuSdk = sdk if sdk is not None else load_sdk(simulate)
        self._placement: Placement | None = None
        self._warned_nodes = False

    @property
    def placement(self) -> Placement:
        """Where this rank and its peers compute; known once :meth:`place` ran.

        Raises:
            InitError: before :meth:`place`.
        """
        if self._placement is None:
            raise InitError("the Sophgo runtime has no chip map yet: xccl.init sets it up; call xccl.init() first")
        return self._placement

    def place(self, job: Job, *, adopted: bool = False) -> torch.device:
        """Resolve the chip map for ``job``, publish it as ``CHIP_MAP``, and select this local rank's chip.

        xccl calls this before the world's SCCL group exists, which is where torch_tpu needs the device set:
        ProcessGroupSCCL's constructor takes the current TPU stream and every op runs on it
        (``ProcessGroupSCCL.cpp:227-228,142``). ``adopted``: a world created outside xccl, whose creator selected
        the chip; the chip map is still needed, for the options of new groups and the communicator names.

        Raises:
            RankTableError: ``RANK_TABLE_FILE`` is malformed or does not describe this job.
            InitError: ``CHIP_MAP`` is malformed, the node lacks TPUs for its ranks, or it has no C2C ring of
                that many chips.
        """
        placement = resolve_placement(job, self.sdk.device_count(), rule=self._vendor_chip_map)
        if adopted:
            self._placement = placement
            return self.sdk.device(placement.chip)
        if placement.replaced is not None and job.local_rank == 0:
            # Sophgo's set_chip_map replaces it too, and says so at INFO on local rank 0 only.
            LOG.warning(
                "the chip map %s from the %s is not a C2C ring of this node's chips (SCCL runs a ring over directly "
                "linked chips); using the recommended ring %s, as torch_tpu.tpu.set_chip_map does",
                ",".join(map(str, placement.replaced)), placement.source, ",".join(map(str, placement.node_chips)),
            )
        previous = os.environ.get("CHIP_MAP")
        chip_map = ",".join(map(str, placement.node_chips))
        if previous and previous.strip() != chip_map and placement.source != "CHIP_MAP":
            LOG.warning("CHIP_MAP=%s replaced by %s from the %s", previous, chip_map, placement.source)
        # torch_tpu.tpu.set_device reads the chip from CHIP_MAP[local_rank]; it must be the comma-separated string
        # (Sophgo's own set_chip_map assigns a list here and fails: manifest gotcha 7).
        os.environ["CHIP_MAP"] = chip_map
        self.sdk.set_device(job.local_rank)
        current = self.sdk.current_device()
        if current != placement.chip:
            LOG.warning("torch_tpu reports chip %d as current, the chip map says %d (TPU_VISIBLE_NUM=%s)",
                        current, placement.chip, os.environ.get("TPU_VISIBLE_NUM"))
        self._placement = placement
        LOG.debug("rank %d: local rank %d on chip %d (chip map %s from %s)", job.rank, job.local_rank,
                  placement.chip, chip_map, placement.source)
        return self.sdk.device(placement.chip)

    def _vendor_chip_map(self, given: Sequence[int] | None, local_world_size: int, local_rank: int) -> tuple[int, ...]:
        """What ``set_chip_map`` settles on for this node (:data:`~xccl_sophgo._chipmap.ChipMapRule`).

        ``set_chip_map`` reads the node's size from ``LOCAL_WORLD_SIZE`` only (default 1, which takes any map
        unchecked and makes no map ``[0, 1]``) and ``CHIP_MAP`` before its argument (``torch_tpu/tpu/utils.py:
        193-204``). xccl knows the size from whichever launcher started the job (mpirun sets no
        ``LOCAL_WORLD_SIZE``), so the variables say what xccl decided, for the call only.
        """
        with _environ(LOCAL_WORLD_SIZE=str(local_world_size), LOCAL_RANK=str(local_rank), CHIP_MAP=None):
            return self.sdk.chip_map(given, local_world_size)

    def process_group_options(self, ranks: Sequence[int] | None) -> Any:
        """``ProcessGroupSCCLOptions`` with the chip map of the members' node, whole; always given.

        Every group gets its node's map, as Sophgo's own code builds them
        (:meth:`~xccl_sophgo._chipmap.Placement.group_chip_map`). SCCL cannot be created without options (its
        creator takes ``Options&``), so this never returns None.
        """
        placement = self.placement
        members = range(placement.world_size) if ranks is None else ranks
        self._warn_if_multi_node(members)
        return self.sdk.options(placement.group_chip_map(members))

    def comm_name(self, group: dist.ProcessGroup) -> str:
        """``sccl:<group name>:<chips of its ranks>``: the same on every member, distinct per group."""
        chips = self.placement.chip_map(dist.get_process_group_ranks(group))
        return f"sccl:{group.group_name}:{','.join(map(str, chips))}"

    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        """The list all_gather with SCCL's equal-size constraint checked before communicating."""
        return {Collective.ALL_GATHER: _all_gather_equal}

    def shutdown(self) -> None:
        """Undo what the SDK object did to the process (in simulation, the torch adaptor's patch)."""
        self.sdk.close()

    def _warn_if_multi_node(self, ranks: Sequence[int] | range) -> None:
        nodes = {self.placement.node_of(r) for r in ranks}
        if len(nodes) > 1 and not self._warned_nodes:
            self._warned_nodes = True
            LOG.warning("an sccl group spans %d nodes; Sophgo documents SCCL for the TPUs of one machine",
                        len(nodes))


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for the block, then restore them as they were."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _all_gather_equal(ctx: KernelContext, outs: list[torch.Tensor], tensor: torch.Tensor, async_op: bool) -> Any:
    shapes = sorted({tuple(t.shape) for t in outs})
    if len(shapes) > 1:
        raise ConstraintViolation(
            "all_gather", ctx.plugin, "equal sizes",
            f"tensor_list holds shapes {shapes}; ProcessGroupSCCL gathers equal-sized tensors only. Use "
            "xccl.all_gather_into_tensor_uneven for rows that differ per rank",
        )
    return c10d_kernel(Collective.ALL_GATHER, ctx.native)(outs, tensor, async_op)  # type: ignore[misc]
