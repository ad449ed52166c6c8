"""Emulations: collectives composed of what a backend does have.

Each emulation has a kernel's signature, ``(ctx, *public args)``, and composes *public* xccl collectives, so it
is itself dispatched: on a backend that lacks a building block too, the block is emulated in turn (e.g. list
all_to_all -> uneven all_to_all_single -> padded even all_to_all_single on SCCL).

Layers are applied by :func:`build` in this order, innermost first:

1. the op itself: the native kernel, or the table entry's ``via`` composition;
2. ``avg`` as ``sum`` then a divide, where the kernel lacks AVG;
3. a dtype cast where the kernel lacks the dtype: a free ``view`` for ops that only move bytes (bool as uint8,
   float64 as int64), a converting copy for reductions (bool reduced as uint8 max/min = logical or/and).

Traffic notes (``EXTRA``) feed the once-per-op warning so users see what emulation costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ..plugin._capabilities import Collective, Level, Resolution, reduce_op_name
from ..errors import UnsupportedCollective
from ..plugin._work import finish

__all__ = ["EMULATIONS", "NEEDS", "build", "describe", "local_reduce", "require_blocks"]

C = Collective
R = dist.ReduceOp
Kernel = Callable[..., Any]


def _api() -> Any:
    # The public collectives live in _dispatch, which imports this module; resolve lazily.
    from . import _dispatch

    return _dispatch


# ------------------------------------------------------------------------------------------------ local reduce


def local_reduce(stack: torch.Tensor, op: str, out: torch.Tensor) -> None:
    """Reduce ``stack`` (ranks along dim 0) with ``op`` into ``out``, in rank order."""
    n = stack.shape[0]
    if op in ("sum", "avg"):
        # Accumulate in rank order, as a ring does, so float results match the native kernel's up to rounding.
        acc = stack[0].clone()
        for i in range(1, n):
            acc.add_(stack[i])
        if op == "avg":
            acc = acc.div_(n) if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
        out.copy_(acc.view_as(out))
        return
    fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "product": torch.mul,
        "min": torch.minimum,
        "max": torch.maximum,
        "band": torch.bitwise_and,
        "bor": torch.bitwise_or,
        "bxor": torch.bitwise_xor,
    }
    fn = fns.get(op)
    if fn is None:
        raise UnsupportedCollective("local reduction", "xccl emulation", f"reduce op {op!r} cannot be emulated")
    out.copy_(functools.reduce(fn, list(stack)).view_as(out))


# ---------------------------------------------------------------------------------------------- compositions


def _rs_tensor_via_all_to_all(ctx: Any, out: torch.Tensor, inp: torch.Tensor, op: Any, g: Any, a: bool) -> Any:
    """reduce_scatter_tensor = all_to_all_single + local reduction: each rank receives only its own chunk from
    every peer, (n-1)/n of the input, exactly what a ring reduce_scatter moves."""
    n = ctx.size
    recv = torch.empty_like(inp).view(-1)
    _api().all_to_all_single(recv, inp.view(-1), group=g)
    local_reduce(recv.view(n, -1), reduce_op_name(op), out.view(-1))
    return finish(None, a)


def _rs_tensor_via_all_reduce(ctx: Any, out: torch.Tensor, inp: torch.Tensor, op: Any, g: Any, a: bool) -> Any:
    """reduce_scatter_tensor = all_reduce + slice: moves twice a ring reduce_scatter's bytes; the last resort."""
    tmp = inp.clone()
    _api().all_reduce(tmp, op, g)
    out.view(-1).copy_(tmp.view(ctx.size, -1)[ctx.rank])
    return finish(None, a)


def _rs_list_via_tensor(ctx: Any, out: torch.Tensor, ins: Sequence[torch.Tensor], op: Any, g: Any, a: bool) -> Any:
    flat = torch.cat([t.reshape(-1) for t in ins])
    res = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
    _api().reduce_scatter_tensor(res, flat, op, g)
    out.copy_(res.view_as(out))
    return finish(None, a)


