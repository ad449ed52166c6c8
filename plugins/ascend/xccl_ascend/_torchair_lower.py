"""How xccl's graph ops reach TorchAir: each is lowered to an op TorchAir already converts to GE.

xccl's graph path emits standard ``_c10d_functional`` collectives where torch has them (TorchAir converts those)
and its own ``torch.ops.xccl.*`` ops for the rest. TorchAir has no converter for xccl's ops, so the Ascend plugin
rewrites each of them while AOTAutograd traces the graph, through the decomposition table TorchAir's backend
takes (``torchair.get_npu_backend(custom_decompositions=...)``), into the ops TorchAir itself emits for the same
torch.distributed / torch_npu calls:

==================================  ============================================  ==============================
xccl op                             lowered to                                    GE operator (TorchAir)
==================================  ============================================  ==============================
``order`` (the token join)          ``aten.clone`` of the token                   Identity
``all_reduce``, ``reduce_scatter_   the ``_c10d_functional`` op (avg as sum       HcomAllReduce /
tensor`` (emulated forms)           then a divide)                                HcomReduceScatter
``all_to_all_v``                    ``_c10d_functional.all_to_all_single``        HcomAllToAllV (decomposed)
``send`` / ``recv``                 ``npu_define._send`` / ``_recv``              HcomSend / HcomReceive
``all_gather_into_tensor_uneven``   ``npu_define.allgather_in_tensor_uneven``     HcomAllGatherV
``reduce_scatter_tensor_uneven``    ``npu_define.reduce_scatter_tensor_uneven``   HcomReduceScatterV
``mm_reduce_scatter``               ``npu.npu_mm_reduce_scatter_base``            MatmulReduceScatter
``all_gather_mm``                   ``npu.npu_all_gather_base_mm``                AllGatherMatmul
``mm_all_reduce``                   ``npu.npu_mm_all_reduce_base``                MatmulAllReduce
``_fused_all_gather`` / ``_fused_   ``_c10d_functional`` all_gather /             HcomAllGather /
reduce_scatter`` (fused backward)   reduce_scatter + ``wait_tensor``               HcomReduceScatter
==================================  ============================================  ==============================

Decompositions run below autograd, so xccl's own gradient formulas stay in force (the backward of a fused op
calls the other fused ops, and those are lowered too). The order join becomes a plain copy: a GE graph keeps the
program order of its communication only under the StableRDFS topological sort, which the compile backend sets
(TorchAir forces it itself for more than one send/recv; xccl sets it for every graph, since its graphs rely on
program order where Inductor needed the token chain).

A fused op is lowered to its MC2 operator only where the kernel's documented constraints hold (the same checks
as in eager mode, on the traced shapes); elsewhere, since a GE graph cannot fall back at run time, the lowering
picks the unfused sequence (matmul, then the ``_c10d_functional`` collective) at compile time under the fallback
policy: ``"error"`` raises :class:`~xccl.ConstraintViolation`, ``"warn"`` warns once per op and constraint.

Reduce ops: TorchAir's ``normalize_reduceop_type`` takes sum, min, max and product only. xccl's graph column
computes avg as sum then a divide; :func:`graph_converters` makes the ``_c10d_functional`` collectives do so
(the graph path passes avg through), and the uneven reduce-scatter's lowering likewise.

The vendor ops come from the SDK (``HcclSdk.graph_ops()``): TorchAir's and torch_npu's on the hardware, the
simulation's stand-ins (same schemas, computed on CPU) in simulation, so the lowering is one code path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast, final

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import xccl
from xccl.plugin import Collective, ConstraintViolation

if TYPE_CHECKING:
    from ._constraints import DomainTracker
    from ._runtime import AscendRuntime, FusedKernel

__all__ = ["GraphOps", "graph_converters", "lowering"]

C = Collective
_F: Final[Any] = torch.ops._c10d_functional
_WARNED: Final[set[tuple[str, str]]] = set()


@final
@dataclasses.dataclass(frozen=True)
class GraphOps:
    """The vendor ops xccl's graph ops lower to: TorchAir's ``npu_define`` ops and torch_npu's MC2 operators on
    the hardware (``NpuSdk.graph_ops``), the simulation's stand-ins in simulation (``SimSdk.graph_ops``)."""

    send: Any  # npu_define._send.default
    recv: Any  # npu_define._recv.default
    allgather_uneven: Any  # npu_define.allgather_in_tensor_uneven.default
    reduce_scatter_uneven: Any  # npu_define.reduce_scatter_tensor_uneven.default
    mm_reduce_scatter: Any  # npu.npu_mm_reduce_scatter_base.default
    all_gather_mm: Any  # npu.npu_all_gather_base_mm.default
    mm_all_reduce: Any  # npu.npu_mm_all_reduce_base.default
    #: Name of an op above -> its name in TorchAir's registry, where they differ (the simulation's stand-ins).
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------ helpers


