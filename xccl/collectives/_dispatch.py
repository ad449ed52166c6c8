"""Dispatch: native kernel, else an emulation the table allows, else a typed error - before any communication.

Every public collective does the same three things:

1. find the group's :class:`~xccl.runtime._init.GroupContext` and the kernel for this call shape in its plan cache
   (the first call of a shape consults the capability table, applies the fallback policy and caches the result);
2. validate locally what every rank can check alone (type, device, dtype agreement, sizes), so a bad call fails
   the same way on every rank and nothing hangs;
3. call the kernel, translating backend faults into typed errors.

Kernels have the signature ``kernel(ctx, *args)`` where ``args`` are the public function's arguments in order;
native ones forward to ``torch.distributed``, emulated ones (``_emulate``) compose other public collectives.
The added Python cost per call is measured by ``benchmarks/overhead.py``.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from .. import graph as _graph
from . import _emulate, _faults
from ..plugin._capabilities import Collective, Level, reduce_op_name
from ..errors import InvalidArgument, UnsupportedCollective
from ..runtime._init import _STATE, GroupContext, context

LOG = logging.getLogger("xccl")
ReduceOp = dist.ReduceOp
SUM: Final = ReduceOp.SUM
C = Collective
Kernel = Callable[..., Any]
_ALL_REDUCE: Final = C.ALL_REDUCE
_TENSOR: Final = torch.Tensor

# ---------------------------------------------------------------------------------------------- native kernels
# Each takes (ctx, *public args) and forwards to torch.distributed unchanged. torch 2.13 renamed the tensor
# forms (all_gather_into_tensor -> all_gather_single, reduce_scatter_tensor -> reduce_scatter_single) and
# deprecates the old names with a warning on every call; use the new ones where they exist.
_all_gather_single: Final = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single: Final = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_NATIVE: Final[dict[Collective, Kernel]] = {
    C.ALL_REDUCE: lambda ctx, t, op, g, a: dist.all_reduce(t, op, g, a),
    C.ALL_GATHER: lambda ctx, outs, t, g, a: dist.all_gather(outs, t, g, a),
    C.ALL_GATHER_INTO_TENSOR: lambda ctx, out, t, g, a: _all_gather_single(out, t, g, a),
    C.REDUCE_SCATTER: lambda ctx, out, ins, op, g, a: dist.reduce_scatter(out, ins, op, g, a),
    C.REDUCE_SCATTER_TENSOR: lambda ctx, out, t, op, g, a: _reduce_scatter_single(out, t, op, g, a),
    C.ALL_TO_ALL: lambda ctx, outs, ins, g, a: dist.all_to_all(outs, ins, g, a),
    C.ALL_TO_ALL_SINGLE: lambda ctx, out, t, osz, isz, g, a: dist.all_to_all_single(out, t, osz, isz, g, a),
    C.ALL_TO_ALL_SINGLE_UNEVEN: lambda ctx, out, t, osz, isz, g, a: dist.all_to_all_single(out, t, osz, isz, g, a),
    C.BROADCAST: lambda ctx, t, src, g, a: dist.broadcast(t, src, g, a),
    C.REDUCE: lambda ctx, t, dst, op, g, a: dist.reduce(t, dst, op, g, a),
    C.GATHER: lambda ctx, t, lst, dst, g, a: dist.gather(t, lst, dst, g, a),
    C.SCATTER: lambda ctx, t, lst, src, g, a: dist.scatter(t, lst, src, g, a),
    C.BARRIER: lambda ctx, g, a: dist.barrier(g, a),
    C.SEND: lambda ctx, t, peer, g, a: dist.isend(t, peer, g) if a else dist.send(t, peer, g),
    C.RECV: lambda ctx, t, peer, g, a: dist.irecv(t, peer, g) if a else dist.recv(t, peer, g),
}

_NATIVE_ALL_REDUCE: Final = _NATIVE[C.ALL_REDUCE]
_dist_all_reduce: Final = dist.all_reduce
_WARNED: Final[set[tuple[str, str]]] = set()
_monotonic: Final = time.monotonic
_TypedWork: Final = _faults.TypedWork
_RED_OP_TYPE: Final = ReduceOp.RedOpType
# Graph mode: while torch.compile traces, every public collective hands over to its graph form (xccl.graph);
# bound once here so that the eager path pays one call (~60 ns) for the check.
_compiling: Final = torch.compiler.is_compiling


def plan(ctx: GroupContext, op: Collective, dtype: torch.dtype | None, reduce_op: Any = None) -> Kernel:
    """Resolve (and cache) the kernel for ``op`` with this dtype and reduce op on ``ctx``'s backend.

    Raises:
        UnsupportedCollective: the backend cannot run it, or only emulated and the policy is ``"error"``.
    """
    kernel = ctx.plans.get((op, dtype, reduce_op))
    if kernel is not None:
        return kernel
    redop = None if reduce_op is None else reduce_op_name(reduce_op)
    # ReduceOp *instances* (premul_sum) are new objects per call: cache those under the op's name instead, or
    # the cache would grow by one entry per call.
    key = (op, dtype, reduce_op if reduce_op is None or type(reduce_op) is _RED_OP_TYPE else redop)
    kernel = ctx.plans.get(key)
    if kernel is not None:
        return kernel
    res = ctx.table.require(
        op, dtype=dtype, reduce_op=redop, world_size=ctx.size, allow_emulated=ctx.fallback != "error"
    )
    native = ctx.runtime.kernels().get(op) or _NATIVE.get(op)
    if res.level is Level.NATIVE:
        if native is None:
            raise UnsupportedCollective(str(op), ctx.table.backend, "marked native but the plugin has no kernel")
        kernel = native
    else:
        _emulate.require_blocks(ctx.table, op, res, dtype, redop, ctx.size)
        kernel = _emulate.build(op, res, native, ctx.table.entry(op).level is Level.NATIVE, redop)
        if ctx.fallback == "warn":
            _warn_once(op, ctx.table.backend, _emulate.describe(op, res, dtype))
    ctx.plans[key] = kernel
    return kernel


def _warn_once(op: Collective, backend: str, how: str) -> None:
    if (op.value, backend) in _WARNED:
        return
    _WARNED.add((op.value, backend))
    warnings.warn(
        f"xccl: {op.value} is emulated on {backend}: {how}. "
        "Pass fallback='emulate' to xccl.init to silence this, or fallback='error' to forbid emulation.",
        EmulationWarning,
        stacklevel=_outside_xccl(),
    )


_PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outside_xccl() -> int:
    """The ``stacklevel`` of the first frame outside xccl, as seen from :func:`_warn_once`.

    A fixed level points into xccl for send/recv (one helper deeper) and for ops planned inside an emulation;
    the user's line is what the warning should name. Runs once per (op, backend), so the walk costs nothing.
    """
    frame: types.FrameType | None = sys._getframe(1)  # _warn_once, the frame that stacklevel=1 names
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


class EmulationWarning(UserWarning):
    """A collective runs as an emulation on this backend (warned once per op and backend)."""


def call(ctx: GroupContext, name: str, kernel: Kernel, *args: Any) -> Any:
    """Run ``kernel`` and turn backend faults into typed errors (see ``_faults``).

    A synchronous call gains one clock read; an asynchronous one returns its handle wrapped in
    :class:`~xccl.collectives._faults.TypedWork`, so that a fault surfacing in ``wait()`` is typed too.
    """
    started = _monotonic()
    try:
        work = kernel(ctx, *args)
    except RuntimeError as exc:
        raise_typed(exc, ctx, name, started)
        raise
    if work is None or type(work) is _TypedWork:
        return work
    return _TypedWork(work, ctx, name, started)


def raise_typed(exc: RuntimeError, ctx: GroupContext, name: str, started: float | None = None) -> None:
    """Raise the typed error for a backend fault (chaining it), or return when it is not a fault we know."""
    typed = _faults.translate(exc, ctx, name, started)
    if typed is not exc:
        raise typed from exc


# ------------------------------------------------------------------------------------------- local validation


def _tensor(ctx: GroupContext, op: str, what: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(op, f"{what} must be a torch.Tensor, got {type(t).__name__}")
    dev = ctx.device_type
    if not (t.is_cpu if dev == "cpu" else t.is_cuda if dev == "cuda" else t.device.type == dev):
        raise InvalidArgument(
            op, f"{what} is on {t.device}, but the {ctx.table.backend} backend takes {dev} tensors; move it with .to()"
        )
    if not t.is_contiguous():
        raise InvalidArgument(op, f"{what} is not contiguous; call .contiguous() first")
    return t


def _same_dtype(op: str, a: torch.Tensor, b: torch.Tensor, what: str = "output and input") -> None:
    if a.dtype != b.dtype:
        raise InvalidArgument(op, f"{what} dtypes differ ({a.dtype} vs {b.dtype})")


def _tensor_list(ctx: GroupContext, op: str, what: str, ts: Any, n: int) -> list[torch.Tensor]:
    if not isinstance(ts, (list, tuple)):
        raise InvalidArgument(op, f"{what} must be a list of tensors, got {type(ts).__name__}")
    if len(ts) != n:
        raise InvalidArgument(op, f"{what} has {len(ts)} tensors; the group has {n} ranks")
    for i, t in enumerate(ts):
        _tensor(ctx, op, f"{what}[{i}]", t)
    return list(ts)


def _member(ctx: GroupContext, op: str, what: str, rank: Any, group_rank: Any) -> int:
    """Normalise a global/group root or peer to a global rank, checking membership."""
    if group_rank is not None:
        if rank is not None:
            raise InvalidArgument(op, f"pass {what} or group_{what}, not both")
        if not isinstance(group_rank, int) or not 0 <= group_rank < ctx.size:
            raise InvalidArgument(op, f"group_{what}={group_rank!r} is outside [0, {ctx.size}) for this group")
        return ctx.ranks[group_rank]
    if rank is None:
        raise InvalidArgument(op, f"{what} is required")
    if not isinstance(rank, int) or rank not in ctx.ranks:
        raise InvalidArgument(op, f"{what}={rank!r} is not a member of this group (ranks {list(ctx.ranks)})")
    return rank


def _counts(op: str, what: str, values: Any) -> list[int]:
    """``values`` as a list of non-negative ints. Anything ``operator.index`` takes (numpy ints, integer 0-d
    tensors) is accepted; floats, bools and strings are refused rather than truncated."""
    try:
        items = list(values)
    except TypeError:
        raise InvalidArgument(op, f"{what} must be a sequence of integers, got {type(values).__name__}") from None
    counts = []
    for s in items:
        try:
            if isinstance(s, bool):
                raise TypeError
            counts.append(operator.index(s))
        except TypeError:
            raise InvalidArgument(
                op, f"{what}={items!r} must hold integers, but has {s!r} ({type(s).__name__})"
            ) from None
    if any(c < 0 for c in counts):
        raise InvalidArgument(op, f"{what}={counts} must be non-negative integers")
    return counts


def _splits(op: str, what: str, sizes: Any, n: int, total: int | None) -> list[int] | None:
    if sizes is None:
        return None
    counts = _counts(op, what, sizes)
    if len(counts) != n:
        raise InvalidArgument(op, f"{what} has {len(counts)} entries; the group has {n} ranks")
    if total is not None and sum(counts) != total:
        raise InvalidArgument(op, f"{what}={counts} sums to {sum(counts)}, but the tensor's dim 0 is {total}")
    return counts


# ---------------------------------------------------------------------------------------------- the collectives


def all_reduce(tensor: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
    """Reduce ``tensor`` across the group in place (``torch.distributed.all_reduce``)."""
    if _compiling():
        return _graph.all_reduce(tensor, op, group, async_op)
    # The hottest path: kept flat (no helper calls on a cache hit) because its cost is benchmarked per call.
    ctx = _STATE.default if group is None else None
    if ctx is None:
        ctx = context(group)
    dtype = getattr(tensor, "dtype", None)
    kernel = ctx.plans.get((_ALL_REDUCE, dtype, op)) or plan(ctx, _ALL_REDUCE, dtype, op)
    dev = ctx.device_type
    if (
        type(tensor) is not _TENSOR
        or not (tensor.is_cpu if dev == "cpu" else tensor.is_cuda if dev == "cuda" else False)
        or not tensor.is_contiguous()
    ):
        _tensor(ctx, "all_reduce", "tensor", tensor)  # the full check: raises, or accepts subclasses/devices
    if ctx.check:
        _check(ctx, _ALL_REDUCE, (tensor,), op)
    try:
        # The native kernel is called directly: one Python frame less on the path benchmarked per call.
        if kernel is _NATIVE_ALL_REDUCE:
            work = _dist_all_reduce(tensor, op, group, async_op)
        else:
            work = kernel(ctx, tensor, op, group, async_op)
    except RuntimeError as exc:
        raise_typed(exc, ctx, "all_reduce")
        raise
    # Async handles are wrapped so wait() raises typed faults too; the sync path returns None untouched.
    return work if work is None else _TypedWork(work, ctx, "all_reduce", _monotonic())


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Gather ``tensor`` from every rank into ``tensor_list`` (``torch.distributed.all_gather``)."""
    if _compiling():
        return _graph.all_gather(tensor_list, tensor, group, async_op)
    ctx = context(group)
    _tensor(ctx, "all_gather", "tensor", tensor)
    outs = _tensor_list(ctx, "all_gather", "tensor_list", tensor_list, ctx.size)
    for i, o in enumerate(outs):
        _same_dtype("all_gather", o, tensor, f"tensor_list[{i}] and tensor")
    if outs[ctx.rank].shape != tensor.shape:
        raise InvalidArgument(
            "all_gather", f"tensor_list[{ctx.rank}] has shape {tuple(outs[ctx.rank].shape)}, tensor has {tuple(tensor.shape)}"
        )
    kernel = plan(ctx, C.ALL_GATHER, tensor.dtype)
    if ctx.check:
        _check(ctx, C.ALL_GATHER, (tensor, *outs))
    return call(ctx, "all_gather", kernel, tensor_list, tensor, group, async_op)


