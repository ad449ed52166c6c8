"""How xccl's graph ops reach TorchAir: each is lowered to an op TorchAir already converts to GE.

xccl's graph path emits standard ``_c10d_functional`` collectives where torch has them (TorchAir converts those)
and its own ``torch.ops.xccl.*`` ops for the rest. TorchAir has no converter for xccl's ops, so the Ascend plugin
rewrites each of them while AOTAutograd traces the graph, through the decomposition table TorchAir's backend
takes (``torchair.get_npu_backend(custom_decompositions=...)``), into the ops TorchAir itself emits for the same
torch.distributed / torch_npu calls:

==================================  ============================================  ==============================
xccl op                             lowered to                                    GE operator (TorchAir)
==================================  ============================================  ==============================
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

:data:`LOWERED` is the set the runtime reports as its graph compiler's (``Runtime.graph_ops``), so the graph
forms raise :class:`~xccl.UnsupportedCollective` at trace time for any other xccl op: ``isend`` / ``irecv`` /
``wait`` above all (TorchAir has no non-blocking point-to-point; its HcomSend / HcomReceive block in program
order, which would deadlock the symmetric exchange isend/irecv exist for). ``order`` (the join of a standard
collective's result to the token chain) is not among them: a GE graph keeps the program order of its
communication under the StableRDFS topological sort, which the compile backend sets (TorchAir forces it itself
for more than one send/recv), so the forms leave the joins out; the tokens xccl's own ops pass along become
copies.

Decompositions run below autograd, so xccl's own gradient formulas stay in force (the backward of a fused op
calls the other fused ops, and those are lowered too).

A fused op is lowered to its MC2 operator only where the kernel's documented constraints hold (the same checks
as in eager mode, on the traced shapes); elsewhere, since a GE graph cannot fall back at run time, the lowering
picks the unfused sequence (matmul, then the ``_c10d_functional`` collective) at compile time under the fallback
policy: ``"error"`` raises :class:`~xccl.ConstraintViolation`, ``"warn"`` warns once per op and constraint.

Reduce ops and dtypes: TorchAir's ``normalize_reduceop_type`` takes sum, min, max and product only, and GE's
HCCL operators the dtypes of their IR prototypes; the graph forms apply avg (as sum then a divide) and the
column's dtype casts in the graph itself (``xccl.graph._layers``), so the collectives reaching TorchAir already
have a reduce op and a dtype it takes.

TorchAir's own backend: a user who compiles with ``torch.compile(backend=torchair.get_npu_backend())``, as the
Ascend tutorials do, gets no lowering. :func:`converters` are GE converters the runtime registers with TorchAir
(its public ``register_fx_node_ge_converter``) for the lowered xccl ops, which raise
:class:`~xccl.UnsupportedCollective` saying to compile with ``xccl.compile``; graphs of standard collectives
only need none of this and compile there as they are.

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
from xccl.plugin import Collective, ConstraintViolation, Mode

from ._capabilities import ascend_table

if TYPE_CHECKING:
    from ._constraints import DomainTracker
    from ._runtime import AscendRuntime, FusedKernel

__all__ = ["LOWERED", "GraphOps", "converters", "lowering"]

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


def _as(op: Collective, x: torch.Tensor) -> torch.Tensor:
    """``x`` in the dtype the graph column moves it as (GE's IR dtypes: bfloat16 as float32, ...): the collectives
    the lowering emits itself (unfused fallbacks, the fused ops' backward) take the column's casts as the graph
    forms do."""
    cast = ascend_table().entry(op, Mode.GRAPH).cast_to.get(x.dtype)
    return x if cast is None else x.to(cast)


def _reduce_scatter(x: torch.Tensor, red: str, n: int, group_name: str) -> torch.Tensor:
    y = _as(C.REDUCE_SCATTER_TENSOR, x)
    out = _F.wait_tensor(_F.reduce_scatter_tensor(y, "sum" if red == "avg" else red, n, group_name))
    return (_divide(out, n) if red == "avg" else out).to(x.dtype)


def _all_reduce(x: torch.Tensor, red: str, group_name: str) -> torch.Tensor:
    y = _as(C.ALL_REDUCE, x)
    out = _F.wait_tensor(_F.all_reduce(y, "sum" if red == "avg" else red, group_name))
    return (_divide(out, _group(group_name).size()) if red == "avg" else out).to(x.dtype)


def _all_gather(x: torch.Tensor, n: int, group_name: str) -> torch.Tensor:
    y = _as(C.ALL_GATHER_INTO_TENSOR, x.contiguous())
    return _F.wait_tensor(_F.all_gather_into_tensor(y, n, group_name)).to(x.dtype)


# ------------------------------------------------------------------------------------------ point-to-point, uneven


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
    # The graph form turned avg into sum already (the column's rule); the reduce op reaches TorchAir as it is.
    out = ops.reduce_scatter_uneven(input.contiguous(), list(sizes), sizes[pg.rank()], reduce_op, tag, ranks,
                                    len(ranks), [])
    return out, token.clone()


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
    # torch.ops.xccl.* are defined on first use; this table names them before any graph may have been traced.
    return xccl.graph_ops()


def lowering(rt: AscendRuntime, ops: GraphOps, domain: DomainTracker) -> dict[Any, Callable[..., Any]]:
    """The decomposition table that lowers xccl's graph ops to ``ops`` (see the module docstring); ``domain`` is
    the process's MC2 communication domain (Atlas A2 allows one per model), checked and claimed at compile time."""
    x = _xccl_ops()
    return {
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


#: The xccl ops :func:`lowering` handles, by name (``torch.ops.xccl.<name>``): what the runtime's graph compiler
#: takes (``Runtime.graph_ops``).
LOWERED: Final = frozenset({
    "all_to_all_v", "send", "recv", "all_gather_into_tensor_uneven", "reduce_scatter_tensor_uneven",
    "mm_reduce_scatter", "all_gather_mm", "mm_all_reduce", "_fused_all_gather", "_fused_reduce_scatter",
})


def _needs_xccl_compile(name: str) -> Callable[..., Any]:
    def convert(*args: Any, **kwargs: Any) -> Any:
        raise xccl.UnsupportedCollective(
            name, "ascend",
            f"TorchAir's own backend (torchair.get_npu_backend()) got xccl.{name}, an xccl graph op it has no "
            "converter for: compile with xccl.compile(model) (or torch.compile(model, backend='xccl')), which hands "
            "the graph to TorchAir with xccl's lowering to TorchAir's own ops; graphs of the standard collectives "
            "alone (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast) compile either way",
        )

    convert.__name__ = f"convert_xccl_{name}"
    return convert


def converters() -> dict[Any, Callable[..., Any]]:
    """GE converters for TorchAir's registry, one per lowered xccl op, that raise the error above: what a graph
    of xccl's own ops meets when it reaches TorchAir's backend without xccl's lowering."""
    x = _xccl_ops()
    return {getattr(x, name).default: _needs_xccl_compile(name) for name in sorted(LOWERED)}
