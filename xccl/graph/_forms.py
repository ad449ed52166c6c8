"""The graph path of every public collective: what ``xccl.<op>`` does while ``torch.compile`` traces it.

Each function has the public op's signature and eager semantics (the caller's buffers are updated in place, an
``async_op=True`` call returns a handle to ``wait()`` on), but is written in the functional form compilers want:

* the standard collectives become ``torch.ops._c10d_functional.<op>`` + ``wait_tensor`` followed by a
  ``copy_`` into the caller's buffer, which is what Inductor's communication passes and vendor graph compilers
  (TorchAir converts exactly these) recognise;
* what torch has no functional op for (reduce, gather, scatter, barrier, send/recv, the uneven ops), and any
  standard op the capability table says is only *emulated* in graph mode, becomes one of xccl's own ops
  (``torch.ops.xccl.<op>``, see ``_ops``), chained through the group's order token.

Before emitting anything, each function asks the group's capability table (``mode="graph"``) and raises
:class:`~xccl.UnsupportedCollective` at trace time when the op cannot run. What Dynamo traces here is kept
simple: table lookups, rank checks and error construction happen in ``_group``'s constant functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..plugin._capabilities import Collective
from . import _ops  # noqa: F401 - registers torch.ops.xccl.*
from ._group import TOKENS, GroupInfo, fail, group_info, redop, resolve, root

__all__ = [
    "GraphWork",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_uneven",
    "scatter",
    "send",
]

C = Collective
SUM: Final = dist.ReduceOp.SUM
_F: Final = torch.ops._c10d_functional
_X: Final = torch.ops.xccl


@final
class _P2PWork:
    """The handle of ``isend`` / ``irecv`` in a graph: ``wait()`` completes the group's pending p2p operations
    (``xccl.wait``) and copies what arrived into the caller's buffer."""

    def __init__(self, g: GroupInfo, buffer: torch.Tensor | None, received: torch.Tensor | None) -> None:
        self.g, self.buffer, self.received = g, buffer, received

    def wait(self, timeout: Any = None) -> bool:
        received = [self.received] if self.received is not None else []
        outs = _chained(self.g, _X.wait, received)
        if self.buffer is not None:
            self.buffer.copy_(outs[0])
        return True

    def is_completed(self) -> bool:
        return False


@final
class GraphWork:
    """The handle an ``async_op=True`` collective returns in a compiled graph.

    In a graph the collective's result is waited for (``wait_tensor``) where the graph needs it, and the caller's
    buffer is updated at the call; the compiler is free to overlap the communication with independent compute.
    So ``wait()`` has nothing left to do: it exists so that eager code (``work = op(..., async_op=True);
    work.wait()``) compiles unchanged.
    """

    def wait(self, timeout: Any = None) -> bool:
        """Return True: the result is already in the caller's buffer."""
        return True

    def is_completed(self) -> bool:
        """True."""
        return True

    def is_success(self) -> bool:
        """True (failures raise where they happen)."""
        return True


_DONE: Final = GraphWork()


def _work(async_op: bool) -> GraphWork | None:
    return _DONE if async_op else None


def _waited(g: GroupInfo, t: torch.Tensor) -> torch.Tensor:
    """``wait_tensor`` on a standard collective's result, and the result joined to the group's token chain.

    The join (``xccl.order``, a 1-element copy) makes the group's next xccl op depend on this wait, so no
    scheduler can hoist a later send/recv above this collective: on 2.13, Inductor's reordering did exactly that
    in a graph where one rank sends and its peer receives, and the two ranks deadlocked.
    """
    out = _F.wait_tensor(t)
    token = TOKENS[g.name]
    token.copy_(_X.order(token, [out.detach()]))
    return out