def all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Gather every rank's ``input_tensor`` into ``output_tensor`` along dim 0 (or stacked)."""
    if _compiling():
        return _graph.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)
    ctx = context(group)
    _tensor(ctx, "all_gather_into_tensor", "output_tensor", output_tensor)
    _tensor(ctx, "all_gather_into_tensor", "input_tensor", input_tensor)
    _same_dtype("all_gather_into_tensor", output_tensor, input_tensor)
    if output_tensor.numel() != input_tensor.numel() * ctx.size:
        raise InvalidArgument(
            "all_gather_into_tensor",
            f"output has {output_tensor.numel()} elements; expected input's {input_tensor.numel()} x {ctx.size} ranks",
        )
    kernel = plan(ctx, C.ALL_GATHER_INTO_TENSOR, input_tensor.dtype)
    if ctx.check:
        _check(ctx, C.ALL_GATHER_INTO_TENSOR, (output_tensor, input_tensor))
    return call(ctx, "all_gather_into_tensor", kernel, output_tensor, input_tensor, group, async_op)


def reduce_scatter(
    output: torch.Tensor, input_list: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``input_list[i]`` across ranks into ``output`` on rank ``i``."""
    if _compiling():
        return _graph.reduce_scatter(output, input_list, op, group, async_op)
    ctx = context(group)
    _tensor(ctx, "reduce_scatter", "output", output)
    ins = _tensor_list(ctx, "reduce_scatter", "input_list", input_list, ctx.size)
    for i, t in enumerate(ins):
        _same_dtype("reduce_scatter", output, t, f"output and input_list[{i}]")
        if t.shape != output.shape:
            raise InvalidArgument(
                "reduce_scatter", f"input_list[{i}] has shape {tuple(t.shape)}, output has {tuple(output.shape)}"
            )
    kernel = plan(ctx, C.REDUCE_SCATTER, output.dtype, op)
    if ctx.check:
        _check(ctx, C.REDUCE_SCATTER, (output, *ins), op)
    return call(ctx, "reduce_scatter", kernel, output, input_list, op, group, async_op)


def reduce_scatter_tensor(
    output: torch.Tensor, input: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``input`` across ranks and scatter equal dim-0 chunks of the result into ``output``."""
    if _compiling():
        return _graph.reduce_scatter_tensor(output, input, op, group, async_op)
    ctx = context(group)
    _tensor(ctx, "reduce_scatter_tensor", "output", output)
    _tensor(ctx, "reduce_scatter_tensor", "input", input)
    _same_dtype("reduce_scatter_tensor", output, input)
    if input.numel() != output.numel() * ctx.size:
        raise InvalidArgument(
            "reduce_scatter_tensor",
            f"input has {input.numel()} elements; expected output's {output.numel()} x {ctx.size} ranks",
        )
    kernel = plan(ctx, C.REDUCE_SCATTER_TENSOR, input.dtype, op)
    if ctx.check:
        _check(ctx, C.REDUCE_SCATTER_TENSOR, (output, input), op)
    return call(ctx, "reduce_scatter_tensor", kernel, output, input, op, group, async_op)


def all_to_all(
    output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor], group: Any = None, async_op: bool = False
) -> Any:
    """Send ``input_tensor_list[j]`` to rank ``j`` and receive rank ``j``'s into ``output_tensor_list[j]``."""
    if _compiling():
        return _graph.all_to_all(output_tensor_list, input_tensor_list, group, async_op)
    ctx = context(group)
    outs = _tensor_list(ctx, "all_to_all", "output_tensor_list", output_tensor_list, ctx.size)
    ins = _tensor_list(ctx, "all_to_all", "input_tensor_list", input_tensor_list, ctx.size)
    dtype = ins[0].dtype
    for t in [*outs, *ins]:
        if t.dtype != dtype:
            raise InvalidArgument("all_to_all", f"tensors have mixed dtypes ({t.dtype} vs {dtype})")
    if outs[ctx.rank].numel() != ins[ctx.rank].numel():
        raise InvalidArgument("all_to_all", f"output/input sizes for this rank ({ctx.rank}) differ")
    kernel = plan(ctx, C.ALL_TO_ALL, dtype)
    if ctx.check:
        _check(ctx, C.ALL_TO_ALL, (*outs, *ins))
    return call(ctx, "all_to_all", kernel, output_tensor_list, input_tensor_list, group, async_op)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Split ``input`` along dim 0, send chunk ``j`` to rank ``j``, concatenate what arrives into ``output``."""
    if _compiling():
        return _graph.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)
    ctx = context(group)
    _tensor(ctx, "all_to_all_single", "output", output)
    _tensor(ctx, "all_to_all_single", "input", input)
    _same_dtype("all_to_all_single", output, input)
    n = ctx.size
    osz = _splits("all_to_all_single", "output_split_sizes", output_split_sizes, n, output.shape[0] if output.dim() else 0)
    isz = _splits("all_to_all_single", "input_split_sizes", input_split_sizes, n, input.shape[0] if input.dim() else 0)
    if osz is None and (output.dim() == 0 or output.shape[0] % n):
        raise InvalidArgument("all_to_all_single", f"output dim 0 must divide evenly by {n} without output_split_sizes")
    if isz is None and (input.dim() == 0 or input.shape[0] % n):
        raise InvalidArgument("all_to_all_single", f"input dim 0 must divide evenly by {n} without input_split_sizes")
    if osz is None and isz is None and output.numel() != input.numel():
        raise InvalidArgument("all_to_all_single", f"output has {output.numel()} elements, input {input.numel()}")
    # Even or uneven must be decided the same way on every rank, but a rank sees only its own row and column of
    # the count matrix: [[1, 1], [1, 2]] is uniform on rank 0 and not on rank 1, and where the two take different
    # kernels (SCCL: native vs padded) the ranks would run different collectives and hang. So: split sizes given
    # (by every rank, as torch expects) means the uneven op; on native backends it is the same call.
    op = C.ALL_TO_ALL_SINGLE if osz is None and isz is None else C.ALL_TO_ALL_SINGLE_UNEVEN
    kernel = plan(ctx, op, input.dtype)
    if ctx.check:
        _check(ctx, op, (output, input))
    return call(ctx, "all_to_all_single", kernel, output, input, osz, isz, group, async_op)


def broadcast(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False, group_src: int | None = None
) -> Any:
    """Copy ``tensor`` from rank ``src`` (global rank) to every rank of the group."""
    if _compiling():
        return _graph.broadcast(tensor, src, group, async_op, group_src)
    ctx = context(group)
    _tensor(ctx, "broadcast", "tensor", tensor)
    root = _member(ctx, "broadcast", "src", src, group_src)
    kernel = plan(ctx, C.BROADCAST, tensor.dtype)
    if ctx.check:
        _check(ctx, C.BROADCAST, (tensor,), root=root)
    return call(ctx, "broadcast", kernel, tensor, root, group, async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Reduce ``tensor`` across the group into rank ``dst`` (global rank)."""
    if _compiling():
        return _graph.reduce(tensor, dst, op, group, async_op, group_dst)
    ctx = context(group)
    _tensor(ctx, "reduce", "tensor", tensor)
    root = _member(ctx, "reduce", "dst", dst, group_dst)
    kernel = plan(ctx, C.REDUCE, tensor.dtype, op)
    if ctx.check:
        _check(ctx, C.REDUCE, (tensor,), op, root)
    return call(ctx, "reduce", kernel, tensor, root, op, group, async_op)


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Gather ``tensor`` from every rank into ``gather_list`` on rank ``dst`` (global rank)."""
    if _compiling():
        return _graph.gather(tensor, gather_list, dst, group, async_op, group_dst)
    ctx = context(group)
    _tensor(ctx, "gather", "tensor", tensor)
    root = _member(ctx, "gather", "dst", 0 if dst is None and group_dst is None else dst, group_dst)
    if ctx.ranks[ctx.rank] == root:
        lst = _tensor_list(ctx, "gather", "gather_list", gather_list, ctx.size)
        for i, t in enumerate(lst):
            _same_dtype("gather", t, tensor, f"gather_list[{i}] and tensor")
            if t.shape != tensor.shape:
                raise InvalidArgument("gather", f"gather_list[{i}] has shape {tuple(t.shape)}, tensor {tuple(tensor.shape)}")
    elif gather_list:
        raise InvalidArgument("gather", "gather_list must be None or empty on ranks other than dst")
    kernel = plan(ctx, C.GATHER, tensor.dtype)
    if ctx.check:
        _check(ctx, C.GATHER, (tensor,), root=root)
    return call(ctx, "gather", kernel, tensor, gather_list if gather_list else None, root, group, async_op)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """Scatter ``scatter_list[i]`` from rank ``src`` (global rank) into ``tensor`` on rank ``i``."""
    if _compiling():
        return _graph.scatter(tensor, scatter_list, src, group, async_op, group_src)
    ctx = context(group)
    _tensor(ctx, "scatter", "tensor", tensor)
    root = _member(ctx, "scatter", "src", 0 if src is None and group_src is None else src, group_src)
    if ctx.ranks[ctx.rank] == root:
        lst = _tensor_list(ctx, "scatter", "scatter_list", scatter_list, ctx.size)
        for i, t in enumerate(lst):
            _same_dtype("scatter", t, tensor, f"scatter_list[{i}] and tensor")
            if t.shape != tensor.shape:
                raise InvalidArgument("scatter", f"scatter_list[{i}] has shape {tuple(t.shape)}, tensor {tuple(tensor.shape)}")
    elif scatter_list:
        raise InvalidArgument("scatter", "scatter_list must be None or empty on ranks other than src")
    kernel = plan(ctx, C.SCATTER, tensor.dtype)
    if ctx.check:
        _check(ctx, C.SCATTER, (tensor,), root=root)
    return call(ctx, "scatter", kernel, tensor, scatter_list if scatter_list else None, root, group, async_op)


def barrier(group: Any = None, async_op: bool = False) -> Any:
    """Block until every rank of the group reaches the barrier."""
    if _compiling():
        return _graph.barrier(group, async_op)
    ctx = context(group)
    kernel = plan(ctx, C.BARRIER, None)
    if ctx.check:
        _check(ctx, C.BARRIER, ())
    return call(ctx, "barrier", kernel, group, async_op)


def _p2p(op: Collective, tensor: torch.Tensor, peer: int | None, group: Any, group_peer: int | None, a: bool) -> Any:
    ctx = context(group)
    name = op.value if not a else "i" + op.value
    _tensor(ctx, name, "tensor", tensor)
    what = "dst" if op is C.SEND else "src"
    peer = _member(ctx, name, what, peer, group_peer)
    if peer == ctx.ranks[ctx.rank]:
        raise InvalidArgument(name, f"{what}={peer} is this rank itself")
    kernel = plan(ctx, op, tensor.dtype)
    return call(ctx, name, kernel, tensor, peer, group, a)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst`` (global rank); blocks until it is handed to the backend."""
    if _compiling():
        return _graph.send(tensor, dst, group, tag, group_dst)
    _p2p(C.SEND, tensor, dst, group, group_dst, False)


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from rank ``src`` (global rank); returns ``src``."""
    if _compiling():
        return _graph.recv(tensor, src, group, tag, group_src)
    _p2p(C.RECV, tensor, src, group, group_src, False)
    return src if src is not None else context(group).ranks[group_src]  # type: ignore[index]


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
    """Asynchronous :func:`send`; returns a work handle to ``wait()`` on."""
    if _compiling():
        return _graph.isend(tensor, dst, group, tag, group_dst)
    return _p2p(C.SEND, tensor, dst, group, group_dst, True)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Any:
    """Asynchronous :func:`recv`; returns a work handle to ``wait()`` on."""
    if _compiling():
        return _graph.irecv(tensor, src, group, tag, group_src)
    return _p2p(C.RECV, tensor, src, group, group_src, True)


# ------------------------------------------------------------------------------------- uneven collectives (HCCL)


def all_gather_into_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-gather where rank ``i`` contributes ``output_split_sizes[i]`` rows (torch_npu's semantics).

    ``output`` has ``sum(output_split_sizes)`` rows; ``input`` has ``output_split_sizes[rank]`` rows. Without
    split sizes it is :func:`all_gather_into_tensor`.
    """
    if _compiling():
        return _graph.all_gather_into_tensor_uneven(output, input, output_split_sizes, group, async_op)
    ctx = context(group)
    op = "all_gather_into_tensor_uneven"
    _tensor(ctx, op, "output", output)
    _tensor(ctx, op, "input", input)
    _same_dtype(op, output, input)
    if output.dim() == 0 or input.dim() == 0:
        raise InvalidArgument(op, "output and input need at least one dimension")
    sizes = _splits(op, "output_split_sizes", output_split_sizes, ctx.size, output.shape[0])
    if sizes is None:
        sizes = [input.shape[0]] * ctx.size
        if output.shape[0] != input.shape[0] * ctx.size:
            raise InvalidArgument(op, f"output dim 0 is {output.shape[0]}; expected {input.shape[0]} x {ctx.size}")
    if input.shape[0] != sizes[ctx.rank] or input.shape[1:] != output.shape[1:]:
        raise InvalidArgument(
            op, f"input shape {tuple(input.shape)} does not match output_split_sizes[{ctx.rank}]={sizes[ctx.rank]} "
            f"and output's trailing shape {tuple(output.shape[1:])}"
        )
    kernel = plan(ctx, C.ALL_GATHER_INTO_TENSOR_UNEVEN, input.dtype)
    if ctx.check:
        _check(ctx, C.ALL_GATHER_INTO_TENSOR_UNEVEN, (output,), extra=tuple(sizes))
    return call(ctx, op, kernel, output, input, sizes, group, async_op)


