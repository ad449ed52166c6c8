"""The graph form of every public collective: what ``xccl.<op>`` does while ``torch.compile`` traces it.

Each form has the public op's signature and eager semantics (the caller's buffers are updated in place, an
``async_op=True`` call returns a handle to ``wait()`` on), but is written in the functional form compilers want.
It validates with the op's spec (``xccl.collectives._specs``), the very validator eager dispatch runs, given an
error-raiser Dynamo lets through, so a bad call raises the same typed error in both modes; then it asks the
group's capability table (``mode="graph"``) and emits

* the standard ``torch.ops._c10d_functional.<op>`` + ``wait_tensor``, then a ``copy_`` into the caller's buffer,
  which Inductor's communication passes and vendor graph compilers (TorchAir converts exactly these) recognise:
  where the op is native, and on xccl's own process group also where it is emulated, since that group's c10d
  methods run xccl's dispatch when the graph executes;
* otherwise one of xccl's own ops (``torch.ops.xccl.<op>``, see ``_ops``), chained through the group's order
  token: for what torch has no functional op for (reduce, gather, scatter, barrier, send/recv, the uneven ops),
  and for emulated ops on groups created outside xccl.

What Dynamo traces here is kept simple: table lookups and error construction happen in ``_group``'s constant
functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..collectives import _specs as S
from ..collectives._state import STATE
from ..plugin._capabilities import Collective
from . import _ops  # noqa: F401 - registers torch.ops.xccl.*
from ._group import GroupInfo, fail, group_info, redop, resolve

__all__ = [
    "GraphWork",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_reduce",
    "all_reduce_coalesced",
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
    token = STATE.tokens[g.name]
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
    token = STATE.tokens[g.name]
    out = op(*[_detached(a) for a in args], g.name, token)
    if isinstance(out, tuple):
        token.copy_(out[1])
        return out[0]
    token.copy_(out)
    return None


def _real(x: torch.Tensor) -> torch.Tensor:
    """Complex tensors travel as views of their real parts, as in eager mode."""
    return torch.view_as_real(x) if x.is_complex() else x


def _like(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(out) if x.is_complex() else out


# ------------------------------------------------------------------------------- building blocks (functional)


def _all_reduce(g: GroupInfo, standard: bool, x: torch.Tensor, red: str) -> torch.Tensor:
    if standard:
        return _like(_waited(g, _F.all_reduce(_real(x), red, g.name)), x)
    return _chained(g, _X.all_reduce, x, red)


def _all_gather(g: GroupInfo, standard: bool, x: torch.Tensor) -> torch.Tensor:
    if standard:
        return _like(_waited(g, _F.all_gather_into_tensor(_real(x), g.size, g.name)), x)
    return _chained(g, _X.all_gather_into_tensor, x)


def _reduce_scatter(g: GroupInfo, standard: bool, x: torch.Tensor, red: str) -> torch.Tensor:
    if standard:
        return _like(_waited(g, _F.reduce_scatter_tensor(_real(x), red, g.size, g.name)), x)
    return _chained(g, _X.reduce_scatter_tensor, x, red)


def _all_to_all(g: GroupInfo, standard: bool, x: torch.Tensor, osz: list[Any], isz: list[Any]) -> torch.Tensor:
    if standard:
        return _like(_waited(g, _F.all_to_all_single(_real(x), osz, isz, g.name)), x)
    return _chained(g, _X.all_to_all_single, x, osz, isz)


def _key(spec: S.Spec, kargs: Sequence[Any]) -> tuple[Collective, torch.dtype | None]:
    return spec.key_of(kargs), spec.dtype_of(kargs)


# ---------------------------------------------------------------------------------------------- collectives


def all_reduce(tensor: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
    """Graph form of :func:`xccl.all_reduce`: ``_c10d_functional.all_reduce``, then ``copy_`` into ``tensor``."""
    g = group_info(group)
    t, rop = S.ALL_REDUCE.validate(g, fail, tensor, op)
    red = redop(rop)
    standard = resolve(g.name, C.ALL_REDUCE, t.dtype, red)
    t.copy_(_all_reduce(g, standard, t, red))
    return _work(async_op)


def all_reduce_coalesced(tensors: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
    """Graph form of :func:`xccl.all_reduce_coalesced`: one all_reduce per tensor (the compiler may bucket them)."""
    g = group_info(group)
    ts, rop = S.ALL_REDUCE_COALESCED.validate(g, fail, tensors, op)
    red = redop(rop)
    for t in ts:
        t.copy_(_all_reduce(g, resolve(g.name, C.ALL_REDUCE, t.dtype, red), t, red))
    return _work(async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Graph form of :func:`xccl.all_gather`: one ``all_gather_into_tensor``, sliced into ``tensor_list``."""
    g = group_info(group)
    outs, t = S.ALL_GATHER.validate(g, fail, tensor_list, tensor)
    standard = resolve(g.name, C.ALL_GATHER, t.dtype, None)
    k = t.numel()
    gathered = _all_gather(g, standard, t.reshape(-1))
    for i, out in enumerate(outs):
        out.copy_(gathered[i * k : (i + 1) * k].view(out.shape))
    return _work(async_op)