def _detached(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach()
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        return [t.detach() for t in a]
    return a


def _chained(g: GroupInfo, op: Any, *args: Any) -> Any:
    """Call xccl graph op ``op(*args, group_name, token)`` and thread the group's order token through it.

    Inputs are detached: xccl's own ops are not differentiable, and a token computed from a tensor that
    requires grad would make the global token require grad.
    """
    token = TOKENS[g.name]
    out = op(*[_detached(a) for a in args], g.name, token)
    if isinstance(out, tuple):
        token.copy_(out[1])
        return out[0]
    token.copy_(out)
    return None


# ------------------------------------------------------------------------------- building blocks (functional)


def _all_reduce(g: GroupInfo, native: bool, x: torch.Tensor, red: str) -> torch.Tensor:
    if native:
        return _waited(g, _F.all_reduce(x, red, g.name))
    return _chained(g, _X.all_reduce, x, red)


def _all_gather(g: GroupInfo, native: bool, x: torch.Tensor) -> torch.Tensor:
    if native:
        return _waited(g, _F.all_gather_into_tensor(x, g.size, g.name))
    return _chained(g, _X.all_gather_into_tensor, x)


def _reduce_scatter(g: GroupInfo, native: bool, x: torch.Tensor, red: str) -> torch.Tensor:
    if native:
        return _waited(g, _F.reduce_scatter_tensor(x, red, g.size, g.name))
    return _chained(g, _X.reduce_scatter_tensor, x, red)


def _all_to_all(g: GroupInfo, native: bool, x: torch.Tensor, osz: list[Any], isz: list[Any]) -> torch.Tensor:
    if native:
        return _waited(g, _F.all_to_all_single(x, osz, isz, g.name))
    return _chained(g, _X.all_to_all_single, x, osz, isz)


# ---------------------------------------------------------------------------------------------- collectives


def all_reduce(tensor: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
    """Graph form of :func:`xccl.all_reduce`: ``_c10d_functional.all_reduce``, then ``copy_`` into ``tensor``."""
    g = group_info(group)
    red = redop(op)
    native = resolve(g.name, C.ALL_REDUCE, tensor.dtype, red)
    tensor.copy_(_all_reduce(g, native, tensor, red))
    return _work(async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Graph form of :func:`xccl.all_gather`: one ``all_gather_into_tensor``, sliced into ``tensor_list``."""
    g = group_info(group)
    native = resolve(g.name, C.ALL_GATHER, tensor.dtype, None)
    if len(tensor_list) != g.size:
        fail("all_gather", "tensor_list must have one tensor per rank of the group")
    k = tensor.numel()
    gathered = _all_gather(g, native, tensor.reshape(-1))
    for i, out in enumerate(tensor_list):
        out.copy_(gathered[i * k : (i + 1) * k].view(out.shape))
    return _work(async_op)


def all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.all_gather_into_tensor`: ``_c10d_functional.all_gather_into_tensor``."""
    g = group_info(group)
    native = resolve(g.name, C.ALL_GATHER_INTO_TENSOR, input_tensor.dtype, None)
    if output_tensor.numel() != input_tensor.numel() * g.size:
        fail("all_gather_into_tensor", "output must have the input's number of elements times the group size")
    x = input_tensor if input_tensor.dim() else input_tensor.reshape(1)
    output_tensor.copy_(_all_gather(g, native, x).view(output_tensor.shape))
    return _work(async_op)


def reduce_scatter(
    output: torch.Tensor, input_list: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.reduce_scatter`: the inputs concatenated, one ``reduce_scatter_tensor``."""
    g = group_info(group)
    red = redop(op)
    native = resolve(g.name, C.REDUCE_SCATTER, output.dtype, red)
    if len(input_list) != g.size:
        fail("reduce_scatter", "input_list must have one tensor per rank of the group")
    flat = torch.cat([t.reshape(-1) for t in input_list])
    output.copy_(_reduce_scatter(g, native, flat, red).view(output.shape))
    return _work(async_op)


def reduce_scatter_tensor(
    output: torch.Tensor, input: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.reduce_scatter_tensor`: ``_c10d_functional.reduce_scatter_tensor``."""
    g = group_info(group)
    red = redop(op)
    native = resolve(g.name, C.REDUCE_SCATTER_TENSOR, input.dtype, red)
    if input.numel() != output.numel() * g.size:
        fail("reduce_scatter_tensor", "input must have the output's number of elements times the group size")
    natural = input.dim() > 0 and output.dim() > 0 and input.shape[1:] == output.shape[1:]
    # Keep the caller's shapes where they fit: a matmul feeding reduce_scatter stays recognisable to graph passes.
    x = input if natural else input.reshape(-1)
    output.copy_(_reduce_scatter(g, native, x, red).view(output.shape))
    return _work(async_op)


def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_to_all`: the inputs concatenated, one ``all_to_all_single`` with splits."""
    g = group_info(group)
    native = resolve(g.name, C.ALL_TO_ALL, input_tensor_list[0].dtype, None)
    if len(output_tensor_list) != g.size or len(input_tensor_list) != g.size:
        fail("all_to_all", "output and input lists must have one tensor per rank of the group")
    isz = [t.numel() for t in input_tensor_list]
    osz = [t.numel() for t in output_tensor_list]
    out = _all_to_all(g, native, torch.cat([t.reshape(-1) for t in input_tensor_list]), osz, isz)
    offset = 0
    for t, n in zip(output_tensor_list, osz, strict=True):
        t.copy_(out[offset : offset + n].view(t.shape))
        offset = offset + n
    return _work(async_op)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_to_all_single`: ``_c10d_functional.all_to_all_single``."""
    g = group_info(group)
    n = g.size
    osz = [output.shape[0] // n] * n if output_split_sizes is None else list(output_split_sizes)
    isz = [input.shape[0] // n] * n if input_split_sizes is None else list(input_split_sizes)
    if len(osz) != n or len(isz) != n:
        fail("all_to_all_single", "split sizes must have one entry per rank of the group")
    uneven = (output_split_sizes is not None and len(set(osz)) > 1) or (
        input_split_sizes is not None and len(set(isz)) > 1
    )
    native = resolve(g.name, C.ALL_TO_ALL_SINGLE_UNEVEN if uneven else C.ALL_TO_ALL_SINGLE, input.dtype, None)
    output.copy_(_all_to_all(g, native, input, osz, isz).view(output.shape))
    return _work(async_op)


def broadcast(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False, group_src: int | None = None
) -> Any:
    """Graph form of :func:`xccl.broadcast`: ``_c10d_functional.broadcast`` (torch's own ``dist.broadcast``
    breaks the graph in torch 2.13)."""
    g = group_info(group)
    r = root(g.name, "broadcast", "src", src, group_src)
    native = resolve(g.name, C.BROADCAST, tensor.dtype, None)
    if native:
        out = _waited(g, _F.broadcast(tensor, r, g.name))
    else:
        out = _chained(g, _X.broadcast, tensor, r)
    tensor.copy_(out)
    return _work(async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Graph form of :func:`xccl.reduce`: ``xccl.reduce`` (torch has no functional reduce)."""
    g = group_info(group)
    r = root(g.name, "reduce", "dst", dst, group_dst)
    red = redop(op)
    resolve(g.name, C.REDUCE, tensor.dtype, red)
    tensor.copy_(_chained(g, _X.reduce, tensor, r, red))
    return _work(async_op)


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Graph form of :func:`xccl.gather`: ``xccl.gather``, copied into ``gather_list`` on the root."""
    g = group_info(group)
    r = root(g.name, "gather", "dst", 0 if dst is None and group_dst is None else dst, group_dst)
    resolve(g.name, C.GATHER, tensor.dtype, None)
    if g.rank == r and (gather_list is None or len(gather_list) != g.size):
        fail("gather", "gather_list must have one tensor per rank of the group on the destination rank")
    outs = _chained(g, _X.gather, tensor, r)
    if g.rank == r and gather_list is not None:
        for t, o in zip(gather_list, outs, strict=True):
            t.copy_(o)
    return _work(async_op)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """Graph form of :func:`xccl.scatter`: ``xccl.scatter``, copied into ``tensor``."""
    g = group_info(group)
    r = root(g.name, "scatter", "src", 0 if src is None and group_src is None else src, group_src)
    resolve(g.name, C.SCATTER, tensor.dtype, None)
    if g.rank == r and (scatter_list is None or len(scatter_list) != g.size):
        fail("scatter", "scatter_list must have one tensor per rank of the group on the source rank")
    lst = list(scatter_list) if g.rank == r and scatter_list is not None else []
    tensor.copy_(_chained(g, _X.scatter, tensor, lst, r))
    return _work(async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> Any:
    """Graph form of :func:`xccl.barrier`: ``xccl.barrier``, ordered with the group's other xccl ops."""
    g = group_info(group)
    resolve(g.name, C.BARRIER, None, None)
    _chained(g, _X.barrier)
    return _work(async_op)


def _peer(g: GroupInfo, op: str, what: str, peer: int | None, group_peer: int | None) -> int:
    r = root(g.name, op, what, peer, group_peer)
    if r == g.rank:
        fail(op, f"{what} is this rank itself")
    return r


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Graph form of :func:`xccl.send`: ``xccl.send``, in program order with the group's other xccl ops."""
    g = group_info(group)
    r = _peer(g, "send", "dst", dst, group_dst)
    resolve(g.name, C.SEND, tensor.dtype, None)
    _chained(g, _X.send, tensor, r)


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Graph form of :func:`xccl.recv`: ``xccl.recv``, copied into ``tensor``; returns ``src``'s global rank."""
    g = group_info(group)
    r = _peer(g, "recv", "src", src, group_src)
    resolve(g.name, C.RECV, tensor.dtype, None)
    tensor.copy_(_chained(g, _X.recv, tensor, r))
    return g.ranks[r]


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
    """Graph form of :func:`xccl.isend`: ``xccl.isend`` starts it, the handle's ``wait()`` emits ``xccl.wait``."""
    g = group_info(group)
    r = _peer(g, "isend", "dst", dst, group_dst)
    resolve(g.name, C.SEND, tensor.dtype, None)
    _chained(g, _X.isend, tensor, r)
    return _P2PWork(g, None, None)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Any:
    """Graph form of :func:`xccl.irecv`: ``xccl.irecv`` starts it; the handle's ``wait()`` emits ``xccl.wait``
    and copies the result into ``tensor`` (whose content is undefined until then, as in eager mode)."""
    g = group_info(group)
    r = _peer(g, "irecv", "src", src, group_src)
    resolve(g.name, C.RECV, tensor.dtype, None)
    received = _chained(g, _X.irecv, tensor, r)
    return _P2PWork(g, tensor, received)


def all_gather_into_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_gather_into_tensor_uneven`: ``xccl.all_gather_into_tensor_uneven``."""
    g = group_info(group)
    resolve(g.name, C.ALL_GATHER_INTO_TENSOR_UNEVEN, input.dtype, None)
    sizes = [input.shape[0]] * g.size if output_split_sizes is None else list(output_split_sizes)
    if len(sizes) != g.size:
        fail("all_gather_into_tensor_uneven", "output_split_sizes must have one entry per rank of the group")
    output.copy_(_chained(g, _X.all_gather_into_tensor_uneven, input, sizes))
    return _work(async_op)


def reduce_scatter_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    input_split_sizes: Sequence[int] | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.reduce_scatter_tensor_uneven`: ``xccl.reduce_scatter_tensor_uneven``."""
    g = group_info(group)
    red = redop(op)
    resolve(g.name, C.REDUCE_SCATTER_TENSOR_UNEVEN, input.dtype, red)
    sizes = [output.shape[0]] * g.size if input_split_sizes is None else list(input_split_sizes)
    if len(sizes) != g.size:
        fail("reduce_scatter_tensor_uneven", "input_split_sizes must have one entry per rank of the group")
    output.copy_(_chained(g, _X.reduce_scatter_tensor_uneven, input, sizes, red))
    return _work(async_op)


def all_to_all_v(
    output: torch.Tensor,
    input: torch.Tensor,
    send_count_matrix: Sequence[Sequence[int]],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_to_all_v`: ``xccl.all_to_all_v`` with the matrix flattened row-major."""
    g = group_info(group)
    resolve(g.name, C.ALL_TO_ALL_V, input.dtype, None)
    if len(send_count_matrix) != g.size or any(len(row) != g.size for row in send_count_matrix):
        fail("all_to_all_v", "send_count_matrix must be n x n for a group of n ranks")
    counts = [c for row in send_count_matrix for c in row]
    output.copy_(_chained(g, _X.all_to_all_v, input, counts).view(output.shape))
    return _work(async_op)