def _all_to_all_via_single(ctx: Any, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], g: Any, a: bool) -> Any:
    isz, osz = [t.numel() for t in ins], [t.numel() for t in outs]
    flat_in = torch.cat([t.reshape(-1) for t in ins])
    flat_out = torch.empty(sum(osz), dtype=flat_in.dtype, device=flat_in.device)
    # Always pass the sizes: this rank's own sizes being uniform says nothing about its peers' (see
    # all_to_all_single), and the even and uneven kernels may differ, so the choice must not be made locally.
    _api().all_to_all_single(flat_out, flat_in, osz, isz, g)
    for o, chunk in zip(outs, torch.split(flat_out, osz), strict=True):
        o.copy_(chunk.view_as(o))
    return finish(None, a)


def _a2a_uneven_via_padding(
    ctx: Any, out: torch.Tensor, inp: torch.Tensor, osz: list[int] | None, isz: list[int] | None, g: Any, a: bool
) -> Any:
    """Uneven all_to_all_single on a backend that only does even splits: agree on the largest chunk (one small
    all_reduce), pad every chunk to it, exchange evenly, unpad."""
    n, trail = ctx.size, inp.shape[1:]
    isz = isz or [inp.shape[0] // n] * n
    osz = osz or [out.shape[0] // n] * n
    biggest = torch.tensor([max(isz + osz)], dtype=torch.int64, device=inp.device)
    _api().all_reduce(biggest, R.MAX, g)
    m = int(biggest.item())
    pad_in = inp.new_zeros((n * m, *trail))
    for j, chunk in enumerate(torch.split(inp, isz)):
        pad_in[j * m : j * m + isz[j]].copy_(chunk)
    pad_out = out.new_empty((n * m, *trail))
    _api().all_to_all_single(pad_out, pad_in, group=g)
    offset = 0
    for j in range(n):
        out[offset : offset + osz[j]].copy_(pad_out[j * m : j * m + osz[j]])
        offset += osz[j]
    return finish(None, a)


def _ag_uneven_via_padding(ctx: Any, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], g: Any, a: bool) -> Any:
    n, m, trail = ctx.size, max(sizes), inp.shape[1:]
    pad_in = inp.new_zeros((m, *trail))
    pad_in[: sizes[ctx.rank]].copy_(inp)
    pad_out = out.new_empty((n * m, *trail))
    _api().all_gather_into_tensor(pad_out, pad_in, g)
    offset = 0
    for j in range(n):
        out[offset : offset + sizes[j]].copy_(pad_out[j * m : j * m + sizes[j]])
        offset += sizes[j]
    return finish(None, a)


def _rs_uneven_via_padding(
    ctx: Any, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], op: Any, g: Any, a: bool
) -> Any:
    # Padding rows are reduced too, then dropped: their value never matters, whatever the reduce op.
    n, m, trail = ctx.size, max(sizes), inp.shape[1:]
    pad_in = inp.new_zeros((n * m, *trail))
    for j, chunk in enumerate(torch.split(inp, sizes)):
        pad_in[j * m : j * m + sizes[j]].copy_(chunk)
    pad_out = out.new_empty((m, *trail))
    _api().reduce_scatter_tensor(pad_out, pad_in, op, g)
    out.copy_(pad_out[: sizes[ctx.rank]])
    return finish(None, a)


def _a2av_via_single(ctx: Any, out: torch.Tensor, inp: torch.Tensor, matrix: list[list[int]], g: Any, a: bool) -> Any:
    # The matrix is the same on every rank, so "every count equal" is a global fact and may pick the even kernel.
    if len({c for row in matrix for c in row}) == 1:
        return _api().all_to_all_single(out.view(-1), inp.view(-1), None, None, g, a)
    osz = [row[ctx.rank] for row in matrix]
    return _api().all_to_all_single(out.view(-1), inp.view(-1), osz, matrix[ctx.rank], g, a)


def _send_via_host(ctx: Any, t: torch.Tensor, peer: int, g: Any, a: bool) -> Any:
    """Point-to-point through a gloo group over the same ranks, staging through host memory."""
    host = t.detach().cpu()
    work = dist.isend(host, peer, ctx.side_group())
    return finish(work, a)


def _recv_via_host(ctx: Any, t: torch.Tensor, peer: int, g: Any, a: bool) -> Any:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    work = dist.irecv(host, peer, ctx.side_group())

    def copy_back() -> None:
        t.copy_(host)

    return finish(work, a, copy_back)


