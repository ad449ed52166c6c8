"""Emulations: collectives composed of what a backend does have.

An emulation is a kernel, ``fn(st, call, *kernel_args, async_op)`` with the group state and a ``call(spec,
kernel_args)`` that runs a building block on the same group. Building blocks are dispatched like any collective,
so on a backend that lacks one too, it is emulated in turn (list all_to_all -> uneven all_to_all_single -> padded
even all_to_all_single on SCCL); ``call`` is handed in by dispatch, so this module never imports it.

:func:`build` composes the kernel for an emulated resolution, innermost first:

1. the op itself: the native kernel, or the table entry's ``via`` composition;
2. ``avg`` as ``sum`` then a divide, where the kernel lacks AVG (``_layers``);
3. a dtype cast where the kernel lacks the dtype (``_layers``);
4. complex tensors viewed as real ones (``_layers``), as torch.distributed does.

Traffic notes (``EMULATIONS``) feed the once-per-op warning so users see what emulation costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import torch
import torch.distributed as dist

from ..errors import UnsupportedCollective
from ..plugin._capabilities import Collective, Level, Resolution, reduce_op_name
from ..plugin._work import finish
from . import _layers
from . import _specs as S

__all__ = ["EMULATIONS", "build", "describe", "local_reduce"]

C = Collective
R = dist.ReduceOp
Kernel = Callable[..., Any]
Call = Callable[[S.Spec, Sequence[Any]], Any]


# ------------------------------------------------------------------------------------------------ local reduce

_LOCAL: Final[dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def local_reduce(stack: torch.Tensor, op: Any, out: torch.Tensor) -> None:
    """Reduce ``stack`` (ranks along dim 0) with ``op`` (a ``ReduceOp`` or its name) into ``out``, in rank order."""
    name = reduce_op_name(op)
    n = stack.shape[0]
    if name in ("sum", "avg", "premul_sum"):
        # Accumulate in rank order, as a ring does, so float results match the native kernel's up to rounding.
        acc = stack[0].clone()
        for i in range(1, n):
            acc.add_(stack[i])
        if name == "avg":
            acc = acc.div_(n) if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
        elif name == "premul_sum":
            acc.mul_(op.factor)
        out.copy_(acc.view_as(out))
        return
    fn = _LOCAL.get(name)
    if fn is None:
        raise UnsupportedCollective("local reduction", "xccl emulation", f"reduce op {name!r} cannot be emulated")
    out.copy_(functools.reduce(fn, list(stack)).view_as(out))


# ---------------------------------------------------------------------------------------------- compositions


def _rs_tensor_via_all_to_all(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, op: Any, a: bool) -> Any:
    """reduce_scatter_tensor = all_to_all_single + local reduction: each rank receives only its own chunk from
    every peer, (n-1)/n of the input, exactly what a ring reduce_scatter moves."""
    received = torch.empty_like(inp).view(-1)
    call(S.ALL_TO_ALL_SINGLE, (received, inp.view(-1), None, None))
    local_reduce(received.view(st.size, -1), op, out.view(-1))
    return finish(None, a)


def _rs_tensor_via_all_reduce(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, op: Any, a: bool) -> Any:
    """reduce_scatter_tensor = all_reduce + slice: moves twice a ring reduce_scatter's bytes; the last resort."""
    tmp = inp.clone()
    call(S.ALL_REDUCE, (tmp, op))
    out.view(-1).copy_(tmp.view(st.size, -1)[st.rank])
    return finish(None, a)


def _rs_list_via_tensor(st: Any, call: Call, out: torch.Tensor, ins: Sequence[torch.Tensor], op: Any, a: bool) -> Any:
    flat = torch.cat([t.reshape(-1) for t in ins])
    res = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
    call(S.REDUCE_SCATTER_TENSOR, (res, flat, op))
    out.copy_(res.view_as(out))
    return finish(None, a)


