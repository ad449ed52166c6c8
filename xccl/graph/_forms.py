"""The graph form of every public collective: what ``xccl.<op>`` does while ``torch.compile`` traces it.

``xccl.<op>(...)`` calls :func:`run` with the op's spec (``xccl.ops._specs``) and the public arguments, exactly as
its eager path calls ``dispatch``; the op's *form* below, registered for its spec, emits the graph: a standard
``torch.ops._c10d_functional`` op + ``wait_tensor`` and a ``copy_`` into the caller's buffer where the op is
native (or the group is xccl's own), else one of xccl's own ops (``_ops``, registered by ``_group`` when the first
form asks for its group), chained through the group's order token. docs/graph.md has the table of forms.

What Dynamo traces here is kept simple: table lookups and error construction happen in ``_group``'s constant
functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, final

import torch

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..ops._torch import FUNCOL_AUTOGRAD, TORCH
from ..plugin._capabilities import Collective
from ._group import GroupInfo, emittable, fail, group_info, order_joins, redop, resolve, trace_error
from ._layers import carry
from ._state import GRAPH

__all__ = ["GraphWork", "run"]

C = Collective
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
        outs = _chained(self.g, "wait", received)
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


def _waited(g: GroupInfo, t: torch.Tensor) -> torch.Tensor:
    """``wait_tensor`` on a standard collective's result, and the result joined to the group's token chain.

    The join (``xccl.order``, a 1-element copy) makes the group's next xccl op depend on this wait, so no
    scheduler can hoist a later send/recv above this collective: on 2.13, Inductor's reordering did exactly that
    in a graph where one rank sends and its peer receives, and the two ranks deadlocked.
    """
    out: torch.Tensor = _F.wait_tensor(t)
    if order_joins():
        token = GRAPH.tokens[g.name]
        token.copy_(_X.order(token, [out.detach()]))
    return out


def _detached(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach()
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        return [t.detach() for t in a]
    return a


def _chained(g: GroupInfo, name: str, *args: Any) -> Any:
    """Call xccl graph op ``name`` as ``op(*args, group_name, token)`` and thread the group's order token
    through it, once the plugin's graph compiler is known to take it (``emittable``).

    Inputs are detached: xccl's own ops are not differentiable, and a token computed from a tensor that
    requires grad would make the global token require grad.
    """
    emittable(g.name, name)
    token = GRAPH.tokens[g.name]
    out = getattr(_X, name)(*[_detached(a) for a in args], g.name, token)
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
#: The standard ops that take the group's size after their other arguments.
_SIZED: Final = ("all_gather_into_tensor", "reduce_scatter_tensor")


def _collective(g: GroupInfo, standard: bool, name: str, x: torch.Tensor, *args: Any) -> torch.Tensor:
    """``_c10d_functional.<name>(x, *args)``, waited, when ``standard``; else xccl's graph op of the same name."""
    if standard:
        sized = (g.size,) if name in _SIZED else ()
        return _like(_waited(g, getattr(_F, name)(_real(x), *args, *sized, g.name)), x)
    out: torch.Tensor = _chained(g, name, x, *args)
    return out


# ------------------------------------------------------------------------------------------------- the forms

#: A graph form: ``form(g, standard, red, async_op, *kernel_args)``. ``kernel_args`` are what the op's spec
#: validated (as eager kernels receive them), ``standard`` is whether the standard functional op carries the call
#: (``resolve``), ``red`` the reduce op's name for graph ops (None for ops without one). It returns what the public
#: function returns (recv's source, a point-to-point handle), or None: :func:`run` makes that a handle where asked.
Form = Callable[..., Any]
#: Spec name -> (graph form, whether :func:`run` resolves the spec's own capability key first). The coalesced forms
#: resolve each constituent op themselves, as their eager emulation runs one op per tensor.
_FORMS: Final[dict[str, tuple[Form, bool]]] = {}


def _form(spec: S.Spec, resolves: bool = True) -> Callable[[Form], Form]:
    def register(fn: Form) -> Form:
        _FORMS[spec.name] = (fn, resolves)
        return fn

    return register