#: op -> via name -> (kernel, extra-traffic note).
EMULATIONS: Final[dict[Collective, dict[str, tuple[Kernel, str]]]] = {
    C.REDUCE_SCATTER_TENSOR: {
        "all_to_all": (_rs_tensor_via_all_to_all, "all_to_all_single + local reduction; same bytes as a ring"),
        "all_reduce": (_rs_tensor_via_all_reduce, "all_reduce + slice; about 2x the bytes of reduce_scatter"),
    },
    C.REDUCE_SCATTER: {
        "reduce_scatter_tensor": (_rs_list_via_tensor, "concatenates the inputs, then reduce_scatter_tensor"),
    },
    C.ALL_TO_ALL: {
        "all_to_all_single": (
            _all_to_all_via_single, "concatenates the inputs, one all_to_all_single with split sizes, one copy out"
        ),
    },
    C.ALL_TO_ALL_SINGLE_UNEVEN: {
        "padding": (_a2a_uneven_via_padding, "pads every chunk to the largest: one extra 8-byte all_reduce, "
                    "(largest/average chunk) x the bytes"),
    },
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: {
        "padding": (_ag_uneven_via_padding, "pads every rank's rows to the largest split"),
    },
    C.REDUCE_SCATTER_TENSOR_UNEVEN: {
        "padding": (_rs_uneven_via_padding, "pads every chunk to the largest split"),
    },
    C.ALL_TO_ALL_V: {
        "all_to_all_single": (_a2av_via_single, "all_to_all_single with split sizes from the count matrix"),
    },
    C.SEND: {"host_gloo": (_send_via_host, "staged through host memory over a gloo group")},
    C.RECV: {"host_gloo": (_recv_via_host, "staged through host memory over a gloo group")},
}

#: What each emulation calls: (op, dtype, reduce op). A dtype of None means the caller's (after any cast), a
#: reduce op of "=" the caller's (after avg-via-sum and the bool mapping). ``require_blocks`` checks them at plan
#: time, so an emulation whose building block cannot run the call shape fails before any rank communicates.
NEEDS: Final[dict[tuple[Collective, str], tuple[tuple[Collective, torch.dtype | None, str | None], ...]]] = {
    (C.REDUCE_SCATTER_TENSOR, "all_to_all"): ((C.ALL_TO_ALL_SINGLE, None, None),),
    (C.REDUCE_SCATTER_TENSOR, "all_reduce"): ((C.ALL_REDUCE, None, "="),),
    (C.REDUCE_SCATTER, "reduce_scatter_tensor"): ((C.REDUCE_SCATTER_TENSOR, None, "="),),
    (C.ALL_TO_ALL, "all_to_all_single"): ((C.ALL_TO_ALL_SINGLE_UNEVEN, None, None),),
    (C.ALL_TO_ALL_SINGLE_UNEVEN, "padding"): ((C.ALL_REDUCE, torch.int64, "max"), (C.ALL_TO_ALL_SINGLE, None, None)),
    (C.ALL_GATHER_INTO_TENSOR_UNEVEN, "padding"): ((C.ALL_GATHER_INTO_TENSOR, None, None),),
    (C.REDUCE_SCATTER_TENSOR_UNEVEN, "padding"): ((C.REDUCE_SCATTER_TENSOR, None, "="),),
    (C.ALL_TO_ALL_V, "all_to_all_single"): ((C.ALL_TO_ALL_SINGLE, None, None), (C.ALL_TO_ALL_SINGLE_UNEVEN, None, None)),
}


#: Emulations that reduce on the host with :func:`local_reduce`, and the reduce ops it has.
_REDUCES_LOCALLY: Final = frozenset({(C.REDUCE_SCATTER_TENSOR, "all_to_all")})
_LOCAL_OPS: Final = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor"})


