"""The standard collectives, as in ``torch.distributed``.

Common to every function:

* ``group``: a process group (``None``: the world). Roots and peers are *global* ranks unless given as
  ``group_src`` / ``group_dst`` (ranks within ``group``).
* ``async_op``: return a work handle to ``wait()`` on instead of waiting; its ``wait()`` raises typed faults.
* Errors, raised before any rank communicates where every rank can see the problem:
  :class:`~xccl.InvalidArgument` (type, device, contiguity, dtype, shape, ranks),
  :class:`~xccl.UnsupportedCollective` (the backend cannot run the call, natively or emulated under the fallback
  policy); while or after communicating: :class:`~xccl.PeerFailure` (a peer died), :class:`~xccl.CollectiveTimeout`
  (a peer is silent), :class:`~xccl.CollectiveMismatch` (with the mismatch detector on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ..collectives._dispatch import all_reduce as _all_reduce
from ..collectives._dispatch import dispatch
from ..graph import _forms as G
from ..ops import _specs as S

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
]

SUM: Final = dist.ReduceOp.SUM
# While torch.compile traces, every public collective hands over to its graph form; bound once here so that the
# eager path pays one call (~60 ns) for the check.
_compiling: Final = torch.compiler.is_compiling


def _run(spec: S.Spec, group: Any, async_op: bool, *args: Any) -> Any:
    """``spec``'s graph form while torch.compile traces (``xccl.graph._forms.run``), else its eager dispatch.

    The collectives training calls most (all_reduce, all_gather_single, reduce_scatter_tensor, all_to_all_single,
    broadcast) write this out, a Python call less each: on a GPU a small collective's launch is about fifteen
    microseconds, and each call on its path shows.
    """
    return (G.run if _compiling() else dispatch)(spec, group, async_op, *args)


def all_reduce(tensor: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
    """Reduce ``tensor`` across the group, in place (``torch.distributed.all_reduce``).

    Args:
        tensor: input and output, contiguous, on the group's device.
        op: a ``torch.distributed.ReduceOp`` (``SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``, the bitwise ops,
            ``premul_sum``), as the backend's table allows; complex tensors take ``SUM``, ``AVG`` and
            ``premul_sum``.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: not a contiguous tensor on the group's device.
        UnsupportedCollective: the backend cannot reduce this dtype with this op.

    Example::

        t = torch.ones(4) * (xccl.get_world().rank + 1)
        xccl.all_reduce(t)                       # every rank: 1 + 2 + ... + world_size
    """
    if _compiling():
        return G.run(S.ALL_REDUCE, group, async_op, tensor, op)
    return _all_reduce(tensor, op, group, async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Gather ``tensor`` from every rank into ``tensor_list`` (``torch.distributed.all_gather``).

    Args:
        tensor_list: one output tensor per rank of the group, in group-rank order, each of ``tensor``'s dtype;
            entry ``rank`` has ``tensor``'s shape (the backend's table says whether the others may differ).
        tensor: this rank's contribution.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: wrong list length, dtypes or shape.

    Example::

        outs = [torch.empty(2) for _ in range(xccl.get_world().world_size)]
        xccl.all_gather(outs, torch.full((2,), float(xccl.get_world().rank)))
    """
    return _run(S.ALL_GATHER, group, async_op, tensor_list, tensor)