def _group(name: str) -> Any:
    return c10d._resolve_process_group(name)


def _tag_ranks(group_name: str) -> tuple[Any, str, list[int]]:
    """The group, its c10d tag and its global ranks: how TorchAir's ops name a group (hcom_send_recv.py)."""
    pg = _group(group_name)
    return pg, c10d._get_group_tag(pg), list(dist.get_process_group_ranks(pg))


def _static(shape: Sequence[Any]) -> list[int]:
    # TorchAir passes the static shape (hcom_send_recv.py: "dynamic shape is not supported"); with dynamic=True
    # this specialises the graph, as TorchAir documents for send/recv.
    return [int(s) for s in shape]


@contextlib.contextmanager
def _untraced() -> Iterator[None]:
    """Leave the tracer for a moment: real (meta, or communicating) work at compile time, kept out of the graph."""
    # Lazy: torch's tracing internals, needed only while compiling.
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        yield


def _meta(t: torch.Tensor | None, *, contiguous: bool = False) -> torch.Tensor | None:
    """A meta tensor shaped like ``t`` (the constraint checks read shapes, dtypes, strides and devices only)."""
    if t is None:
        return None
    with _untraced():
        if contiguous:
            return torch.empty(_static(t.shape), dtype=t.dtype, device="meta")
        return torch.empty_strided(_static(t.shape), _static(t.stride()), dtype=t.dtype, device="meta")


def _divide(t: torch.Tensor, n: int) -> torch.Tensor:
    """avg as sum then a divide; integers truncate, as xccl's eager emulation does."""
    return t / n if t.is_floating_point() or t.is_complex() else torch.div(t, n, rounding_mode="trunc")


def _reduce_scatter(x: torch.Tensor, red: str, n: int, group_name: str) -> torch.Tensor:
    out = _F.wait_tensor(_F.reduce_scatter_tensor(x, "sum" if red == "avg" else red, n, group_name))
    return _divide(out, n) if red == "avg" else out


def _all_reduce(x: torch.Tensor, red: str, group_name: str) -> torch.Tensor:
    out = _F.wait_tensor(_F.all_reduce(x, "sum" if red == "avg" else red, group_name))
    return _divide(out, _group(group_name).size()) if red == "avg" else out


def _all_gather(x: torch.Tensor, n: int, group_name: str) -> torch.Tensor:
    return _F.wait_tensor(_F.all_gather_into_tensor(x.contiguous(), n, group_name))


# ------------------------------------------------------------------------------------------ point-to-point, uneven


def _order(token: torch.Tensor, after: Sequence[torch.Tensor]) -> torch.Tensor:
    return token.clone()


