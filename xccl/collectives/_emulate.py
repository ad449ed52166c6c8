"""Emulations: collectives composed of what a backend does have.

An emulation is a kernel, ``fn(st, call, *kernel_args, async_op)`` with the group state and a ``call(spec,
kernel_args, async_op=False)`` that runs a building block on the same group (``_compose``: scratch buffers, the
host reduction, the last block run asynchronously). Building blocks are dispatched like any collective, so on a
backend that lacks one too, it is emulated in turn (list all_to_all -> uneven all_to_all_single -> padded even
all_to_all_single on SCCL); ``call`` is handed in by dispatch, so this module never imports it. The uneven
collectives' compositions are in ``_uneven``.

A composition runs either where the backend lacks the op (an emulated entry) or where the table prefers it to the
native kernel for this call shape (``Prefer``: it measured faster there; the resolution names it in ``via``).

:func:`build` composes the kernel for an emulated resolution, innermost first:

1. the op itself: the native kernel, or the ``via`` composition;
2. ``avg`` as ``sum`` then a divide, where the kernel lacks AVG (``_layers``);
3. ``premul_sum`` as a local scale of the inputs then ``sum``, where the kernel lacks PREMUL_SUM (``_layers``);
4. a dtype cast where the kernel lacks the dtype (``_layers``);
5. complex tensors viewed as real ones (``_layers``), as torch.distributed does.

A dtype the backend moves but cannot reduce (``Support.dtype_via``: float64 on SCCL and HCCL) takes a composition
at step 1 that gathers the bits and reduces them locally, in rank order: exactly, and alike on every rank.

Each composition is registered against its record (``xccl.ops._emulations``: the building blocks it calls, whether
it reduces on the host, and the traffic note the once-per-op warning shows, so users see what emulation costs).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import torch

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..ops._emulations import BY_KEY, implements, of, unimplemented
from ..plugin._capabilities import Collective, Resolution
from ..plugin._work import Work, finish
from . import _layers, _monitored, _uneven  # noqa: F401 - _monitored and _uneven register their compositions
from ._compose import Call, local_reduce, nothing
from ._compose import last as _last
from ._compose import take as _take

__all__ = ["AGREED_BYTES", "build", "by_size", "composition", "describe", "first_via", "local_reduce", "with_result"]

C = Collective
Kernel = Callable[..., Any]


@implements(C.REDUCE_SCATTER_TENSOR, "all_to_all")
def _rs_tensor_via_all_to_all(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, op: Any, a: bool) -> Any:
    """A tensor reduce-scatter = all_to_all_single + local reduction: each rank receives only its own chunk from
    every peer, (n-1)/n of the input, exactly what a ring reduce_scatter moves."""
    got = _take(st, inp.numel(), inp)
    return _last(call, S.ALL_TO_ALL_SINGLE, (got.tensor, inp.view(-1), None, None), a,
                 lambda: local_reduce(got.tensor.view(st.size, out.numel()), op, out), got)


@implements(C.REDUCE_SCATTER_TENSOR, "all_reduce")
def _rs_tensor_via_all_reduce(st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, op: Any, a: bool) -> Any:
    """A tensor reduce-scatter = all_reduce + slice: moves twice a ring reduce_scatter's bytes; the last resort."""
    tmp = _take(st, inp.numel(), inp)
    tmp.tensor.copy_(inp.view(-1))
    return _last(call, S.ALL_REDUCE, (tmp.tensor, op), a,
                 lambda: out.view(-1).copy_(tmp.tensor.view(st.size, out.numel())[st.rank]), tmp)


@implements(C.REDUCE_SCATTER, C.REDUCE_SCATTER_TENSOR.value)
def _rs_list_via_tensor(st: Any, call: Call, out: torch.Tensor, ins: Sequence[torch.Tensor], op: Any, a: bool) -> Any:
    flat = _take(st, out.numel() * len(ins), out)
    torch.cat([t.reshape(-1) for t in ins], out=flat.tensor)
    return _last(call, S.REDUCE_SCATTER_TENSOR, (out.view(-1), flat.tensor, op), a, nothing, flat)


@implements(C.ALL_TO_ALL, "all_to_all_single")
def _all_to_all_via_single(
    st: Any, call: Call, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], a: bool
) -> Any:
    isz, osz = [t.numel() for t in ins], [t.numel() for t in outs]
    flat_in, flat_out = _take(st, sum(isz), ins[0]), _take(st, sum(osz), ins[0])
    torch.cat([t.reshape(-1) for t in ins], out=flat_in.tensor)

    def copy_out() -> None:
        for o, chunk in zip(outs, torch.split(flat_out.tensor, osz), strict=True):
            o.copy_(chunk.view_as(o))

    # Always pass the sizes: this rank's own sizes being uniform says nothing about its peers' (see _specs), and
    # the even and uneven kernels may differ, so the choice must not be made locally.
    return _last(call, S.ALL_TO_ALL_SINGLE, (flat_out.tensor, flat_in.tensor, osz, isz), a, copy_out, flat_in,
                 flat_out)