def _all_to_all_via_single(
    st: Any, call: Call, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], a: bool
) -> Any:
    isz, osz = [t.numel() for t in ins], [t.numel() for t in outs]
    flat_in = torch.cat([t.reshape(-1) for t in ins])
    flat_out = torch.empty(sum(osz), dtype=flat_in.dtype, device=flat_in.device)
    # Always pass the sizes: this rank's own sizes being uniform says nothing about its peers' (see _specs), and
    # the even and uneven kernels may differ, so the choice must not be made locally.
    call(S.ALL_TO_ALL_SINGLE, (flat_out, flat_in, osz, isz))
    for o, chunk in zip(outs, torch.split(flat_out, osz), strict=True):
        o.copy_(chunk.view_as(o))
    return finish(None, a)


def _a2a_uneven_via_padding(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, osz: list[int] | None, isz: list[int] | None, a: bool
) -> Any:
    """Uneven all_to_all_single on a backend that only does even splits: agree on the largest chunk (one small
    all_reduce), pad every chunk to it, exchange evenly, unpad."""
    n, trail = st.size, inp.shape[1:]
    isz = isz or [inp.shape[0] // n] * n
    osz = osz or [out.shape[0] // n] * n
    biggest = torch.tensor([max(isz + osz)], dtype=torch.int64, device=inp.device)
    call(S.ALL_REDUCE, (biggest, R.MAX))
    m = int(biggest.item())
    pad_in = inp.new_zeros((n * m, *trail))
    for j, chunk in enumerate(torch.split(inp, isz)):
        pad_in[j * m : j * m + isz[j]].copy_(chunk)
    pad_out = out.new_empty((n * m, *trail))
    call(S.ALL_TO_ALL_SINGLE, (pad_out, pad_in, None, None))
    offset = 0
    for j in range(n):
        out[offset : offset + osz[j]].copy_(pad_out[j * m : j * m + osz[j]])
        offset += osz[j]
    return finish(None, a)


def _ag_uneven_via_padding(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], a: bool) -> Any:
    n, m, trail = st.size, max(sizes), inp.shape[1:]
    pad_in = inp.new_zeros((m, *trail))
    pad_in[: sizes[st.rank]].copy_(inp)
    pad_out = out.new_empty((n * m, *trail))
    call(S.ALL_GATHER_INTO_TENSOR, (pad_out, pad_in))
    offset = 0
    for j in range(n):
        out[offset : offset + sizes[j]].copy_(pad_out[j * m : j * m + sizes[j]])
        offset += sizes[j]
    return finish(None, a)


def _rs_uneven_via_padding(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, sizes: list[int], op: Any, a: bool
) -> Any:
    # Padding rows are reduced too, then dropped: their value never matters, whatever the reduce op.
    n, m, trail = st.size, max(sizes), inp.shape[1:]
    pad_in = inp.new_zeros((n * m, *trail))
    for j, chunk in enumerate(torch.split(inp, sizes)):
        pad_in[j * m : j * m + sizes[j]].copy_(chunk)
    pad_out = out.new_empty((m, *trail))
    call(S.REDUCE_SCATTER_TENSOR, (pad_out, pad_in, op))
    out.copy_(pad_out[: sizes[st.rank]])
    return finish(None, a)


def _a2av_via_single(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, matrix: list[list[int]], a: bool
) -> Any:
    # The matrix is the same on every rank, so "every count equal" is a global fact and may pick the even kernel.
    if len({c for row in matrix for c in row}) == 1:
        call(S.ALL_TO_ALL_SINGLE, (out.view(-1), inp.view(-1), None, None))
    else:
        osz = [row[st.rank] for row in matrix]
        call(S.ALL_TO_ALL_SINGLE, (out.view(-1), inp.view(-1), osz, list(matrix[st.rank])))
    return finish(None, a)


def _ar_coalesced_via_all_reduce(st: Any, call: Call, ts: Sequence[torch.Tensor], op: Any, a: bool) -> Any:
    """One all_reduce per dtype over the tensors flattened into one buffer (every rank groups them alike)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in ts:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        call(S.ALL_REDUCE, (flat, op))
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    return finish(None, a)


def _ag_coalesced_via_all_gather(
    st: Any, call: Call, outs: Sequence[Sequence[torch.Tensor]], ins: Sequence[torch.Tensor], a: bool
) -> Any:
    for i, t in enumerate(ins):
        call(S.ALL_GATHER, ([row[i] for row in outs], t))
    return finish(None, a)


def _gather_via_all_gather(
    st: Any, call: Call, t: torch.Tensor, lst: Sequence[torch.Tensor] | None, root: int, a: bool
) -> Any:
    """gather = all_gather_into_tensor, kept on the root: what torch_npu's replacement of gather does (every rank
    receives the whole gathered data, world-size times the bytes of a true gather)."""
    buf = t.new_empty((st.size, *t.shape))
    call(S.ALL_GATHER_INTO_TENSOR, (buf, t))
    if lst is not None:
        for r, dst in enumerate(lst):
            dst.copy_(buf[r])
    return finish(None, a)


def _send_via_host(st: Any, call: Call, t: torch.Tensor, peer: int, tag: int, a: bool) -> Any:
    """Point-to-point through the group's host-side gloo group (same ranks), staging through host memory."""
    host = t.detach().cpu()
    return finish(st.side_group().send([host], peer, tag), a)