def require_blocks(
    table: Any, op: Collective, res: Resolution, dtype: torch.dtype | None, redop: str | None, world_size: int
) -> None:
    """Raise :class:`UnsupportedCollective` now if an op the emulation of ``op`` calls cannot run this shape.

    The table resolves one op at a time: reduce_scatter via all_reduce claims every reduce op, but runs only those
    the backend's all_reduce has. Checked once per call shape (plans are cached), recursively.
    """
    if table.entry(op).level is not Level.EMULATED:
        return  # the native kernel, perhaps under the cast / avg layers, which resolve() already checked
    if res.cast is not None:
        if dtype == torch.bool and redop is not None:
            redop = reduce_op_name(_BOOL_OPS.get(redop, redop))
        dtype = res.cast
    if res.avg_via_sum:
        redop = "sum"
    if (op, res.via) in _REDUCES_LOCALLY and redop is not None and redop not in _LOCAL_OPS:
        # Found out only after the exchange otherwise (premul_sum, say): refuse it before anything is sent.
        raise UnsupportedCollective(op.value, table.backend, f"emulated via {res.via}, whose local reduction "
                                    f"has no {redop!r} (it has {', '.join(sorted(_LOCAL_OPS))})")
    for block, block_dtype, block_redop in NEEDS.get((op, res.via), ()):
        d, r = block_dtype or dtype, redop if block_redop == "=" else block_redop
        sub = table.resolve(block, dtype=d, reduce_op=r, world_size=world_size)
        if sub.level is Level.UNSUPPORTED:
            raise UnsupportedCollective(
                op.value, table.backend, f"emulated via {res.via}, which needs {block.value}, and there {sub.reason}"
            )
        require_blocks(table, block, sub, d, r, world_size)


# Where the reduce op sits among the public arguments (after ctx), per reducing op.
_REDOP_ARG: Final = {
    C.ALL_REDUCE: 1,
    C.REDUCE: 2,
    C.REDUCE_SCATTER: 2,
    C.REDUCE_SCATTER_TENSOR: 2,
    C.REDUCE_SCATTER_TENSOR_UNEVEN: 3,
}
# Which public arguments are tensors (or lists of tensors) written by the op, read by it, or both.
_OUT, _IN, _INOUT = "out", "in", "inout"
_TENSOR_ARGS: Final[dict[Collective, tuple[tuple[int, str], ...]]] = {
    C.ALL_REDUCE: ((0, _INOUT),),
    C.REDUCE: ((0, _INOUT),),
    C.BROADCAST: ((0, _INOUT),),
    C.ALL_GATHER: ((0, _OUT), (1, _IN)),
    C.ALL_GATHER_INTO_TENSOR: ((0, _OUT), (1, _IN)),
    C.REDUCE_SCATTER: ((0, _OUT), (1, _IN)),
    C.REDUCE_SCATTER_TENSOR: ((0, _OUT), (1, _IN)),
    C.ALL_TO_ALL: ((0, _OUT), (1, _IN)),
    C.ALL_TO_ALL_SINGLE: ((0, _OUT), (1, _IN)),
    C.ALL_TO_ALL_SINGLE_UNEVEN: ((0, _OUT), (1, _IN)),
    C.GATHER: ((0, _IN), (1, _OUT)),
    C.SCATTER: ((0, _OUT), (1, _IN)),
    C.SEND: ((0, _IN),),
    C.RECV: ((0, _OUT),),
    C.ALL_GATHER_INTO_TENSOR_UNEVEN: ((0, _OUT), (1, _IN)),
    C.REDUCE_SCATTER_TENSOR_UNEVEN: ((0, _OUT), (1, _IN)),
    C.ALL_TO_ALL_V: ((0, _OUT), (1, _IN)),
}
# Logical semantics of reductions over bool, computed on uint8: sum is "or", product is "and".
_BOOL_OPS: Final = {"sum": R.MAX, "product": R.MIN, "min": R.MIN, "max": R.MAX, "bor": R.MAX, "band": R.MIN}


def _with_avg(op: Collective, base: Kernel) -> Kernel:
    idx = _REDOP_ARG[op]
    out_idx = 0

    def kernel(ctx: Any, *public: Any) -> Any:
        args = list(public)
        args[idx] = R.SUM
        a = args[-1]
        target = args[out_idx]
        is_root = op is not C.REDUCE or args[1] == ctx.ranks[ctx.rank]
        work = base(ctx, *args)

        def divide() -> None:
            if not is_root:
                return
            if target.is_floating_point():
                target.div_(ctx.size)
            else:
                target.copy_(torch.div(target, ctx.size, rounding_mode="trunc"))

        return finish(work, a, divide)

    return kernel