@implements(C.ALL_TO_ALL_V, "all_to_all_single")
def _a2av_via_single(
    st: Any, call: Call, out: torch.Tensor, inp: torch.Tensor, matrix: list[list[int]], a: bool
) -> Any:
    # The matrix is the same on every rank, so "every count equal" is a global fact and may pick the even kernel.
    if len({c for row in matrix for c in row}) == 1:
        kargs: tuple[Any, ...] = (out.view(-1), inp.view(-1), None, None)
    else:
        kargs = (out.view(-1), inp.view(-1), [row[st.rank] for row in matrix], list(matrix[st.rank]))
    return finish(call(S.ALL_TO_ALL_SINGLE, kargs, a), a)


@implements(C.ALL_REDUCE_COALESCED, "all_reduce")
def _ar_coalesced_via_all_reduce(st: Any, call: Call, ts: Sequence[torch.Tensor], op: Any, a: bool) -> Any:
    """One all_reduce per dtype over the tensors flattened into one buffer (every rank groups them alike)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in ts:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = _take(st, sum(t.numel() for t in group), group[0])
        torch.cat([t.reshape(-1) for t in group], out=flat.tensor)
        call(S.ALL_REDUCE, (flat.tensor, op))
        for t, chunk in zip(group, torch.split(flat.tensor, [t.numel() for t in group]), strict=True):
            t.copy_(chunk.view_as(t))
        flat.release()
    return finish(None, a)


@implements(C.ALL_GATHER, "all_gather_into_tensor_uneven")
def _ag_via_uneven(st: Any, call: Call, outs: Sequence[torch.Tensor], t: torch.Tensor, a: bool) -> Any:
    """The list all_gather of tensors whose shapes differ per rank (every rank passes the same ``tensor_list``
    shapes): one all_gather_into_tensor_uneven of the flattened tensors, copied out. Where a vendor's list
    all_gather takes equal sizes only (SCCL), this is what its ConstraintViolation falls back to."""
    sizes = [o.numel() for o in outs]
    buf = _take(st, sum(sizes), t)

    def copy_out() -> None:
        for o, chunk in zip(outs, torch.split(buf.tensor, sizes), strict=True):
            o.copy_(chunk.view_as(o))

    return _last(call, S.ALL_GATHER_INTO_TENSOR_UNEVEN, (buf.tensor, t.reshape(-1), sizes), a, copy_out, buf)


@implements(C.ALL_GATHER_COALESCED, "all_gather")
def _ag_coalesced_via_all_gather(
    st: Any, call: Call, outs: Sequence[Sequence[torch.Tensor]], ins: Sequence[torch.Tensor], a: bool
) -> Any:
    for i, t in enumerate(ins):
        call(S.ALL_GATHER, ([row[i] for row in outs], t))
    return finish(None, a)


@implements(C.GATHER, "all_gather")
def _gather_via_all_gather(
    st: Any, call: Call, t: torch.Tensor, lst: Sequence[torch.Tensor] | None, root: int, a: bool
) -> Any:
    """gather = all_gather_into_tensor, kept on the root: what torch_npu's replacement of gather does (every rank
    receives the whole gathered data, world-size times the bytes of a true gather)."""
    buf = _take(st, st.size * t.numel(), t)

    def copy_out() -> None:
        for r, dst in enumerate(lst or ()):
            dst.copy_(buf.tensor.view(st.size, *t.shape)[r])

    return _last(call, S.ALL_GATHER_INTO_TENSOR, (buf.tensor, t.reshape(-1)), a, copy_out, buf)


@implements(C.ALL_REDUCE, "all_gather")
def _ar_via_all_gather(st: Any, call: Call, t: torch.Tensor, op: Any, a: bool) -> Any:
    """all_reduce = all_gather of every rank's bits + a local reduction in rank order: exact and the same on every
    rank, for a dtype the backend moves but cannot reduce (float64 on SCCL and HCCL; the gather moves it as a
    same-width dtype where the backend lacks it, e.g. int64 on SCCL)."""
    buf = _take(st, st.size * t.numel(), t)
    return _last(call, S.ALL_GATHER_INTO_TENSOR, (buf.tensor, t.view(-1)), a,
                 lambda: local_reduce(buf.tensor.view(st.size, t.numel()), op, t), buf)


@implements(C.REDUCE, "all_gather")
def _reduce_via_all_gather(st: Any, call: Call, t: torch.Tensor, root: int, op: Any, a: bool) -> Any:
    """reduce = the all_reduce composition above, kept on the root (the other ranks' tensors are left as they
    were): every rank receives world-size times the bytes, as torch_npu's gather does."""
    buf = _take(st, st.size * t.numel(), t)

    def reduce_on_root() -> None:
        if st.rank == root:
            local_reduce(buf.tensor.view(st.size, t.numel()), op, t)

    return _last(call, S.ALL_GATHER_INTO_TENSOR, (buf.tensor, t.view(-1)), a, reduce_on_root, buf)


