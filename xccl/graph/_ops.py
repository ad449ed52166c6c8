"""xccl's own graph ops: ``torch.ops.xccl.*``, for what ``torch.ops._c10d_functional`` lacks.

Every op is functional (new tensors out, inputs untouched), names its group by the c10d group name (a string,
never a process-group object), numbers roots and peers by *group* rank, and has a fake implementation so that
Dynamo, AOTAutograd and Inductor can trace it without communicating.

Order: every op takes the group's order token and returns the next one. The graph path reads the token before
the op and writes the op's new token back, so that successive xccl ops of a group form a chain of data
dependencies in program order. No backend (Inductor's peak-memory reordering included) can move one past
another, which is what keeps rank-asymmetric graphs (send on one rank, recv on its peer) from deadlocking.

At run time each op dispatches like an eager call (``xccl.collectives._dispatch.dispatch``), so the plugin's
native kernel, the emulations and the fallback policy apply exactly as in eager mode. The ops are opaque to graph compilers; a vendor maps them to its
own graph ops through a converter (``Runtime.graph_converters``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed.distributed_c10d as c10d
from torch.library import custom_op

from ..collectives._dispatch import dispatch
from ..ops import _specs as S
from ..plugin._capabilities import reduce_op_of
from ._state import GRAPH

__all__ = ["OPS", "graph_ops"]

NS: Final = "xccl"


def _pg(name: str) -> Any:
    return c10d._resolve_process_group(name)  # type: ignore[arg-type]


def _next(token: torch.Tensor) -> torch.Tensor:
    return token.clone()


def _fake_next(token: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(token)


# ------------------------------------------------------------------------------- forms of the standard ops
# Used where the capability table says the op is emulated in graph mode: the op then runs through xccl's eager
# dispatch, which applies the same emulation as eager mode.


@custom_op(f"{NS}::all_reduce", mutates_args=())
def all_reduce(input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = input.clone()
    dispatch(S.ALL_REDUCE, _pg(group_name), False, out, reduce_op_of(reduce_op))
    return out, _next(token)


@all_reduce.register_fake
def _(input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), _fake_next(token)


@custom_op(f"{NS}::all_gather_into_tensor", mutates_args=())
def all_gather_into_tensor(input: torch.Tensor, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _pg(group_name)
    out = input.new_empty(_gathered_shape(input, pg.size()))
    dispatch(S.ALL_GATHER_INTO_TENSOR, pg, False, out, input.contiguous())
    return out, _next(token)


def _gathered_shape(input: torch.Tensor, n: int) -> list[Any]:
    return [n] if input.dim() == 0 else [input.shape[0] * n, *input.shape[1:]]


@all_gather_into_tensor.register_fake
def _(input: torch.Tensor, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return input.new_empty(_gathered_shape(input, _pg(group_name).size())), _fake_next(token)


@custom_op(f"{NS}::reduce_scatter_tensor", mutates_args=())
def reduce_scatter_tensor(
    input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _pg(group_name)
    out = input.new_empty([input.shape[0] // pg.size(), *input.shape[1:]])
    dispatch(S.REDUCE_SCATTER_TENSOR, pg, False, out, input.contiguous(), reduce_op_of(reduce_op))
    return out, _next(token)


@reduce_scatter_tensor.register_fake
def _(input: torch.Tensor, reduce_op: str, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return input.new_empty([input.shape[0] // _pg(group_name).size(), *input.shape[1:]]), _fake_next(token)


@custom_op(f"{NS}::all_to_all_single", mutates_args=())
def all_to_all_single(
    input: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], group_name: str,
    token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    out = input.new_empty([sum(output_split_sizes), *input.shape[1:]])
    dispatch(S.ALL_TO_ALL_SINGLE, _pg(group_name), False, out, input.contiguous(), list(output_split_sizes),
             list(input_split_sizes))
    return out, _next(token)


@all_to_all_single.register_fake
def _(
    input: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], group_name: str,
    token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return input.new_empty([sum(output_split_sizes), *input.shape[1:]]), _fake_next(token)


@custom_op(f"{NS}::broadcast", mutates_args=())
def broadcast(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _pg(group_name)
    out = input.clone()
    dispatch(S.BROADCAST, pg, False, out, None, src)
    return out, _next(token)


@broadcast.register_fake
def _(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), _fake_next(token)


# ------------------------------------------------------------------------ ops torch has no functional form of


@custom_op(f"{NS}::reduce", mutates_args=())
def reduce(input: torch.Tensor, dst: int, reduce_op: str, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce to group rank ``dst``; returns this rank's buffer after the reduce (as eager leaves it)."""
    pg = _pg(group_name)
    out = input.clone()
    dispatch(S.REDUCE, pg, False, out, None, reduce_op_of(reduce_op), dst)
    return out, _next(token)