def _xccl_all_reduce(input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    # xccl's own form of a standard collective appears where the table says emulated on a group created outside
    # xccl; in this plugin's graph column the only emulation is avg (as sum then a divide), done here.
    return _all_reduce(input.contiguous(), reduce_op, group_name), token.clone()


def _xccl_reduce_scatter(input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    n = _group(group_name).size()
    return _reduce_scatter(input.contiguous(), reduce_op, n, group_name), token.clone()


def _all_to_all_v(input: torch.Tensor, send_counts: Sequence[int], group_name: str, token: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The count matrix (row-major) as this rank's all_to_all_single split sizes, in elements of a flat view."""
    pg = _group(group_name)
    n, rank = pg.size(), pg.rank()
    send = [int(c) for c in send_counts[rank * n : (rank + 1) * n]]
    recv = [int(send_counts[i * n + rank]) for i in range(n)]
    out = _F.wait_tensor(_F.all_to_all_single(input.contiguous().view(-1), recv, send, group_name))
    return out, token.clone()


def _send(ops: GraphOps, input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> torch.Tensor:
    _, tag, ranks = _tag_ranks(group_name)
    ops.send(input.contiguous(), None, ranks, tag, 0, dst, _static(input.shape))
    return token.clone()


def _recv(ops: GraphOps, input: torch.Tensor, src: int, group_name: str, token: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    _, tag, ranks = _tag_ranks(group_name)
    return ops.recv(input, None, ranks, tag, 0, src, _static(input.shape)), token.clone()


def _all_gather_uneven(ops: GraphOps, input: torch.Tensor, sizes: Sequence[int], group_name: str,
                       token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pg, tag, ranks = _tag_ranks(group_name)
    # Rows, no displacements: what TorchAir's own all_gather_into_tensor_uneven passes (hcom_allgather.py).
    out = ops.allgather_uneven(input.contiguous(), sizes[pg.rank()], list(sizes), tag, ranks, len(ranks), [])
    return out, token.clone()


def _reduce_scatter_uneven(ops: GraphOps, input: torch.Tensor, sizes: Sequence[int], reduce_op: str,
                           group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pg, tag, ranks = _tag_ranks(group_name)
    red = "sum" if reduce_op == "avg" else reduce_op
    out = ops.reduce_scatter_uneven(input.contiguous(), list(sizes), sizes[pg.rank()], red, tag, ranks, len(ranks), [])
    return (_divide(out, len(ranks)) if reduce_op == "avg" else out), token.clone()


# ------------------------------------------------------------------------------------------------------- fused


def _refused(rt: AscendRuntime, domain: DomainTracker, op: Collective, pg: Any, a: torch.Tensor, b: torch.Tensor,
             **call_options: Any) -> ConstraintViolation | None:
    """The MC2 constraint the call violates (None: the kernel takes it), after the fallback policy had its say.

    Raises:
        ConstraintViolation: under ``fallback="error"``.
    """
    kernel = cast("FusedKernel", rt.kernels()[op])
    call = rt.fused_call(kernel.op, pg.size(), tuple(dist.get_process_group_ranks(pg)))
    try:
        # x1 as the kernel gets it: the lowering passes a.contiguous(), as the eager kernel does.
        kernel._check(call, _meta(a, contiguous=True), _meta(b),
                      **{k: _meta(v) if k == "bias" else v for k, v in call_options.items()})
        domain.check(call, kernel.kernel, pg.group_name)
    except ConstraintViolation as exc:
        policy = xccl.get_world().fallback
        if policy == "error":
            raise
        if policy == "warn" and (op.value, exc.constraint) not in _WARNED:
            _WARNED.add((op.value, exc.constraint))
            warnings.warn(
                f"xccl: the MC2 kernel behind {op.value} cannot take this call in a TorchAir graph (constraint "
                f"{exc.constraint!r}: {exc.detail}); the graph gets the unfused matmul and collective instead. Pass "
                "fallback='emulate' to xccl.init to silence this, or 'error' to raise instead.",
                xccl.EmulationWarning, stacklevel=2,
            )
        return exc
    return None


def _hcom(rt: AscendRuntime, domain: DomainTracker, op: Collective, pg: Any) -> str:
    """HCCL's name of ``pg`` for the MC2 operator's ``hcom``; claims the model's one domain (Atlas A2)."""
    kernel = cast("FusedKernel", rt.kernels()[op])
    with _untraced():  # collective (HCCL creates the communicator): every rank compiles the same graph
        hcom = xccl.comm_name(pg)
    domain.claim(rt.fused_call(kernel.op, pg.size()), pg.group_name, hcom)
    return hcom


def _mm_reduce_scatter(rt: AscendRuntime, domain: DomainTracker, ops: GraphOps, a: torch.Tensor, b: torch.Tensor, group_name: str,
                       group_size: int, reduce_op: str = "sum", bias: torch.Tensor | None = None,
                       chunks: int = 0) -> torch.Tensor:
    pg = _group(group_name)
    if _refused(rt, domain, C.MM_REDUCE_SCATTER, pg, a, b, reduce_op=reduce_op, bias=bias) is None:
        # A bias that passed the check is all zeros, which the kernel need not see (as in eager mode).
        return ops.mm_reduce_scatter(a.contiguous(), b, _hcom(rt, domain, C.MM_REDUCE_SCATTER, pg), group_size,
                                     reduce_op=reduce_op, comm_turn=0)  # type: ignore[no-any-return]
    y = a @ b if bias is None else a @ b + bias
    return _reduce_scatter(y, reduce_op, group_size, group_name)


def _all_gather_mm(rt: AscendRuntime, domain: DomainTracker, ops: GraphOps, a: torch.Tensor, b: torch.Tensor, group_name: str,
                   group_size: int, gather_output: bool = True, chunks: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _group(group_name)
    if _refused(rt, domain, C.ALL_GATHER_MM, pg, a, b) is None:
        out, gathered = ops.all_gather_mm(a.contiguous(), b, _hcom(rt, domain, C.ALL_GATHER_MM, pg), group_size,
                                          gather_index=0, gather_output=gather_output, comm_turn=0)
        return out, gathered
    g = _all_gather(a, group_size, group_name)
    return g @ b, g if gather_output else a.new_empty(0)


def _mm_all_reduce(rt: AscendRuntime, domain: DomainTracker, ops: GraphOps, a: torch.Tensor, b: torch.Tensor, group_name: str,
                   group_size: int, bias: torch.Tensor | None = None, chunks: int = 0) -> torch.Tensor:
    pg = _group(group_name)
    if _refused(rt, domain, C.MM_ALL_REDUCE, pg, a, b, bias=bias) is None:
        return ops.mm_all_reduce(a.contiguous(), b, _hcom(rt, domain, C.MM_ALL_REDUCE, pg), reduce_op="sum", bias=bias,
                                 comm_turn=0)  # type: ignore[no-any-return]
    y = torch.matmul(a, b) if bias is None else torch.matmul(a, b) + bias  # bias on every rank, as the kernel
    return _all_reduce(y, "sum", group_name)


def _fused_all_gather(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return _all_gather(x, group_size, group_name)


def _fused_reduce_scatter(x: torch.Tensor, group_name: str, group_size: int) -> torch.Tensor:
    return _reduce_scatter(x.contiguous(), "sum", group_size, group_name)


# ------------------------------------------------------------------------------------------------------- tables


def _xccl_ops() -> Any:
    # Touching these public names registers torch.ops.xccl.*, which load lazily: the graph ops come with the graph
    # forms (behind xccl.functional), the fused ones with the fused API.
    _ = xccl.functional, xccl.mm_reduce_scatter
    return torch.ops.xccl


def lowering(rt: AscendRuntime, ops: GraphOps, domain: DomainTracker) -> dict[Any, Callable[..., Any]]:
    """The decomposition table that lowers xccl's graph ops to ``ops`` (see the module docstring); ``domain`` is
    the process's MC2 communication domain (Atlas A2 allows one per model), checked and claimed at compile time."""
    x = _xccl_ops()
    return {
        x.order.default: _order,
        x.all_reduce.default: _xccl_all_reduce,
        x.reduce_scatter_tensor.default: _xccl_reduce_scatter,
        x.all_to_all_v.default: _all_to_all_v,
        x.send.default: functools.partial(_send, ops),
        x.recv.default: functools.partial(_recv, ops),
        x.all_gather_into_tensor_uneven.default: functools.partial(_all_gather_uneven, ops),
        x.reduce_scatter_tensor_uneven.default: functools.partial(_reduce_scatter_uneven, ops),
        x.mm_reduce_scatter.default: functools.partial(_mm_reduce_scatter, rt, domain, ops),
        x.all_gather_mm.default: functools.partial(_all_gather_mm, rt, domain, ops),
        x.mm_all_reduce.default: functools.partial(_mm_all_reduce, rt, domain, ops),
        x._fused_all_gather.default: _fused_all_gather,
        x._fused_reduce_scatter.default: _fused_reduce_scatter,
    }


#: The xccl ops :func:`lowering` handles, by qualified name (what the docs and the capability notes cite).
LOWERED: Final = (
    "xccl::order", "xccl::all_reduce", "xccl::reduce_scatter_tensor", "xccl::all_to_all_v", "xccl::send", "xccl::recv", "xccl::all_gather_into_tensor_uneven",
    "xccl::reduce_scatter_tensor_uneven", "xccl::mm_reduce_scatter", "xccl::all_gather_mm", "xccl::mm_all_reduce",
    "xccl::_fused_all_gather", "xccl::_fused_reduce_scatter",
)


def _avg_all_reduce(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    if reduce_op != "avg":
        return _F.all_reduce(input, reduce_op, group_name)  # type: ignore[no-any-return]
    return _all_reduce(input, "avg", group_name)


def _avg_reduce_scatter(input: torch.Tensor, reduce_op: str, group_size: int, group_name: str) -> torch.Tensor:
    if reduce_op != "avg":
        return _F.reduce_scatter_tensor(input, reduce_op, group_size, group_name)  # type: ignore[no-any-return]
    return _reduce_scatter(input, "avg", group_size, group_name)


def graph_converters() -> dict[str, Callable[..., Any]]:
    """xccl's graph converters for TorchAir: avg as sum then a divide (``normalize_reduceop_type`` has no avg).

    Applied to the Dynamo graph, before autograd, so the rewritten collectives keep torch's gradient formulas.
    The graph's own ``wait_tensor`` then waits on the divided result, a tensor no collective is pending on,
    which returns it unchanged.
    """
    return {
        "_c10d_functional::all_reduce": _avg_all_reduce,
        "_c10d_functional::reduce_scatter_tensor": _avg_reduce_scatter,
    }
