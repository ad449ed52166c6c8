"""c10d kernels: one call of the vendor's own c10d method per collective.

What dispatch runs where a plugin's table says native and the plugin brings no kernel of its own, and what a
plugin's kernel can call after a check of its own (:func:`c10d_kernel`). A kernel is built once per plan and called
as ``kernel(*kernel_args, async_op)``.
It calls the c10d method of the group's *native* object (the vendor's process group, or its c10d ``Backend``)
directly, with the options struct torch's own wrappers would build, so that

* it never re-enters xccl: ``torch.distributed.all_reduce(t, group=xccl_group)`` reaches
  ``XcclProcessGroup.allreduce``, which dispatches here, which calls the vendor's ``allreduce``; calling
  ``torch.distributed`` again from here would loop back into the same override;
* roots and peers are group ranks, as c10d methods take them: the global-to-group translation happened in
  validation (``_specs.member``), once;
* options structs that carry no per-call value are built once per plan and reused: building one costs about a
  microsecond (the ``RedOpType`` -> ``ReduceOp`` conversion), as much as the rest of dispatch. Reusing one is safe
  because backends copy what they need from it when the work is enqueued (``ProcessGroupGloo`` copies the reduce
  op and timeout into the work; the struct is a ``const&`` argument).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from ._capabilities import Collective

__all__ = ["C10D", "C10D_METHODS", "c10d_kernel", "done"]

C = Collective
Kernel = Callable[..., Any]
_RED_OP_TYPE: Final = ReduceOp.RedOpType


#: c10d's collective methods of ``ProcessGroup`` / ``Backend``, by the C++ virtual's name, with the other names
#: Python code and the C++ trampoline call them by: torch 2.13 renamed the single-tensor collectives
#: (``all_gather_single`` for ``_allgather_base``) and the trampoline exposes the coalesced C++ methods under both
#: names (the functional all_gather calls ``allgather_into_tensor_coalesced``, which Python sees as
#: ``all_gather_single_coalesced``). xccl's process group and the simulated vendor group both implement every name.
C10D_METHODS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "allreduce": (),
    "allreduce_coalesced": (),
    "allgather": (),
    "_allgather_base": ("all_gather_single",),
    "allgather_coalesced": (),
    "allgather_into_tensor_coalesced": ("all_gather_single_coalesced",),
    "reduce_scatter": (),
    "_reduce_scatter_base": ("reduce_scatter_single",),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_single_coalesced",),
    "alltoall": (),
    "alltoall_base": ("all_to_all_single",),
    "broadcast": (),
    "reduce": (),
    "gather": (),
    "scatter": (),
    "barrier": (),
    "send": (),
    "recv": (),
    "recv_anysource": (),
})


def done(work: Any, async_op: bool) -> Any:
    """``work`` for an asynchronous call; otherwise wait for it and return None (torch's wrappers do the same)."""
    if async_op:
        return work
    work.wait()
    return None


def _with_op(cls: type, **fixed: Any) -> Callable[[Any], Any]:
    """Options of ``cls`` with ``reduceOp`` set: cached per plain reduce op, built per call for instances
    (``premul_sum`` carries its factor)."""
    cache: dict[Any, Any] = {}

    def options(op: Any) -> Any:
        opts = cache.get(op) if type(op) is _RED_OP_TYPE else None
        if opts is None:
            opts = cls()
            for k, v in fixed.items():
                setattr(opts, k, v)
            opts.reduceOp = op
            if type(op) is _RED_OP_TYPE:
                cache[op] = opts
        return opts

    return options


def _rooted(cls: type, **fixed: Any) -> Callable[[int], Any]:
    """Options of ``cls`` with ``rootRank`` set, cached per root."""
    cache: dict[int, Any] = {}

    def options(root: int) -> Any:
        opts = cache.get(root)
        if opts is None:
            opts = cache[root] = cls()
            opts.rootRank = root
            for k, v in fixed.items():
                setattr(opts, k, v)
        return opts

    return options


def _all_reduce(native: Any) -> Kernel:
    call, options = native.allreduce, _with_op(AllreduceOptions)

    def all_reduce(t: torch.Tensor, op: Any, a: bool) -> Any:
        work = call([t], options(op))
        if a:
            return work
        work.wait()
        return None

    return all_reduce


def _all_reduce_coalesced(native: Any) -> Kernel:
    call, options = native.allreduce_coalesced, _with_op(AllreduceCoalescedOptions)
    return lambda ts, op, a: done(call(list(ts), options(op)), a)


def _all_gather(native: Any) -> Kernel:
    call, opts = native.allgather, AllgatherOptions()
    return lambda outs, t, a: done(call([list(outs)], [t], opts), a)


def _all_gather_coalesced(native: Any) -> Kernel:
    call, opts = native.allgather_coalesced, AllgatherOptions()
    return lambda outs, ins, a: done(call([list(o) for o in outs], list(ins), opts), a)


def _rows_of(big: torch.Tensor, small: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``big`` viewed as ``small``'s rows stacked along dim 0 (a 0-d ``small`` as one row): the layout c10d's
    tensor collectives check chunk by chunk, whatever shape the caller's tensor has (stacked, or flat)."""
    if small.dim() == 0:
        small = small.view(1)
    return big.view(-1, *small.shape[1:]), small


def _all_gather_into_tensor(native: Any) -> Kernel:
    call, opts = native._allgather_base, AllgatherOptions()

    def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor, a: bool) -> Any:
        out, t = _rows_of(out, t)
        return done(call(out, t, opts), a)

    return all_gather_into_tensor


def _reduce_scatter(native: Any) -> Kernel:
    call, options = native.reduce_scatter, _with_op(ReduceScatterOptions)
    return lambda out, ins, op, a: done(call([out], [list(ins)], options(op)), a)


def _reduce_scatter_tensor(native: Any) -> Kernel:
    call, options = native._reduce_scatter_base, _with_op(ReduceScatterOptions)

    def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor, op: Any, a: bool) -> Any:
        t, out = _rows_of(t, out)
        return done(call(out, t, options(op)), a)

    return reduce_scatter_tensor