def _with_cast(op: Collective, base: Kernel, src: torch.dtype, dst: torch.dtype) -> Kernel:
    reducing = op in _REDOP_ARG
    by_view = not reducing and src.itemsize == dst.itemsize
    layout = _TENSOR_ARGS.get(op, ())

    def convert(t: torch.Tensor, role: str) -> torch.Tensor:
        if by_view:
            return t.view(dst)  # aliases t: nothing to copy back
        return torch.empty_like(t, dtype=dst) if role == _OUT else t.to(dst)

    def kernel(ctx: Any, *public: Any) -> Any:
        args = list(public)
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        for idx, role in layout:
            val = args[idx]
            if val is None:
                continue
            if isinstance(val, torch.Tensor):
                new = convert(val, role)
                args[idx] = new
                if role != _IN and not by_view:
                    copies.append((val, new))
            else:
                news = [convert(t, role) for t in val]
                args[idx] = news
                if role != _IN and not by_view:
                    copies.extend(zip(val, news, strict=True))
        if reducing and src == torch.bool:
            name = reduce_op_name(args[_REDOP_ARG[op]])
            if name not in _BOOL_OPS:
                raise UnsupportedCollective(op.value, ctx.table.backend, f"reduce op {name!r} over bool")
            args[_REDOP_ARG[op]] = _BOOL_OPS[name]
        work = base(ctx, *args)

        def copy_back() -> None:
            for orig, new in copies:
                orig.copy_(new)

        return finish(work, args[-1], copy_back)

    return kernel


def build(op: Collective, res: Resolution, native: Kernel | None, op_native: bool, redop: str | None) -> Kernel:
    """Compose the kernel for an emulated resolution (see the module docstring for the layers)."""
    if op_native:
        if native is None:
            raise UnsupportedCollective(op.value, "this backend", "marked native but the plugin has no kernel")
        kernel = native
    else:
        entry = EMULATIONS.get(op, {}).get(res.via)
        if entry is None:
            raise UnsupportedCollective(op.value, "this backend", f"no emulation named {res.via!r}")
        kernel = entry[0]
    if res.avg_via_sum:
        kernel = _with_avg(op, kernel)
    if res.cast is not None:
        # The dtype the caller passes is known only per call: the plan cache is keyed by it, so read it then.
        kernel = _cast_for(op, kernel, res.cast)
    return kernel


def _cast_for(op: Collective, base: Kernel, dst: torch.dtype) -> Kernel:
    cache: dict[torch.dtype, Kernel] = {}
    first = _TENSOR_ARGS[op][0][0]

    def kernel(ctx: Any, *args: Any) -> Any:
        val = args[first]
        src = (val if isinstance(val, torch.Tensor) else val[0]).dtype
        k = cache.get(src)
        if k is None:
            k = cache[src] = _with_cast(op, base, src, dst)
        return k(ctx, *args)

    return kernel


def describe(op: Collective, res: Resolution, dtype: torch.dtype | None = None) -> str:
    """One line for the fallback warning: which emulation, and what it costs (``dtype``: the caller's)."""
    parts = []
    if res.via:
        note = EMULATIONS.get(op, {}).get(res.via, (None, ""))[1]
        parts.append(f"via {res.via} ({note})" if note else f"via {res.via}")
    if res.avg_via_sum:
        parts.append("avg as sum then a local divide (no extra traffic)")
    if res.cast is not None:
        to = str(res.cast).removeprefix("torch.")
        if dtype is None:
            parts.append(f"dtype cast to {to}")
        else:
            ratio = res.cast.itemsize / dtype.itemsize
            wire = "the same bytes on the wire" if ratio == 1 else f"{ratio:g}x the bytes on the wire"
            local = "a free view" if op not in _REDOP_ARG and ratio == 1 else "a local copy each way"
            parts.append(f"{str(dtype).removeprefix('torch.')} cast to {to} ({wire}, {local})")
    return "; ".join(parts) or res.reason