def reduce_scatter_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    input_split_sizes: Sequence[int] | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce-scatter where rank ``i`` receives ``input_split_sizes[i]`` rows (torch_npu's semantics)."""
    if _compiling():
        return _graph.reduce_scatter_tensor_uneven(output, input, input_split_sizes, op, group, async_op)
    ctx = context(group)
    name = "reduce_scatter_tensor_uneven"
    _tensor(ctx, name, "output", output)
    _tensor(ctx, name, "input", input)
    _same_dtype(name, output, input)
    if output.dim() == 0 or input.dim() == 0:
        raise InvalidArgument(name, "output and input need at least one dimension")
    sizes = _splits(name, "input_split_sizes", input_split_sizes, ctx.size, input.shape[0])
    if sizes is None:
        sizes = [output.shape[0]] * ctx.size
        if input.shape[0] != output.shape[0] * ctx.size:
            raise InvalidArgument(name, f"input dim 0 is {input.shape[0]}; expected {output.shape[0]} x {ctx.size}")
    if output.shape[0] != sizes[ctx.rank] or input.shape[1:] != output.shape[1:]:
        raise InvalidArgument(
            name, f"output shape {tuple(output.shape)} does not match input_split_sizes[{ctx.rank}]={sizes[ctx.rank]} "
            f"and input's trailing shape {tuple(input.shape[1:])}"
        )
    kernel = plan(ctx, C.REDUCE_SCATTER_TENSOR_UNEVEN, input.dtype, op)
    if ctx.check:
        _check(ctx, C.REDUCE_SCATTER_TENSOR_UNEVEN, (input,), op, extra=tuple(sizes))
    return call(ctx, name, kernel, output, input, sizes, op, group, async_op)


def all_to_all_v(
    output: torch.Tensor,
    input: torch.Tensor,
    send_count_matrix: Sequence[Sequence[int]],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-to-all with per-peer element counts: ``send_count_matrix[i][j]`` elements go from rank i to rank j.

    The matrix is the same on every rank (torch_npu's ``all_to_all_vc`` contract). ``input`` holds this rank's
    row of counts, contiguous per peer; ``output`` receives column ``rank``, contiguous per peer. In-place is
    not allowed.
    """
    if _compiling():
        return _graph.all_to_all_v(output, input, send_count_matrix, group, async_op)
    ctx = context(group)
    name = "all_to_all_v"
    _tensor(ctx, name, "output", output)
    _tensor(ctx, name, "input", input)
    _same_dtype(name, output, input)
    n = ctx.size
    try:
        rows = list(send_count_matrix)
    except TypeError:
        raise InvalidArgument(name, "send_count_matrix must be a list of lists of integers") from None
    matrix = [_counts(name, f"send_count_matrix[{i}]", row) for i, row in enumerate(rows)]
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise InvalidArgument(name, f"send_count_matrix must be {n}x{n} (the group size), got {[len(r) for r in matrix]}")
    send, recv_ = sum(matrix[ctx.rank]), sum(row[ctx.rank] for row in matrix)
    if input.numel() != send:
        raise InvalidArgument(name, f"input has {input.numel()} elements; row {ctx.rank} of the matrix sums to {send}")
    if output.numel() != recv_:
        raise InvalidArgument(name, f"output has {output.numel()} elements; column {ctx.rank} of the matrix sums to {recv_}")
    if output.data_ptr() == input.data_ptr() and output.numel():
        raise InvalidArgument(name, "output and input are the same buffer; in-place is not allowed")
    kernel = plan(ctx, C.ALL_TO_ALL_V, input.dtype)
    if ctx.check:
        _check(ctx, C.ALL_TO_ALL_V, (), extra=tuple(c for row in matrix for c in row))
    return call(ctx, name, kernel, output, input, matrix, group, async_op)


def _check(
    ctx: GroupContext,
    op: Collective,
    tensors: tuple[torch.Tensor, ...],
    reduce_op: Any = None,
    root: int | None = None,
    extra: tuple[int, ...] = (),
) -> None:
    from ._check import verify

    verify(ctx, op, tensors, reduce_op, root, extra)