def _all_to_all(native: Any) -> Kernel:
    call, opts = native.alltoall, AllToAllOptions()
    return lambda outs, ins, a: done(call(list(outs), list(ins), opts), a)


def _all_to_all_single(native: Any) -> Kernel:
    call, opts = native.alltoall_base, AllToAllOptions()
    return lambda out, t, osz, isz, a: done(call(out, t, osz or [], isz or [], opts), a)


def _broadcast(native: Any) -> Kernel:
    call, options = native.broadcast, _rooted(BroadcastOptions, rootTensor=0)
    return lambda t, root, a: done(call([t], options(root)), a)


def _reduce(native: Any) -> Kernel:
    call = native.reduce

    def reduce(t: torch.Tensor, root: int, op: Any, a: bool) -> Any:
        opts = ReduceOptions()
        opts.rootRank, opts.rootTensor, opts.reduceOp = root, 0, op
        return done(call([t], opts), a)

    return reduce


def _gather(native: Any) -> Kernel:
    call, options = native.gather, _rooted(GatherOptions)
    # c10d's gather takes the root's output list wrapped in a list, and an empty list elsewhere.
    return lambda t, lst, root, a: done(call([list(lst)] if lst is not None else [], [t], options(root)), a)


def _scatter(native: Any) -> Kernel:
    call, options = native.scatter, _rooted(ScatterOptions)
    return lambda t, lst, root, a: done(call([t], [list(lst)] if lst is not None else [], options(root)), a)


def _barrier(native: Any) -> Kernel:
    call, opts = native.barrier, BarrierOptions()
    return lambda a: done(call(opts), a)


def _send(native: Any) -> Kernel:
    call = native.send
    return lambda t, peer, tag, a: done(call([t], peer, tag), a)


def _recv(native: Any) -> Kernel:
    call = native.recv
    return lambda t, peer, tag, a: done(call([t], peer, tag), a)


def _recv_any_source(native: Any) -> Kernel:
    call = native.recv_anysource
    # Always the work: the caller reads the sender from it (recv without src returns the sender's rank).
    return lambda t, peer, tag, a: call([t], tag)


#: op -> builder of its c10d kernel from the group's native object.
C10D: Final[dict[Collective, Callable[[Any], Kernel]]] = {
    C.ALL_REDUCE: _all_reduce,
    C.ALL_REDUCE_COALESCED: _all_reduce_coalesced,
    C.ALL_GATHER: _all_gather,
    C.ALL_GATHER_COALESCED: _all_gather_coalesced,
    C.ALL_GATHER_INTO_TENSOR: _all_gather_into_tensor,
    C.REDUCE_SCATTER: _reduce_scatter,
    C.REDUCE_SCATTER_TENSOR: _reduce_scatter_tensor,
    C.ALL_TO_ALL: _all_to_all,
    C.ALL_TO_ALL_SINGLE: _all_to_all_single,
    C.ALL_TO_ALL_SINGLE_UNEVEN: _all_to_all_single,
    C.BROADCAST: _broadcast,
    C.REDUCE: _reduce,
    C.GATHER: _gather,
    C.SCATTER: _scatter,
    C.BARRIER: _barrier,
    C.SEND: _send,
    C.RECV: _recv,
    C.RECV_ANY_SOURCE: _recv_any_source,
}


def c10d_kernel(op: Collective, native: Any) -> Kernel | None:
    """The kernel of ``op`` that calls c10d's method on ``native`` (the vendor's process group or backend), or
    None when c10d has no method for it (the uneven and fused ops: those come from the plugin).

    Example (a plugin kernel that checks a vendor constraint first)::

        def all_gather(ctx, outs, tensor, async_op):
            if len({t.shape for t in outs}) > 1:
                raise ConstraintViolation("all_gather", ctx.plugin, "equal sizes", "...")
            return c10d_kernel(Collective.ALL_GATHER, ctx.native)(outs, tensor, async_op)
    """
    builder = C10D.get(op)
    return None if builder is None else builder(native)