def all_gather_single(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Gather every rank's ``input_tensor`` into ``output_tensor``, along dim 0 or stacked
    (``torch.distributed.all_gather_single``, torch 2.13's name; ``all_gather_into_tensor`` is the same function).

    Args:
        output_tensor: ``world_size`` times ``input_tensor``'s elements, same dtype.
        input_tensor: this rank's contribution.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: dtypes differ or the output has the wrong number of elements.

    Example::

        out = torch.empty(2 * world_size)
        xccl.all_gather_single(out, torch.ones(2))
    """
    if _compiling():
        return G.run(S.ALL_GATHER_INTO_TENSOR, group, async_op, output_tensor, input_tensor)
    return dispatch(S.ALL_GATHER_INTO_TENSOR, group, async_op, output_tensor, input_tensor)


#: torch's older name (deprecated by torch 2.13, which warns on every call): the same function, without a warning.
all_gather_into_tensor: Final = all_gather_single


def reduce_scatter(
    output: torch.Tensor, input_list: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``input_list[i]`` across ranks into ``output`` on rank ``i`` (``torch.distributed.reduce_scatter``).

    Args:
        output: this rank's result.
        input_list: one tensor per rank of the group, each of ``output``'s shape and dtype.
        op: the reduce op.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: wrong list length, shapes or dtypes.
        UnsupportedCollective: no reduce_scatter and no emulation for it (e.g. under ``fallback="error"``).

    Example::

        out = torch.empty(2)
        xccl.reduce_scatter(out, [torch.ones(2) for _ in range(world_size)])   # out == world_size
    """
    return _run(S.REDUCE_SCATTER, group, async_op, output, input_list, op)


def reduce_scatter_single(
    output: torch.Tensor, input: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``input`` across ranks and scatter equal dim-0 chunks of the result into ``output``
    (``torch.distributed.reduce_scatter_single``, torch 2.13's name; ``reduce_scatter_tensor`` is the same function).

    Args:
        output: this rank's chunk of the reduced tensor.
        input: ``world_size`` times ``output``'s elements, same dtype.
        op: the reduce op.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: dtypes differ or the input has the wrong number of elements.
        UnsupportedCollective: the backend has no reduce_scatter and emulation is refused.

    Example::

        out = torch.empty(2)
        xccl.reduce_scatter_single(out, torch.arange(2.0 * world_size))   # emulated on Sophgo SCCL
    """
    if _compiling():
        return G.run(S.REDUCE_SCATTER_TENSOR, group, async_op, output, input, op)
    return dispatch(S.REDUCE_SCATTER_TENSOR, group, async_op, output, input, op)


#: torch's older name (deprecated by torch 2.13, which warns on every call): the same function, without a warning.
reduce_scatter_tensor: Final = reduce_scatter_single


def all_to_all(
    output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor], group: Any = None, async_op: bool = False
) -> Any:
    """Send ``input_tensor_list[j]`` to rank ``j``; receive rank ``j``'s into ``output_tensor_list[j]``.

    Args:
        output_tensor_list: one tensor per rank of the group.
        input_tensor_list: one tensor per rank of the group, all of one dtype.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: wrong list lengths, mixed dtypes, or this rank's own pair differs in size.

    Example::

        ins = [torch.full((1,), float(rank)) for _ in range(world_size)]
        outs = [torch.empty(1) for _ in range(world_size)]
        xccl.all_to_all(outs, ins)                # outs[j] == j
    """
    return _run(S.ALL_TO_ALL, group, async_op, output_tensor_list, input_tensor_list)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Split ``input`` along dim 0, send chunk ``j`` to rank ``j``, concatenate what arrives into ``output``.

    Args:
        output: what every rank sends to this one, concatenated in rank order.
        input: what this rank sends, chunk ``j`` to rank ``j``.
        output_split_sizes: rows received from each rank (``None``: even splits).
        input_split_sizes: rows sent to each rank (``None``: even splits).
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: split sizes of the wrong length, negative, not integers, not summing to dim 0; or no
            split sizes and dim 0 not divisible by the group size.

    .. note:: Passing split sizes selects the uneven collective on every backend (emulated by padding where the
       vendor ignores split sizes, as SCCL does), even when they happen to be equal: every rank must decide the
       same way, and a rank cannot see whether its peers' sizes are even.

    Example::

        out = torch.empty(world_size)
        xccl.all_to_all_single(out, torch.arange(float(world_size)))
    """
    if _compiling():
        return G.run(S.ALL_TO_ALL_SINGLE, group, async_op, output, input, output_split_sizes, input_split_sizes)
    return dispatch(S.ALL_TO_ALL_SINGLE, group, async_op, output, input, output_split_sizes, input_split_sizes)


def broadcast(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False, group_src: int | None = None
) -> Any:
    """Copy ``tensor`` from rank ``src`` to every rank of the group (``torch.distributed.broadcast``).

    Args:
        tensor: the data on ``src``; overwritten elsewhere.
        src: the source's global rank (or ``group_src``).
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.
        group_src: the source's rank within ``group``.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: both or neither of ``src`` and ``group_src``, or the source is not a member.

    Example::

        xccl.broadcast(weights, src=0)
    """
    if _compiling():
        return G.run(S.BROADCAST, group, async_op, tensor, src, group_src)
    return dispatch(S.BROADCAST, group, async_op, tensor, src, group_src)


def reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Reduce ``tensor`` across the group into rank ``dst`` (``torch.distributed.reduce``).

    Args:
        tensor: input everywhere; the result on ``dst`` (other ranks' contents are unspecified afterwards).
        dst: the destination's global rank (or ``group_dst``).
        op: the reduce op.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.
        group_dst: the destination's rank within ``group``.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: both or neither of ``dst`` and ``group_dst``, or the destination is not a member.
        UnsupportedCollective: the backend cannot reduce this dtype with this op.

    Example::

        xccl.reduce(loss_sum, dst=0)
    """
    return _run(S.REDUCE, group, async_op, tensor, dst, op, group_dst)


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Gather ``tensor`` from every rank into ``gather_list`` on rank ``dst`` (``torch.distributed.gather``).

    Args:
        tensor: this rank's contribution.
        gather_list: on ``dst``, one tensor per rank of ``tensor``'s shape and dtype; elsewhere None or empty.
        dst: the destination's global rank (default global rank 0, as torch), or ``group_dst``.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.
        group_dst: the destination's rank within ``group``.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: a list on a rank other than ``dst``, or a wrong list on ``dst``.

    Example::

        lst = [torch.empty(2) for _ in range(world_size)] if rank == 0 else None
        xccl.gather(torch.ones(2), lst, dst=0)
    """
    return _run(S.GATHER, group, async_op, tensor, gather_list, dst, group_dst)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """Scatter ``scatter_list[i]`` from rank ``src`` into ``tensor`` on rank ``i`` (``torch.distributed.scatter``).

    Args:
        tensor: this rank's output.
        scatter_list: on ``src``, one tensor per rank of ``tensor``'s shape and dtype; elsewhere None or empty.
        src: the source's global rank (default global rank 0, as torch), or ``group_src``.
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.
        group_src: the source's rank within ``group``.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        InvalidArgument: a list on a rank other than ``src``, or a wrong list on ``src``.

    Example::

        out = torch.empty(2)
        xccl.scatter(out, [torch.full((2,), float(i)) for i in range(world_size)] if rank == 0 else None, src=0)
    """
    return _run(S.SCATTER, group, async_op, tensor, scatter_list, src, group_src)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> Any:
    """Block until every rank of the group reaches the barrier (``torch.distributed.barrier``).

    Args:
        group: the process group (``None``: the world).
        async_op: return a work handle instead of waiting.
        device_ids: accepted for torch.distributed's signature; unused (xccl's group knows its device).
        timeout: a ``datetime.timedelta`` bounding this barrier's wait in eager mode, where it is shorter than the
            collective timeout (``xccl.init(timeout=...)``); an asynchronous barrier's handle takes it in
            ``wait(timeout)``. A compiled barrier waits as the graph runs, under the collective timeout.

    Returns:
        A work handle when ``async_op``, else None.

    Raises:
        CollectiveTimeout: a rank did not arrive within ``timeout`` (or the collective timeout).
        PeerFailure: a rank died before arriving.

    Example::

        xccl.barrier()
    """
    if _compiling() or timeout is None or async_op:
        return _run(S.BARRIER, group, async_op)
    dispatch(S.BARRIER, group, True).wait(timeout)
    return None


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not reach it within ``timeout``
    (``torch.distributed.monitored_barrier``, on every backend: torch's is gloo-only).

    Group rank 0 waits for every other rank within ``timeout``; the others wait for rank 0's answer (bounded by
    the group's timeout). Rank 0 then tells every rank which ranks were late, so each rank that arrived raises
    naming them (torch's gloo leaves those waiting out the group's timeout). Costs one small point-to-point
    message per rank each way: a debugging aid, not a hot-path barrier.

    Args:
        group: the process group (``None``: the world).
        timeout: a ``datetime.timedelta`` (``None``: the collective timeout, ``xccl.init(timeout=...)``); a float
            is taken as seconds, with torch's warning.
        wait_all_ranks: name every late rank (after waiting ``timeout`` for each), instead of failing at the
            first one.

    Raises:
        CollectiveTimeout: some rank did not arrive in time; its ``ranks`` are the late global ranks and its
            message has torch's ("Rank 1 failed to pass monitoredBarrier in 1000 ms").
        InvalidArgumentType: ``timeout`` is not a ``timedelta`` (a ``TypeError``, as torch's).

    Example::

        xccl.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    """
    _run(S.MONITORED_BARRIER, group, False, timeout, wait_all_ranks)