def run(spec: S.Spec, group: Any, async_op: bool, *args: Any) -> Any:
    """The graph form of ``spec``'s collective: what ``xccl.<op>(*args, group=group, async_op=async_op)`` traces to.

    The twin of eager :func:`~xccl.collectives._dispatch.dispatch`, step for step: the same spec validates ``args``
    (the public arguments without ``group`` and ``async_op``) into the kernel arguments, with an error-raiser
    Dynamo lets through; the same capability key, dtype and reduce op (``spec.key_of``, ``dtype_of``,
    ``reduce_op_index``) are looked up in the group's table in graph mode; then the op's form emits the graph.
    """
    g = group_info(group)
    kargs = spec.validate(g, fail, *args)
    key = spec.key_of(kargs)
    if key is C.RECV_ANY_SOURCE:
        fail(spec.name, "a receive from any source (no src) cannot be compiled: the graph needs the peer; pass src")
    form, resolves = _FORMS[spec.name]
    idx = spec.reduce_op_index
    red = None if idx is None else redop(kargs[idx])
    if not resolves:
        out = form(g, False, red, async_op, *kargs)
    else:
        out = carry(spec, g, resolve(g.name, key, spec.dtype_of(kargs), red), form, red, async_op, kargs)
    return _DONE if out is None and async_op else out


@_form(S.ALL_REDUCE)
def _f_all_reduce(g: GroupInfo, standard: bool, red: str, async_op: bool, t: torch.Tensor, rop: Any) -> None:
    """``_c10d_functional.all_reduce``, then ``copy_`` into ``tensor``."""
    t.copy_(_collective(g, standard, "all_reduce", t, red))


@_form(S.ALL_REDUCE_COALESCED, resolves=False)
def _f_all_reduce_coalesced(g: GroupInfo, _: bool, red: str, async_op: bool, ts: list[torch.Tensor], rop: Any) -> None:
    """One all_reduce per tensor (the compiler may bucket them)."""
    for t in ts:
        carry(S.ALL_REDUCE, g, resolve(g.name, C.ALL_REDUCE, t.dtype, red), _f_all_reduce, red, False, (t, rop))


@_form(S.ALL_GATHER)
def _f_all_gather(g: GroupInfo, standard: bool, _: None, async_op: bool, outs: list[torch.Tensor], t: torch.Tensor) -> None:
    """One ``all_gather_into_tensor``, sliced into ``tensor_list``."""
    k = t.numel()
    gathered = _collective(g, standard, "all_gather_into_tensor", t.reshape(-1))
    for i, out in enumerate(outs):
        out.copy_(gathered[i * k : (i + 1) * k].view(out.shape))


@_form(S.ALL_GATHER_COALESCED, resolves=False)
def _f_all_gather_coalesced(
    g: GroupInfo, _: bool, __: None, async_op: bool, outs: list[list[torch.Tensor]], ins: list[torch.Tensor]
) -> None:
    """One all_gather per input tensor."""
    for i, t in enumerate(ins):
        carry(S.ALL_GATHER, g, resolve(g.name, C.ALL_GATHER, t.dtype, None), _f_all_gather, None, False,
              ([row[i] for row in outs], t))


@_form(S.ALL_GATHER_INTO_TENSOR)
def _f_all_gather_into_tensor(
    g: GroupInfo, standard: bool, _: None, async_op: bool, out: torch.Tensor, inp: torch.Tensor
) -> None:
    """``_c10d_functional.all_gather_into_tensor``."""
    x = inp if inp.dim() else inp.reshape(1)
    out.copy_(_collective(g, standard, "all_gather_into_tensor", x).view(out.shape))


@_form(S.REDUCE_SCATTER)
def _f_reduce_scatter(
    g: GroupInfo, standard: bool, red: str, async_op: bool, out: torch.Tensor, ins: list[torch.Tensor], rop: Any
) -> None:
    """The inputs concatenated, one ``reduce_scatter_tensor``."""
    flat = torch.cat([t.reshape(-1) for t in ins])
    out.copy_(_collective(g, standard, "reduce_scatter_tensor", flat, red).view(out.shape))