def _recv_via_host(st: Any, call: Call, t: torch.Tensor, peer: int | None, tag: int, a: bool) -> Any:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    side = st.side_group()
    work = side.recv([host], peer, tag) if peer is not None else side.recv_anysource([host], tag)
    # Any-source receives always hand back the work: the caller reads the sender from it.
    return finish(work, a or peer is None, partial(t.copy_, host))


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
    C.ALL_REDUCE_COALESCED: {
        "all_reduce": (_ar_coalesced_via_all_reduce, "the tensors flattened into one buffer per dtype, one "
                       "all_reduce each, copied back"),
    },
    C.ALL_GATHER_COALESCED: {
        "all_gather": (_ag_coalesced_via_all_gather, "one all_gather per input tensor"),
    },
    C.GATHER: {
        "all_gather": (_gather_via_all_gather, "an all_gather kept on the root: every rank receives the whole "
                       "gathered data (world size x the bytes of a gather)"),
    },
    C.SEND: {"host_gloo": (_send_via_host, "staged through host memory over a gloo group")},
    C.RECV: {"host_gloo": (_recv_via_host, "staged through host memory over a gloo group")},
    C.RECV_ANY_SOURCE: {"host_gloo": (_recv_via_host, "staged through host memory over a gloo group")},
}

def build(st: Any, op: Collective, res: Resolution, native: Kernel | None, call: Call) -> Kernel:
    """Compose the kernel for an emulated (or complex-viewed) resolution; see the module docstring for the layers.

    Args:
        st: the group state the kernel runs on.
        op: the capability key.
        res: the table's resolution for this call shape.
        native: the op's native kernel, when there is one.
        call: runs a building block on ``st`` (dispatch's ``run``, bound).
    """
    spec = S.SPECS[op]
    if st.table.entry(op).level is Level.NATIVE:
        if native is None:
            raise UnsupportedCollective(op.value, st.backend, "marked native but the plugin has no kernel")
        kernel = native
    else:
        entry = EMULATIONS.get(op, {}).get(res.via)
        if entry is None:
            raise UnsupportedCollective(op.value, st.backend, f"no emulation named {res.via!r}")
        kernel = partial(entry[0], st, call)
    return _layers.wrap(spec, st, res, kernel)


def describe(op: Collective, res: Resolution, dtype: torch.dtype | None = None) -> str:
    """One line for the fallback warning: which emulation, and what it costs (``dtype``: the caller's)."""
    parts = []
    if res.via:
        note = EMULATIONS.get(op, {}).get(res.via, (None, ""))[1]
        parts.append(f"via {res.via} ({note})" if note else f"via {res.via}")
    parts += _layers.describe(S.SPECS[op], res, dtype)
    return "; ".join(parts) or res.reason