def all_gather_coalesced(
    output_tensor_lists: list[list[torch.Tensor]], input_tensor_list: list[torch.Tensor], group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_gather_coalesced`: one all_gather per input tensor."""
    g = group_info(group)
    outs, ins = S.ALL_GATHER_COALESCED.validate(g, fail, output_tensor_lists, input_tensor_list)
    for i, t in enumerate(ins):
        all_gather([row[i] for row in outs], t, group)
    return _work(async_op)


def all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.all_gather_into_tensor`: ``_c10d_functional.all_gather_into_tensor``."""
    g = group_info(group)
    out, inp = S.ALL_GATHER_INTO_TENSOR.validate(g, fail, output_tensor, input_tensor)
    standard = resolve(g.name, C.ALL_GATHER_INTO_TENSOR, inp.dtype, None)
    x = inp if inp.dim() else inp.reshape(1)
    out.copy_(_all_gather(g, standard, x).view(out.shape))
    return _work(async_op)


def reduce_scatter(
    output: torch.Tensor, input_list: list[torch.Tensor], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.reduce_scatter`: the inputs concatenated, one ``reduce_scatter_tensor``."""
    g = group_info(group)
    out, ins, rop = S.REDUCE_SCATTER.validate(g, fail, output, input_list, op)
    red = redop(rop)
    standard = resolve(g.name, C.REDUCE_SCATTER, out.dtype, red)
    flat = torch.cat([t.reshape(-1) for t in ins])
    out.copy_(_reduce_scatter(g, standard, flat, red).view(out.shape))
    return _work(async_op)


def reduce_scatter_tensor(
    output: torch.Tensor, input: torch.Tensor, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Graph form of :func:`xccl.reduce_scatter_tensor`: ``_c10d_functional.reduce_scatter_tensor``."""
    g = group_info(group)
    out, inp, rop = S.REDUCE_SCATTER_TENSOR.validate(g, fail, output, input, op)
    red = redop(rop)
    standard = resolve(g.name, C.REDUCE_SCATTER_TENSOR, inp.dtype, red)
    natural = inp.dim() > 0 and out.dim() > 0 and inp.shape[1:] == out.shape[1:]
    # Keep the caller's shapes where they fit: a matmul feeding reduce_scatter stays recognisable to graph passes.
    x = inp if natural else inp.reshape(-1)
    out.copy_(_reduce_scatter(g, standard, x, red).view(out.shape))
    return _work(async_op)


def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_to_all`: the inputs concatenated, one ``all_to_all_single`` with splits."""
    g = group_info(group)
    outs, ins = S.ALL_TO_ALL.validate(g, fail, output_tensor_list, input_tensor_list)
    standard = resolve(g.name, C.ALL_TO_ALL, ins[0].dtype, None)
    isz = [t.numel() for t in ins]
    osz = [t.numel() for t in outs]
    out = _all_to_all(g, standard, torch.cat([t.reshape(-1) for t in ins]), osz, isz)
    offset = 0
    for t, n in zip(outs, osz, strict=True):
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
    """Graph form of :func:`xccl.all_to_all_single`: ``_c10d_functional.all_to_all_single``.

    Even or uneven is decided as in eager mode: by whether split sizes were passed (see ``_specs``).
    """
    g = group_info(group)
    kargs = S.ALL_TO_ALL_SINGLE.validate(g, fail, output, input, output_split_sizes, input_split_sizes)
    out, inp, osz, isz = kargs
    n = g.size
    key, dtype = _key(S.ALL_TO_ALL_SINGLE, kargs)
    standard = resolve(g.name, key, dtype, None)
    osz = [out.shape[0] // n] * n if osz is None else osz
    isz = [inp.shape[0] // n] * n if isz is None else isz
    out.copy_(_all_to_all(g, standard, inp, osz, isz).view(out.shape))
    return _work(async_op)


def broadcast(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False, group_src: int | None = None
) -> Any:
    """Graph form of :func:`xccl.broadcast`: ``_c10d_functional.broadcast`` (torch's own ``dist.broadcast``
    breaks the graph in torch 2.13)."""
    g = group_info(group)
    t, root = S.BROADCAST.validate(g, fail, tensor, src, group_src)
    if resolve(g.name, C.BROADCAST, t.dtype, None):
        out = _like(_waited(g, _F.broadcast(_real(t), root, g.name)), t)
    else:
        out = _chained(g, _X.broadcast, t, root)
    t.copy_(out)
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
    t, root, rop = S.REDUCE.validate(g, fail, tensor, dst, op, group_dst)
    red = redop(rop)
    resolve(g.name, C.REDUCE, t.dtype, red)
    t.copy_(_chained(g, _X.reduce, t, root, red))
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
    t, lst, root = S.GATHER.validate(g, fail, tensor, gather_list, dst, group_dst)
    resolve(g.name, C.GATHER, t.dtype, None)
    outs = _chained(g, _X.gather, t, root)
    if lst is not None:
        for x, o in zip(lst, outs, strict=True):
            x.copy_(o)
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
    t, lst, root = S.SCATTER.validate(g, fail, tensor, scatter_list, src, group_src)
    resolve(g.name, C.SCATTER, t.dtype, None)
    t.copy_(_chained(g, _X.scatter, t, lst or [], root))
    return _work(async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> Any:
    """Graph form of :func:`xccl.barrier`: ``xccl.barrier``, ordered with the group's other xccl ops."""
    g = group_info(group)
    resolve(g.name, C.BARRIER, None, None)
    _chained(g, _X.barrier)
    return _work(async_op)


def _p2p(spec: S.Spec, g: GroupInfo, tensor: Any, peer: Any, tag: Any, group_peer: Any) -> tuple[Any, ...]:
    kargs = spec.validate(g, fail, tensor, peer, tag, group_peer)
    if kargs[1] is None:
        fail(spec.name, "a receive from any source (no src) cannot be compiled: the graph needs the peer; pass src")
    resolve(g.name, spec.key, kargs[0].dtype, None)
    return kargs


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Graph form of :func:`xccl.send`: ``xccl.send``, in program order with the group's other xccl ops."""
    g = group_info(group)
    t, peer, _ = _p2p(S.SEND, g, tensor, dst, tag, group_dst)
    _chained(g, _X.send, t, peer)


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Graph form of :func:`xccl.recv`: ``xccl.recv``, copied into ``tensor``; returns ``src``'s global rank."""
    g = group_info(group)
    t, peer, _ = _p2p(S.RECV, g, tensor, src, tag, group_src)
    t.copy_(_chained(g, _X.recv, t, peer))
    return g.ranks[peer]


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
    """Graph form of :func:`xccl.isend`: ``xccl.isend`` starts it, the handle's ``wait()`` emits ``xccl.wait``."""
    g = group_info(group)
    t, peer, _ = _p2p(S.ISEND, g, tensor, dst, tag, group_dst)
    _chained(g, _X.isend, t, peer)
    return _P2PWork(g, None, None)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Any:
    """Graph form of :func:`xccl.irecv`: ``xccl.irecv`` starts it; the handle's ``wait()`` emits ``xccl.wait``
    and copies the result into ``tensor`` (whose content is undefined until then, as in eager mode)."""
    g = group_info(group)
    t, peer, _ = _p2p(S.IRECV, g, tensor, src, tag, group_src)
    received = _chained(g, _X.irecv, t, peer)
    return _P2PWork(g, t, received)


def all_gather_into_tensor_uneven(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Graph form of :func:`xccl.all_gather_into_tensor_uneven`: ``xccl.all_gather_into_tensor_uneven``."""
    g = group_info(group)
    out, inp, sizes = S.ALL_GATHER_INTO_TENSOR_UNEVEN.validate(g, fail, output, input, output_split_sizes)
    resolve(g.name, C.ALL_GATHER_INTO_TENSOR_UNEVEN, inp.dtype, None)
    out.copy_(_chained(g, _X.all_gather_into_tensor_uneven, inp, sizes))
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
    out, inp, sizes, rop = S.REDUCE_SCATTER_TENSOR_UNEVEN.validate(g, fail, output, input, input_split_sizes, op)
    red = redop(rop)
    resolve(g.name, C.REDUCE_SCATTER_TENSOR_UNEVEN, inp.dtype, red)
    out.copy_(_chained(g, _X.reduce_scatter_tensor_uneven, inp, sizes, red))
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
    out, inp, matrix = S.ALL_TO_ALL_V.validate(g, fail, output, input, send_count_matrix)
    resolve(g.name, C.ALL_TO_ALL_V, inp.dtype, None)
    counts = [c for row in matrix for c in row]
    out.copy_(_chained(g, _X.all_to_all_v, inp, counts).view(out.shape))
    return _work(async_op)