@implements(C.SEND, "host_gloo")
def _send_via_host(st: Any, call: Call, t: torch.Tensor, peer: int, tag: int, a: bool) -> Any:
    """Point-to-point through the group's host-side gloo group (same ranks), staging through host memory."""
    host = t.detach().cpu()
    return finish(st.side_group().send([host], peer, tag), a)


@implements(C.RECV, "host_gloo")
@implements(C.RECV_ANY_SOURCE, "host_gloo")
def _recv_via_host(st: Any, call: Call, t: torch.Tensor, peer: int | None, tag: int, a: bool) -> Any:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    side = st.side_group()
    work = side.recv([host], peer, tag) if peer is not None else side.recv_anysource([host], tag)
    # Any-source receives always hand back the work: the caller reads the sender from it.
    return finish(work, a or peer is None, partial(t.copy_, host))


if unimplemented():  # pragma: no cover - a record without its composition is a bug of this module
    raise ImportError(f"emulations without a composition: {[(e.op.value, e.via) for e in unimplemented()]}")


def first_via(op: Collective) -> str | None:
    """The composition a refusing native kernel of ``op`` falls back to (its first emulation), or None."""
    found = of(op)
    return found[0].via if found else None


def build(st: Any, op: Collective, res: Resolution, native: Kernel | None, call: Call) -> Kernel:
    """Compose the kernel for an emulated (or complex-viewed) resolution; see the module docstring for the layers.

    Args:
        st: the group state the kernel runs on.
        op: the capability key.
        res: the table's resolution for this call shape.
        native: the op's native kernel, when there is one.
        call: runs a building block on ``st`` (dispatch's ``run``, bound).
    """
    # The planner's one rule (``xccl.collectives._plan``): ``res.via`` names the composition; empty, the native
    # kernel carries the call.
    if res.via == "":
        if native is None:
            raise UnsupportedCollective(op.value, st.plugin, "marked native but the plugin has no kernel")
        kernel = native
    else:
        kernel = composition(st, op, res.via, call)
    return _layers.wrap(S.SPECS[op], st, res, kernel)


def composition(st: Any, op: Collective, via: str, call: Call) -> Kernel:
    """The composition ``via`` of ``op`` on ``st``, as a kernel (no layers).

    Raises:
        UnsupportedCollective: xccl has no composition of that name.
    """
    record = BY_KEY.get((op, via))
    if record is None:
        raise UnsupportedCollective(op.value, st.plugin, f"no emulation named {via!r}")
    return partial(record.fn, st, call)


def with_result(op: Collective, kernel: Kernel) -> Kernel:
    """``kernel`` whose asynchronous handle holds the op's output tensors (the arguments it writes), as a native
    work's ``result()`` and future do: a DDP communication hook reads the reduced bucket as ``fut.value()[0]``."""
    spec = S.SPECS[op]
    written = tuple(i for i, arg in enumerate(spec.args) if arg.access in (S.Access.WRITE, S.Access.UPDATE))

    def composed(*kargs: Any) -> Any:
        work = kernel(*kargs)
        if type(work) is Work:
            outputs: list[torch.Tensor] = []
            for i in written:
                value = kargs[i]
                if isinstance(value, torch.Tensor):
                    outputs.append(value)
                elif value is not None:
                    outputs.extend(t for ts in value for t in (ts if isinstance(ts, (list, tuple)) else (ts,)))
            work.set_result(outputs)
        return work

    return composed


def describe(op: Collective, res: Resolution, dtype: torch.dtype | None = None) -> str:
    """One line for the fallback warning: which emulation, and what it costs (``dtype``: the caller's)."""
    parts = []
    if res.via:
        record = BY_KEY.get((op, res.via))
        note = "" if record is None else record.note
        parts.append(f"via {res.via} ({note})" if note else f"via {res.via}")
    parts += _layers.describe(S.SPECS[op], res, dtype)
    return "; ".join(parts) or res.reason


# ------------------------------------------------------------------------------------ choosing by agreed size


#: The agreed size of a call (``xccl.plugin.AGREED_SIZE``) from its kernel arguments, in bytes: derived from the
#: specs (``Spec.agreed``), keyed by the even form (an uneven all_to_all_single agrees on no size).
AGREED_BYTES: Final[dict[Collective, Callable[[Sequence[Any]], int]]] = {
    spec.key: spec.agreed_bytes for spec in S.SPECS.values() if spec.agreed
}


def by_size(op: Collective, bounds: Sequence[int], kernels: Sequence[Kernel]) -> Kernel:
    """A kernel that runs ``kernels[i]`` for calls whose agreed size lies in the ``i``-th range cut by ``bounds``
    (sorted sizes in bytes: ``[0, b0)``, ``[b0, b1)``, ... ``[bn, inf)``).

    The size is one every rank of a call passes alike (``AGREED_BYTES``), so every rank picks the same kernel;
    the choice costs a size computation and a few comparisons per call.
    """
    size_of, edges, ks = AGREED_BYTES[op], tuple(bounds), tuple(kernels)

    def kernel(*kargs: Any) -> Any:
        return ks[bisect_right(edges, size_of(kargs))](*kargs)

    return kernel