@_form(S.REDUCE_SCATTER_TENSOR)
def _f_reduce_scatter_tensor(
    g: GroupInfo, standard: bool, red: str, async_op: bool, out: torch.Tensor, inp: torch.Tensor, rop: Any
) -> None:
    """``_c10d_functional.reduce_scatter_tensor``."""
    natural = inp.dim() > 0 and out.dim() > 0 and inp.shape[1:] == out.shape[1:]
    # Keep the caller's shapes where they fit: a matmul feeding reduce_scatter stays recognisable to graph passes.
    x = inp if natural else inp.reshape(-1)
    out.copy_(_collective(g, standard, "reduce_scatter_tensor", x, red).view(out.shape))


@_form(S.ALL_TO_ALL)
def _f_all_to_all(
    g: GroupInfo, standard: bool, _: None, async_op: bool, outs: list[torch.Tensor], ins: list[torch.Tensor]
) -> None:
    """The inputs concatenated, one ``all_to_all_single`` with splits."""
    isz = [t.numel() for t in ins]
    osz = [t.numel() for t in outs]
    out = _collective(g, standard, "all_to_all_single", torch.cat([t.reshape(-1) for t in ins]), osz, isz)
    offset = 0
    for t, n in zip(outs, osz, strict=True):
        t.copy_(out[offset : offset + n].view(t.shape))
        offset = offset + n


