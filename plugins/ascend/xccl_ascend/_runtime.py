"""The Ascend runtime: one code path for the hardware and the simulation, differing only in the SDK object.

Imported only once the plugin is selected (``AscendPlugin.runtime``). On the hardware the SDK is
:class:`~xccl_ascend._sdk.NpuSdk`, which imports torch_npu; in simulation :class:`~xccl_ascend._sdk_sim.SimSdk`.
Everything else, the checks above all, is shared: rank table and device checks before the process group, the
``hccl_config`` options, communicator names, the uneven collectives and the fused kernels with their documented
constraints (checked before any communication, so a violation can still fall back to the portable version).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist

from xccl.plugin import (
    CapabilityTable,
    Collective,
    InitError,
    KernelContext,
    Mode,
    RankTableError,
    Runtime,
    c10d_kernel,
    reduce_op_name,
    warn_at_user,
)

from . import _constraints as cons
from ._capabilities import ALL_TO_ALL_VC, release_table
from ._hccl_config import config_for
from ._probe import find_cann
from ._ranktable import load_hccl, write_survivors
from ._releases import release
from ._torchair_lower import LOWERED, converters, lowering

if TYPE_CHECKING:
    from ._sdk import HcclSdk

__all__ = ["DOCUMENTED_DTYPES", "DOCUMENTED_WORLD_SIZES", "MC2_DOMAIN", "AscendRuntime", "DocumentedNotes", "FusedKernel"]

LOG = logging.getLogger("xccl.ascend")

#: The communication domain the fused kernels of this process (model) use: Atlas A2 allows one.
MC2_DOMAIN = cons.DomainTracker()

#: Where torch_npu 2.13 documents that all_gather_into_tensor and reduce_scatter_tensor do not support world sizes
#: 3, 5, 6 and 7 (its words: "world_size" 不支持 "3, 5, 6, 7", written with full-width commas).
DOCUMENTED_WORLD_SIZES: Final = (
    "Ascend/pytorch@462f4e1 docs/zh/api/native_api/pytorch_2-13-0/torch-distributed.md:300-301,339-341"
)
#: Where it lists the dtypes of reduce_scatter(_tensor) and all_to_all(_single) ("仅支持fp32": fp32 only).
DOCUMENTED_DTYPES: Final = "Ascend/pytorch@462f4e1 docs/zh/api/native_api/pytorch_2-13-0/torch-distributed.md:319,339,359,379"


class AscendRuntime(Runtime):
    """HCCL through torch_npu (or its simulation).

    Args:
        plugin: the Ascend plugin.
        simulate: run on CPU over the simulated ``hccl`` group.
        sdk: the SDK object (default: torch_npu, or the simulation); a test seam.
    """

    def __init__(self, plugin: Any, *, simulate: bool, sdk: HcclSdk | None = None) -> None:
        super().__init__(plugin, simulate=simulate)
        if sdk is None:
            if simulate:
                from ._sdk_sim import SimSdk

                sdk = SimSdk(imported=True)  # applies torch_npu's patches of torch.distributed, as its import does
            else:
                from ._sdk import NpuSdk

                sdk = NpuSdk()
        self.sdk: HcclSdk = sdk
        self._hardware_cann: str | None = None if simulate else find_cann().version
        self._converters_registered = False
        #: Whether :meth:`stop_device` stopped the device and nothing restarted it yet.
        self._stopped = False

    @property
    def _cann(self) -> str | None:
        """The CANN version: found on the host, or ``XCCL_SIM_CANN_VERSION`` in simulation (read when asked)."""
        if not self.simulate:
            return self._hardware_cann
        from ._torchair_sim import sim_cann_version

        return sim_cann_version()

    # ------------------------------------------------------------------------------------------------- setup

    def capabilities(self) -> CapabilityTable:
        """The plugin's table (torch_npu 2.13.0) as the release in force runs it (``_releases``: no premul_sum and
        fewer dtypes before 2.7.1/2.8.0's 26.0.0 line), with ``all_to_all_v`` native where the installed torch_npu
        exports ``all_to_all_vc`` (the SDK's probe)."""
        return self._table

    @functools.cached_property
    def _table(self) -> CapabilityTable:
        table: CapabilityTable = release_table(self.plugin.capabilities(), release())
        if not self.sdk.has_all_to_all_vc():
            return table
        return table.with_entries({(Collective.ALL_TO_ALL_V, Mode.EAGER): ALL_TO_ALL_VC})

    def setup_device(self, local_rank: int) -> torch.device:
        """Check ``RANK_TABLE_FILE`` and the visible NPUs, then make NPU ``local_rank`` current.

        Raises:
            RankTableError: ``RANK_TABLE_FILE`` is malformed or describes another world size.
            InitError: fewer NPUs are visible than this local rank needs.
        """
        _check_rank_table(os.environ)
        if not self.simulate:  # the simulated group warns itself, as it takes the value (xccl.plugin._sim_runtime)
            _check_connect_timeout(self.plugin.vendor_runtime().lazy_connect, os.environ)
        count = self.sdk.device_count()
        if not 0 <= local_rank < count:
            visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
            shown = "unset" if visible is None else repr(visible)
            raise InitError(
                f"local rank {local_rank} needs NPU index {local_rank}, but {count} NPU(s) are visible "
                f"(ASCEND_RT_VISIBLE_DEVICES={shown}; IDs must be ascending and comma-separated, and the process "
                "passes the index, not the ID). Start at most that many ranks per server or fix the variable"
            )
        self.sdk.set_device(local_rank)
        return torch.device("cpu") if self.sdk.device_type == "cpu" else torch.device(self.sdk.device_type, local_rank)

    def world_shrunk(self, kept: Sequence[int]) -> None:
        """With ``RANK_TABLE_FILE`` set, point it at the survivors' table (:func:`write_survivors`), written beside
        the original as ``<name>.shrunk-<survivors>.json``: HCCL builds the new world's communicator from it. This
        process keeps its NPU (``device_id`` is the table's, unchanged). A new world of a size torch_npu documents
        as unsupported for all_gather_into_tensor and reduce_scatter_tensor warns first, when the job has used them
        (FSDP2 does every step)."""
        used = sorted({op.value for op, _ in self._size_note.bound()} & {op.value for op in DocumentedNotes.SIZED_OPS})
        if used and len(kept) in DocumentedNotes.SIZES:
            warn_at_user(f"xccl: shrinking to a world of {len(kept)} ranks, which torch_npu 2.13's documentation says "
                         f"{' and '.join(used)} do not support (world sizes 3, 5, 6 and 7; {DOCUMENTED_WORLD_SIZES}), "
                         "and this job has used them: restart on a supported size instead (docs/elastic.md)")
        path = os.environ.get("RANK_TABLE_FILE")
        if not path:
            return
        stem, _ = os.path.splitext(path)
        out = f"{stem}.shrunk-{'-'.join(map(str, kept))}.json"
        write_survivors(path, kept, out)
        LOG.info("RANK_TABLE_FILE=%s: the survivors' rank table (was %s)", out, path)
        os.environ["RANK_TABLE_FILE"] = out

    def stop_device(self) -> bool:
        """torch_npu's ``stop_device`` (``aclrtDeviceTaskAbort``): a collective stuck on a lost peer, and whatever
        waits behind it, fails with FORCE STOP instead of waiting for HCCL_EXEC_TIMEOUT; ``ProcessGroupHCCL``'s
        teardown, which synchronises its streams first, then returns (Ascend/pytorch@082cb38
        ``torch_npu/npu/_recovery.py``: ``stop_device``, ``restart_device``; Huawei's own in-process recovery
        stops the device first)."""
        self.sdk.stop_device()
        self._stopped = True
        return True

    def restart_device(self) -> None:
        """torch_npu's ``restart_device``: the device takes work again, for the survivors' new world."""
        self.sdk.restart_device()
        self._stopped = False

    def process_group_options(self, ranks: Sequence[int] | None) -> Any:
        """``ProcessGroupHCCL.Options`` with the configured ``hccl_config``, or None (HCCL's defaults)."""
        config = config_for(ranks)
        return None if config is None else self.sdk.options(config)

    def comm_name(self, group: dist.ProcessGroup) -> str:
        """HCCL's name for ``group``'s communicator (``get_hccl_comm_name``).

        .. note:: Collective: HCCL creates the communicator here on first use, so every rank of ``group`` must
           call it (``xccl.comm_name`` caches it afterwards). A rank that does not leaves the others waiting.
        """
        return self.sdk.comm_name(group, dist.get_rank())

    def sdk_versions(self) -> Mapping[str, str]:
        """``{"CANN": <version>}`` where known: the graph column's floors (send/recv need 8.6.0) are checked with it."""
        return {} if self._cann is None else {"CANN": self._cann}

    def graph_ops(self) -> frozenset[str]:
        """The xccl ops the lowering takes (``_torchair_lower.LOWERED``): no isend/irecv/wait, no order joins
        (StableRDFS keeps program order). On first call, registers with TorchAir the converters that make its own
        backend (``torchair.get_npu_backend()`` as users call it) refuse those ops with a typed error naming
        ``xccl.compile``."""
        if not self._converters_registered:
            self.sdk.register_graph_converters(converters())
            self._converters_registered = True
        return LOWERED

    def comm_connected(self, group: dist.ProcessGroup) -> bool | None:
        """Whether HCCL created ``group``'s communicator yet (``get_hccl_comm_name(init_comm=False)``)."""
        return self.sdk.comm_connected(group)

    def compile_backend(self) -> Callable[..., Any] | None:
        """TorchAir's NPU backend on the hardware, the simulated TorchAir in simulation: both trace with the
        lowering of xccl's graph ops to the vendor's (``_torchair_lower``)."""
        return self.sdk.compile_backend(lowering(self, self.sdk.graph_ops(), MC2_DOMAIN))

    def shutdown(self) -> None:
        """Undo what loading the SDK did that can be undone (in simulation: torch_npu's patches), and forget the
        MC2 communication domain this process's fused kernels claimed: ``xccl.shutdown`` ends the model, and a world
        made by the next ``xccl.init`` starts clean (Atlas A2's one-domain rule is per model)."""
        MC2_DOMAIN.reset()
        if self._stopped:  # xccl stopped the device at a lost rank: the next world gets it back working
            self.restart_device()
        self.sdk.close()
        if "_size_note" in self.__dict__:
            self._size_note.clear()

    # ------------------------------------------------------------------------------------------------ kernels

    def kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        """torch_npu's uneven collectives and MC2 fused kernels (``all_to_all_vc`` where the release has it)."""
        return self._kernels

    @functools.cached_property
    def _size_note(self) -> DocumentedNotes:
        return DocumentedNotes()

    @functools.cached_property
    def _kernels(self) -> Mapping[Collective, Callable[..., Any]]:
        kernels: dict[Collective, Callable[..., Any]] = {
            Collective.ALL_GATHER_INTO_TENSOR_UNEVEN: self._all_gather_uneven,
            Collective.REDUCE_SCATTER_TENSOR_UNEVEN: self._reduce_scatter_uneven,
            Collective.MM_REDUCE_SCATTER: FusedKernel(self, "mm_reduce_scatter"),
            Collective.ALL_GATHER_MM: FusedKernel(self, "all_gather_mm"),
            Collective.MM_ALL_REDUCE: FusedKernel(self, "mm_all_reduce"),
            **self._size_note.kernels(),
        }
        if self.sdk.has_all_to_all_vc():
            kernels[Collective.ALL_TO_ALL_V] = self._all_to_all_v
        return kernels

    def _all_gather_uneven(
        self, ctx: KernelContext, output: torch.Tensor, input: torch.Tensor, sizes: Sequence[int], a: bool
    ) -> Any:
        return self.sdk.all_gather_into_tensor_uneven(output, input, sizes, ctx, a)

    def _reduce_scatter_uneven(
        self,
        ctx: KernelContext,
        output: torch.Tensor,
        input: torch.Tensor,
        sizes: Sequence[int],
        op: Any,
        a: bool,
    ) -> Any:
        return self.sdk.reduce_scatter_tensor_uneven(output, input, sizes, op, ctx, a)

    def _all_to_all_v(
        self, ctx: KernelContext, output: torch.Tensor, input: torch.Tensor, matrix: Sequence[Sequence[int]], a: bool
    ) -> Any:
        return self.sdk.all_to_all_vc(output, input, matrix, ctx, a)

    def fused_call(self, op: str, world_size: int, ranks: Sequence[int] = ()) -> cons.FusedCall:
        """What the constraint checks need to know about this process and group."""
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        return cons.FusedCall(
            op=op,
            device_name=self.sdk.device_name(),
            world_size=world_size,
            ranks=tuple(ranks),
            local_world_size=int(local) if local.isdigit() and int(local) > 0 else None,
            cann_version=self._cann,
        )


class DocumentedNotes:
    """c10d's own kernels of the ops torch_npu 2.13's documentation restricts, each warning once per group and
    restriction before its first such call sends anything: all_gather_into_tensor and reduce_scatter_tensor on 3, 5,
    6 or 7 ranks (:data:`DOCUMENTED_WORLD_SIZES`); reduce_scatter and reduce_scatter_tensor outside bfloat16, float16,
    float32, int8 and int32, all_to_all and all_to_all_single outside float32 (:data:`DOCUMENTED_DTYPES`).

    Whether HCCL refuses those calls, runs them, or the documentation is only cautious (``checkSupportedDataType``
    takes int16 and int64 too) needs the hardware (the first hour's list), so nothing is refused: a warning where
    FSDP2 on a 6-NPU mesh, or a bfloat16 MoE all_to_all, would otherwise meet the question first on the hardware. A
    plugin kernel, so that it runs on the hardware and in simulation alike and xccl's shared path carries no vendor's
    rule; the c10d kernel is bound once per group (its kernel context, held until the runtime shuts down), so a call
    pays a dictionary lookup and a dtype check.
    """

    #: The group sizes the documentation excludes, and the ops it excludes them for.
    SIZES: Final = frozenset({3, 5, 6, 7})
    SIZED_OPS: Final = frozenset({Collective.ALL_GATHER_INTO_TENSOR, Collective.REDUCE_SCATTER_TENSOR})
    #: The dtypes the documentation lists for each op it restricts them for.
    DTYPES: Final[Mapping[Collective, frozenset[torch.dtype]]] = {
        **dict.fromkeys((Collective.REDUCE_SCATTER, Collective.REDUCE_SCATTER_TENSOR), frozenset(
            {torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.int32})),
        **dict.fromkeys((Collective.ALL_TO_ALL, Collective.ALL_TO_ALL_SINGLE), frozenset({torch.float32})),
    }

    def __init__(self) -> None:
        self._bound: dict[tuple[Collective, int], Callable[..., Any]] = {}
        self._contexts: dict[int, KernelContext] = {}  # held, so that an id is not reused while bound
        self._warned: set[tuple[object, ...]] = set()  # (op, group, dtype); (group,) for its size

    def kernels(self) -> dict[Collective, Callable[..., Any]]:
        """The kernel of each op, as ``Runtime.kernels()`` returns them."""
        return {op: functools.partial(self._call, op) for op in self.SIZED_OPS | set(self.DTYPES)}

    def clear(self) -> None:
        """Forget every group (at the runtime's shutdown)."""
        self._bound.clear()
        self._contexts.clear()
        self._warned.clear()

    def bound(self) -> list[tuple[Collective, int]]:
        """The (op, group) pairs called so far."""
        return list(self._bound)

    def _call(self, op: Collective, ctx: KernelContext, *args: Any) -> Any:
        kernel = self._bound.get((op, id(ctx)))
        if kernel is None:
            kernel = self._bind(op, ctx)
        listed = self.DTYPES.get(op)
        if listed is not None:
            dtype = _first_tensor(args).dtype
            if dtype not in listed and (op, id(ctx), dtype) not in self._warned:
                self._warned.add((op, id(ctx), dtype))
                warn_at_user(
                    f"xccl: {op.value} of {dtype} on group {list(ctx.ranks)}: torch_npu 2.13's documentation lists "
                    f"{', '.join(sorted(str(d).removeprefix('torch.') for d in listed))} only for it "
                    f"({DOCUMENTED_DTYPES}). xccl passes it to HCCL, whose dtype check takes it; whether HCCL "
                    "computes it right is not known without the hardware (docs/fidelity.md, first hour on hardware)")
        return kernel(*args)

    def _bind(self, op: Collective, ctx: KernelContext) -> Callable[..., Any]:
        if id(ctx) not in self._contexts:
            self._contexts[id(ctx)] = ctx
        if op in self.SIZED_OPS and ctx.size in self.SIZES and (id(ctx),) not in self._warned:
            self._warned.add((id(ctx),))
            warn_at_user(
                f"xccl: {op.value} on a group of {ctx.size} ranks (global ranks {list(ctx.ranks)}): torch_npu "
                "2.13's documentation says all_gather_into_tensor and reduce_scatter_tensor do not support "
                f"world sizes 3, 5, 6 and 7 ({DOCUMENTED_WORLD_SIZES}). xccl passes it to HCCL; whether HCCL "
                "refuses it, or gives wrong results, is not known without the hardware (docs/fidelity.md, first "
                "hour on hardware)"
            )
        kernel = c10d_kernel(op, ctx.native)
        if kernel is None:  # every op here has a c10d method
            raise RuntimeError(f"no c10d kernel for {op.value}")
        self._bound[(op, id(ctx))] = kernel
        return kernel


def _first_tensor(args: Any) -> torch.Tensor:
    """The first tensor of a kernel's arguments (a list's first, for the list forms)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, list) and a:
            return _first_tensor(a)
    raise ValueError("no tensor among the arguments")


class FusedKernel:
    """One MC2 kernel behind xccl's fused API: the documented checks, the domain rule, then the SDK call.

    ``kernel(ctx, a, b, *options)`` as ``xccl.fused`` calls it; :meth:`check` is the same shape check
    without the call (the graph pass uses it with meta tensors).
    """

    def __init__(self, runtime: AscendRuntime, op: str) -> None:
        self.runtime = runtime
        self.op = op
        self.kernel = cons.KERNELS[op]

    def check(self, a: torch.Tensor, b: torch.Tensor, world_size: int, **options: Any) -> None:
        """Raise :class:`~xccl.ConstraintViolation` if the kernel cannot take these shapes and options.

        Reads shapes, dtypes and devices only; a bias on the meta device counts as non-zero (unknowable). Like a
        call, it takes a transposed view of ``a`` (the call makes it contiguous).
        """
        self._check(self.runtime.fused_call(self.op, world_size), a.contiguous(), b, **options)

    def _check(self, call: cons.FusedCall, a: torch.Tensor, b: torch.Tensor, **options: Any) -> None:
        bias = options.get("bias")
        if self.op == "mm_reduce_scatter":
            redop = options.get("reduce_op", "sum")
            name = "sum" if redop is None else reduce_op_name(redop)
            cons.check_mm_reduce_scatter(call, a, b, reduce_op=name, bias=bias)
        elif self.op == "all_gather_mm":
            cons.check_all_gather_mm(call, a, b)
        else:
            cons.check_mm_all_reduce(call, a, b, bias=bias)

    def __call__(self, ctx: KernelContext, a: torch.Tensor, b: torch.Tensor, *options: Any) -> Any:
        # The kernels refuse transposed views of x1; a copy is cheaper than giving up the fused kernel.
        a = a.contiguous()
        call = self.runtime.fused_call(self.op, ctx.size, ctx.ranks)
        sdk = self.runtime.sdk
        if self.op == "mm_reduce_scatter":
            reduce_op, bias = options
            self._check(call, a, b, reduce_op=reduce_op, bias=bias)
            hcom = self._hcom(ctx, call)
            # A bias passed the check only if it is all zeros: adding it changes nothing, so the kernel gets none.
            return sdk.mm_reduce_scatter_base(a, b, hcom, ctx.size)
        if self.op == "all_gather_mm":
            (gather_output,) = options
            self._check(call, a, b)
            hcom = self._hcom(ctx, call)
            return sdk.all_gather_base_mm(a, b, hcom, ctx.size, bool(gather_output))
        (bias,) = options
        self._check(call, a, b, bias=bias)
        hcom = self._hcom(ctx, call)
        return sdk.mm_all_reduce_base(a, b, hcom, bias)

    def _hcom(self, ctx: KernelContext, call: cons.FusedCall) -> str:
        """The group's communicator name, after the one-domain rule (checked without communicating)."""
        name = ctx.group.group_name
        MC2_DOMAIN.check(call, self.kernel, name)
        hcom = ctx.comm_name()  # collective on Ascend: every rank of the group reaches this line
        MC2_DOMAIN.claim(call, name, hcom)
        return hcom

    def __repr__(self) -> str:
        return f"<FusedKernel {self.op} -> torch_npu.{self.kernel}>"


def _check_connect_timeout(lazy: Any, env: Mapping[str, str]) -> None:
    """Warn when ``HCCL_CONNECT_TIMEOUT`` is outside CANN's [120, 7200]: xccl's policy and messages take the nearest
    bound, as the simulation does; whether HCCL clamps it or refuses it is a first-hour check."""
    message = None if lazy is None else lazy.out_of_range(env)
    if message is not None:
        warn_at_user(message)


def _check_rank_table(env: Mapping[str, str]) -> None:
    """Validate ``RANK_TABLE_FILE`` before HCCL reads it, and warn about a short ``HCCL_CONNECT_TIMEOUT``.

    HCCL builds the global communicator from the table when the file is set and readable; a malformed one fails
    deep inside CANN, so xccl checks it first and names the field.

    Raises:
        RankTableError: the table is invalid, or its rank count differs from ``WORLD_SIZE``.
    """
    path = env.get("RANK_TABLE_FILE")
    if not path:
        return
    table = load_hccl(path)
    world = env.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) != table.world_size():
        raise RankTableError(
            path, "server_list",
            f"describes {table.world_size()} ranks but WORLD_SIZE={world}; the table must list every rank of the job",
        )
    timeout = env.get("HCCL_CONNECT_TIMEOUT", "")
    if not timeout.isdigit() or int(timeout) < 300:
        LOG.warning(
            "RANK_TABLE_FILE is set and HCCL_CONNECT_TIMEOUT=%s: torch_npu recommends at least 300 seconds when "
            "building communicators from a rank table", timeout or "unset",
        )