@reduce.register_fake
def _(input: torch.Tensor, dst: int, reduce_op: str, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), _fake_next(token)


@custom_op(f"{NS}::gather", mutates_args=())
def gather(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Gather to group rank ``dst``: one tensor per member there, an empty list elsewhere."""
    pg = _pg(group_name)
    outs = [torch.empty_like(input) for _ in range(pg.size())] if pg.rank() == dst else None
    dispatch(S.GATHER, pg, False, input.contiguous(), outs, None, dst)
    return outs or [], _next(token)


@gather.register_fake
def _(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    pg = _pg(group_name)
    n = pg.size() if pg.rank() == dst else 0
    return [torch.empty_like(input) for _ in range(n)], _fake_next(token)


@custom_op(f"{NS}::scatter", mutates_args=())
def scatter(
    input: torch.Tensor, scatter_list: Sequence[torch.Tensor], src: int, group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter from group rank ``src`` (whose ``scatter_list`` has one tensor per member); ``input`` gives the shape."""
    pg = _pg(group_name)
    out = torch.empty_like(input)
    lst = [t.contiguous() for t in scatter_list] if pg.rank() == src else None
    dispatch(S.SCATTER, pg, False, out, lst, None, src)
    return out, _next(token)


@scatter.register_fake
def _(
    input: torch.Tensor, scatter_list: Sequence[torch.Tensor], src: int, group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), _fake_next(token)


@custom_op(f"{NS}::barrier", mutates_args=())
def barrier(group_name: str, token: torch.Tensor) -> torch.Tensor:
    dispatch(S.BARRIER, _pg(group_name), False)
    return _next(token)


@barrier.register_fake
def _(group_name: str, token: torch.Tensor) -> torch.Tensor:
    return _fake_next(token)


@custom_op(f"{NS}::send", mutates_args=())
def send(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> torch.Tensor:
    """Send to group rank ``dst``; returns only the next token."""
    pg = _pg(group_name)
    dispatch(S.SEND, pg, False, input.contiguous(), None, 0, dst)
    return _next(token)


@send.register_fake
def _(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> torch.Tensor:
    return _fake_next(token)


@custom_op(f"{NS}::recv", mutates_args=())
def recv(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Receive from group rank ``src`` a tensor shaped like ``input`` (whose values are not read)."""
    pg = _pg(group_name)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    dispatch(S.RECV, pg, False, out, None, 0, src)
    return out, _next(token)


@recv.register_fake
def _(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input, memory_format=torch.contiguous_format), _fake_next(token)


@custom_op(f"{NS}::isend", mutates_args=())
def isend(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> torch.Tensor:
    """Start sending to group rank ``dst``; ``xccl.wait`` on the group completes it.

    Sends from a private copy: once this op returns, a compiler may reuse ``input``'s memory (Inductor did, for
    the next buffer it needed) while the send is still in flight.
    """
    pg = _pg(group_name)
    GRAPH.pending.setdefault(group_name, []).append(
        dispatch(S.ISEND, pg, True, input.contiguous().clone(), None, 0, dst)
    )
    return _next(token)


@isend.register_fake
def _(input: torch.Tensor, dst: int, group_name: str, token: torch.Tensor) -> torch.Tensor:
    return _fake_next(token)


@custom_op(f"{NS}::irecv", mutates_args=())
def irecv(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Start receiving from group rank ``src`` into a new tensor, valid once ``xccl.wait`` returns it."""
    pg = _pg(group_name)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    GRAPH.pending.setdefault(group_name, []).append(dispatch(S.IRECV, pg, True, out, None, 0, src))
    return out, _next(token)


@irecv.register_fake
def _(input: torch.Tensor, src: int, group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input, memory_format=torch.contiguous_format), _fake_next(token)


@custom_op(f"{NS}::wait", mutates_args=())
def wait(received: Sequence[torch.Tensor], group_name: str, token: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Complete every pending isend/irecv of the group; returns ``received`` (irecv results) now valid."""
    for work in GRAPH.pending.pop(group_name, []):
        work.wait()
    return [t.clone() for t in received], _next(token)


@wait.register_fake
def _(received: Sequence[torch.Tensor], group_name: str, token: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [torch.empty_like(t) for t in received], _fake_next(token)


@custom_op(f"{NS}::all_gather_into_tensor_uneven", mutates_args=())
def all_gather_into_tensor_uneven(
    input: torch.Tensor, output_split_sizes: Sequence[int], group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    out = input.new_empty([sum(output_split_sizes), *input.shape[1:]])
    dispatch(S.ALL_GATHER_INTO_TENSOR_UNEVEN, _pg(group_name), False, out, input.contiguous(),
             list(output_split_sizes))
    return out, _next(token)


@all_gather_into_tensor_uneven.register_fake
def _(
    input: torch.Tensor, output_split_sizes: Sequence[int], group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return input.new_empty([sum(output_split_sizes), *input.shape[1:]]), _fake_next(token)


@custom_op(f"{NS}::reduce_scatter_tensor_uneven", mutates_args=())
def reduce_scatter_tensor_uneven(
    input: torch.Tensor, input_split_sizes: Sequence[int], reduce_op: str, group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _pg(group_name)
    out = input.new_empty([input_split_sizes[pg.rank()], *input.shape[1:]])
    dispatch(S.REDUCE_SCATTER_TENSOR_UNEVEN, pg, False, out, input.contiguous(), list(input_split_sizes),
             reduce_op_of(reduce_op))
    return out, _next(token)


@reduce_scatter_tensor_uneven.register_fake
def _(
    input: torch.Tensor, input_split_sizes: Sequence[int], reduce_op: str, group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    rank = _pg(group_name).rank()
    return input.new_empty([input_split_sizes[rank], *input.shape[1:]]), _fake_next(token)


@custom_op(f"{NS}::all_to_all_v", mutates_args=())
def all_to_all_v(
    input: torch.Tensor, send_counts: Sequence[int], group_name: str, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-to-all with a count matrix, flattened row-major (``send_counts[i * n + j]``: rank i to rank j)."""
    pg = _pg(group_name)
    n, rank = pg.size(), pg.rank()
    matrix = [list(send_counts[i * n : (i + 1) * n]) for i in range(n)]
    out = input.new_empty([sum(row[rank] for row in matrix)])
    dispatch(S.ALL_TO_ALL_V, pg, False, out, input.contiguous().view(-1), matrix)
    return out, _next(token)


@all_to_all_v.register_fake
def _(input: torch.Tensor, send_counts: Sequence[int], group_name: str, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pg = _pg(group_name)
    n, rank = pg.size(), pg.rank()
    return input.new_empty([sum(send_counts[i * n + rank] for i in range(n))]), _fake_next(token)


@custom_op(f"{NS}::order", mutates_args=())
def order(token: torch.Tensor, after: Sequence[torch.Tensor]) -> torch.Tensor:
    """The next token, once every tensor in ``after`` exists: how a standard ``_c10d_functional`` collective's
    result joins the token chain, so that the group's next xccl op cannot be scheduled before its wait."""
    return _next(token)


@order.register_fake
def _(token: torch.Tensor, after: Sequence[torch.Tensor]) -> torch.Tensor:
    return _fake_next(token)


#: Every op xccl defines, by name (``torch.ops.xccl.<name>``).
OPS: Final = {
    op._name: op._opoverload
    for op in (
        all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast, reduce, gather,
        scatter, barrier, send, recv, all_gather_into_tensor_uneven, reduce_scatter_tensor_uneven, all_to_all_v,
        order, isend, irecv, wait,
    )
}

# Communication must survive dead-code elimination even where a result goes unused.
for _op in OPS.values():
    torch.fx.node.has_side_effect(_op)


def graph_ops() -> Any:
    """``torch.ops.xccl`` with every op xccl defines in it: the graph ops above and the fused ops.

    They are defined on first use (defining them costs more than the rest of xccl's start-up, and eager programs
    never use them), so a plugin whose converters or lowering tables name ``torch.ops.xccl.<op>`` before any graph
    was traced calls this first.
    """
    from ..fused import _ops as _fused  # noqa: F401 - defines torch.ops.xccl.mm_reduce_scatter & co.

    return torch.ops.xccl