@_form(S.ALL_TO_ALL_SINGLE)
def _f_all_to_all_single(
    g: GroupInfo, standard: bool, _: None, async_op: bool, out: torch.Tensor, inp: torch.Tensor,
    osz: list[int] | None, isz: list[int] | None,
) -> None:
    """``_c10d_functional.all_to_all_single``; even or uneven as in eager mode (``Spec.key_of``: by whether split
    sizes were passed, never by their values)."""
    n = g.size
    osz = [out.shape[0] // n] * n if osz is None else osz
    isz = [inp.shape[0] // n] * n if isz is None else isz
    out.copy_(_collective(g, standard, "all_to_all_single", inp, osz, isz).view(out.shape))


@_form(S.BROADCAST)
def _f_broadcast(g: GroupInfo, standard: bool, _: None, async_op: bool, t: torch.Tensor, root: int) -> None:
    """``_c10d_functional.broadcast`` (torch's own ``dist.broadcast`` breaks the graph in torch 2.13)."""
    t.copy_(_collective(g, standard, "broadcast", t, root))


@_form(S.REDUCE)
def _f_reduce(g: GroupInfo, _: bool, red: str, async_op: bool, t: torch.Tensor, root: int, rop: Any) -> None:
    """``xccl.reduce`` (torch has no functional reduce)."""
    t.copy_(_chained(g, "reduce", t, root, red))


@_form(S.GATHER)
def _f_gather(
    g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, lst: list[torch.Tensor] | None, root: int
) -> None:
    """``xccl.gather``, copied into ``gather_list`` on the root."""
    outs = _chained(g, "gather", t, root)
    if lst is not None:
        for x, o in zip(lst, outs, strict=True):
            x.copy_(o)


@_form(S.SCATTER)
def _f_scatter(
    g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, lst: list[torch.Tensor] | None, root: int
) -> None:
    """``xccl.scatter``, copied into ``tensor``."""
    t.copy_(_chained(g, "scatter", t, lst or [], root))


@_form(S.BARRIER)
def _f_barrier(g: GroupInfo, _: bool, __: None, async_op: bool) -> None:
    """``xccl.barrier``, ordered with the group's other xccl ops."""
    _chained(g, "barrier")


@_form(S.MONITORED_BARRIER, resolves=False)
def _f_monitored_barrier(g: GroupInfo, _: bool, __: None, async_op: bool, timeout: Any, wait_all_ranks: bool) -> Any:
    """None: a monitored barrier times host-side waits and names late ranks, which a graph cannot do (torch's
    breaks the graph); it raises at trace time, naming the way out."""
    raise trace_error(UnsupportedCollective, "monitored_barrier", g.backend,
                      "a compiled graph cannot time host-side waits or name late ranks: call monitored_barrier "
                      "outside the compiled function (graph mode)")


@_form(S.SEND)
def _f_send(g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, peer: int, tag: int) -> None:
    """``xccl.send``, in program order with the group's other xccl ops."""
    _chained(g, "send", t, peer)


@_form(S.RECV)
def _f_recv(g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, peer: int, tag: int) -> int:
    """``xccl.recv``, copied into ``tensor``; returns ``src``'s global rank."""
    t.copy_(_chained(g, "recv", t, peer))
    return g.ranks[peer]


@_form(S.ISEND)
def _f_isend(g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, peer: int, tag: int) -> Any:
    """``xccl.isend`` starts it, the handle's ``wait()`` emits ``xccl.wait``."""
    _chained(g, "isend", t, peer)
    return _P2PWork(g, None, None)


@_form(S.IRECV)
def _f_irecv(g: GroupInfo, _: bool, __: None, async_op: bool, t: torch.Tensor, peer: int, tag: int) -> Any:
    """``xccl.irecv`` starts it; the handle's ``wait()`` emits ``xccl.wait`` and copies the result into ``tensor``
    (whose content is undefined until then, as in eager mode)."""
    received = _chained(g, "irecv", t, peer)
    return _P2PWork(g, t, received)


@_form(S.ALL_GATHER_INTO_TENSOR_UNEVEN)
def _f_all_gather_uneven(
    g: GroupInfo, _: bool, __: None, async_op: bool, out: torch.Tensor, inp: torch.Tensor, sizes: list[int] | None
) -> None:
    """``xccl.all_gather_into_tensor_uneven``."""
    out.copy_(_chained(g, "all_gather_into_tensor_uneven", inp, sizes))


@_form(S.REDUCE_SCATTER_TENSOR_UNEVEN)
def _f_reduce_scatter_uneven(
    g: GroupInfo, _: bool, red: str, async_op: bool, out: torch.Tensor, inp: torch.Tensor, sizes: list[int] | None,
    rop: Any,
) -> None:
    """``xccl.reduce_scatter_tensor_uneven``."""
    out.copy_(_chained(g, "reduce_scatter_tensor_uneven", inp, sizes, red))


@_form(S.ALL_TO_ALL_V)
def _f_all_to_all_v(
    g: GroupInfo, _: bool, __: None, async_op: bool, out: torch.Tensor, inp: torch.Tensor, matrix: list[list[int]]
) -> None:
    """``xccl.all_to_all_v`` with the matrix flattened row-major."""
    counts = [c for row in matrix for c in row]
    out.copy_(_chained(g, "all_to_all_v", inp, counts).view(out.shape))


def _register_adjoints() -> None:
    """On a torch before 2.11, the autograd formulas 2.11 registers for the standard ops the forms emit (the adjoints
    in ``functional``'s docstring): without them a compiled training step computes no gradient through a
    collective (xccl.functional's, or an in-place one on a tensor that requires grad)."""
    F, lib = torch.ops._c10d_functional, "_c10d_functional::"

    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.args = inputs[1:]  # (reduce op,) group size, group name

    def adjoint(back: Any) -> Any:
        return lambda ctx, grad: (F.wait_tensor(back(grad.contiguous(), *ctx.args)), *[None] * len(ctx.args))

    torch.library.register_autograd(lib + "wait_tensor", lambda ctx, grad: grad, setup_context=lambda **_: None)
    torch.library.register_autograd(lib + "all_reduce", adjoint(F.all_reduce), setup_context=setup)
    torch.library.register_autograd(lib + "all_gather_into_tensor", adjoint(
        lambda g, size, name: F.reduce_scatter_tensor(g, "sum", size, name)), setup_context=setup)
    torch.library.register_autograd(lib + "reduce_scatter_tensor", adjoint(
        lambda g, op, size, name: F.all_gather_into_tensor(g, size, name)), setup_context=setup)


if not TORCH.has(FUNCOL_AUTOGRAD):
    _register_adjoints()
