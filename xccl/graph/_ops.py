"""xccl's own graph ops: ``torch.ops.xccl.*``, for what ``torch.ops._c10d_functional`` lacks.

Every op is functional (new tensors out, inputs untouched), names its group by the c10d group name (a string,
never a process-group object), numbers roots and peers by *group* rank, and has a fake implementation so that
Dynamo, AOTAutograd and Inductor can trace it without communicating.

Every op takes the group's order token and returns the next one, so that a group's xccl ops form a chain of data
dependencies in program order that no backend can reorder (docs/graph.md, "Order of point-to-point operations").
At run time each op dispatches like an eager call; graph compilers see them as opaque, and a vendor maps them to
its own graph ops through a converter (``Runtime.graph_converters``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


# ------------------------------------------------------------------------------------------------- the ops
# Most ops are ``xccl::<name>(Tensor input, <args>, str group_name, Tensor token) -> (<out>, Tensor)``: ``alloc``
# makes the output from the group and the input (the same code for the real run and the fake one: on fake tensors it
# makes fake tensors), ``run`` issues the call. Ops without an output return the next token alone.

Alloc = Callable[..., Any]
Run = Callable[..., Any]
_DEFINED: dict[str, Any] = {}


def _define(name: str, args: str, out: str | None, alloc: Alloc, run: Run) -> None:
    """Define ``torch.ops.xccl.<name>`` and its fake from its output's allocation and its run."""
    returns = "Tensor" if out is None else f"({out}, Tensor)"
    schema = f"(Tensor input, {args + ', ' if args else ''}str group_name, Tensor token) -> {returns}"

    def real(input: torch.Tensor, *rest: Any) -> Any:
        *extra, group_name, token = rest
        pg = _pg(group_name)
        result = alloc(pg, input, *extra)
        run(pg, result, input, *extra)
        return _next(token) if out is None else (result, _next(token))

    def fake(input: torch.Tensor, *rest: Any) -> Any:
        *extra, group_name, token = rest
        result = alloc(_pg(group_name), input, *extra)
        return _fake_next(token) if out is None else (result, _fake_next(token))

    _DEFINED[name] = _register(name, schema, real, fake)


def _register(name: str, schema: str, real: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    op = custom_op(f"{NS}::{name}", real, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


def _clone(pg: Any, input: torch.Tensor, *_: Any) -> torch.Tensor:
    return input.clone()


def _like(pg: Any, input: torch.Tensor, *_: Any) -> torch.Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _rows(n: Callable[..., int]) -> Alloc:
    """An output of ``n(pg, input, *args)`` rows shaped like the input's."""
    return lambda pg, input, *a: input.new_empty([n(pg, input, *a), *input.shape[1:]])


def _none(*_: Any) -> None:
    return None


def _gathered_shape(input: torch.Tensor, n: int) -> list[Any]:
    return [n] if input.dim() == 0 else [input.shape[0] * n, *input.shape[1:]]


def _matrix(pg: Any, counts: Sequence[int]) -> list[list[int]]:
    """``all_to_all_v``'s count matrix from its row-major flattening (``counts[i * n + j]``: rank i to rank j)."""
    n = pg.size()
    return [list(counts[i * n : (i + 1) * n]) for i in range(n)]


# The standard ops: used where the capability table says the op is emulated in graph mode; the op then runs through
# xccl's eager dispatch, which applies the same emulation as eager mode.
_define("all_reduce", "str reduce_op", "Tensor", _clone,
        lambda pg, out, input, rop: dispatch(S.ALL_REDUCE, pg, False, out, reduce_op_of(rop)))
_define("all_gather_into_tensor", "", "Tensor",
        lambda pg, input: input.new_empty(_gathered_shape(input, pg.size())),
        lambda pg, out, input: dispatch(S.ALL_GATHER_INTO_TENSOR, pg, False, out, input.contiguous()))
_define(S.REDUCE_SCATTER_TENSOR.name, "str reduce_op", "Tensor", _rows(lambda pg, input, rop: input.shape[0] // pg.size()),
        lambda pg, out, input, rop: dispatch(S.REDUCE_SCATTER_TENSOR, pg, False, out, input.contiguous(),
                                             reduce_op_of(rop)))
_define("all_to_all_single", "SymInt[] output_split_sizes, SymInt[] input_split_sizes", "Tensor",
        _rows(lambda pg, input, outs, ins: sum(outs)),
        lambda pg, out, input, outs, ins: dispatch(S.ALL_TO_ALL_SINGLE, pg, False, out, input.contiguous(), list(outs),
                                                   list(ins)))
_define("broadcast", "SymInt src", "Tensor", _clone,
        lambda pg, out, input, src: dispatch(S.BROADCAST, pg, False, out, None, src))

# What torch has no functional form of. reduce returns this rank's buffer after the reduce (as eager leaves it);
# gather one tensor per member at ``dst``, an empty list elsewhere; scatter's ``input`` gives the shape, and
# ``scatter_list`` (one tensor per member) is read at ``src``; recv's ``input`` gives the shape (its values are not
# read).
_define("reduce", "SymInt dst, str reduce_op", "Tensor", _clone,
        lambda pg, out, input, dst, rop: dispatch(S.REDUCE, pg, False, out, None, reduce_op_of(rop), dst))
_define("gather", "SymInt dst", "Tensor[]",
        lambda pg, input, dst: [torch.empty_like(input) for _ in range(pg.size() if pg.rank() == dst else 0)],
        lambda pg, outs, input, dst: dispatch(S.GATHER, pg, False, input.contiguous(), outs or None, None, dst))
_define("scatter", "Tensor[] scatter_list, SymInt src", "Tensor", lambda pg, input, *_: torch.empty_like(input),
        lambda pg, out, input, lst, src: dispatch(
            S.SCATTER, pg, False, out, [t.contiguous() for t in lst] if pg.rank() == src else None, None, src))
_define("send", "SymInt dst", None, _none,
        lambda pg, _, input, dst: dispatch(S.SEND, pg, False, input.contiguous(), None, 0, dst))
_define("recv", "SymInt src", "Tensor", _like, lambda pg, out, input, src: dispatch(S.RECV, pg, False, out, None, 0, src))
# isend sends from a private copy: once the op returns, a compiler may reuse ``input``'s memory (Inductor did, for
# the next buffer it needed) while the send is still in flight. Both complete at the group's ``xccl.wait`` (pending
# under the group's name as the group gives it).
_define("isend", "SymInt dst", None, _none, lambda pg, _, input, dst: GRAPH.pending.setdefault(pg.group_name, []).append(
    dispatch(S.ISEND, pg, True, input.contiguous().clone(), None, 0, dst)))
_define("irecv", "SymInt src", "Tensor", _like, lambda pg, out, input, src: GRAPH.pending.setdefault(
    pg.group_name, []).append(dispatch(S.IRECV, pg, True, out, None, 0, src)))
_define("all_gather_into_tensor_uneven", "SymInt[] output_split_sizes", "Tensor", _rows(lambda pg, input, s: sum(s)),
        lambda pg, out, input, s: dispatch(S.ALL_GATHER_INTO_TENSOR_UNEVEN, pg, False, out, input.contiguous(),
                                           list(s)))
_define(S.REDUCE_SCATTER_TENSOR_UNEVEN.name, "SymInt[] input_split_sizes, str reduce_op", "Tensor",
        _rows(lambda pg, input, s, rop: s[pg.rank()]),
        lambda pg, out, input, s, rop: dispatch(S.REDUCE_SCATTER_TENSOR_UNEVEN, pg, False, out, input.contiguous(),
                                                list(s), reduce_op_of(rop)))
_define("all_to_all_v", "SymInt[] send_counts", "Tensor",
        lambda pg, input, counts: input.new_empty([sum(row[pg.rank()] for row in _matrix(pg, counts))]),
        lambda pg, out, input, counts: dispatch(S.ALL_TO_ALL_V, pg, False, out, input.contiguous().view(-1),
                                                _matrix(pg, counts)))


def _barrier(group_name: str, token: torch.Tensor) -> torch.Tensor:
    dispatch(S.BARRIER, _pg(group_name), False)
    return _next(token)


def _order(token: torch.Tensor, after: Sequence[torch.Tensor]) -> torch.Tensor:
    """The next token, once every tensor in ``after`` exists: how a standard ``_c10d_functional`` collective's
    result joins the token chain, so that the group's next xccl op cannot be scheduled before its wait."""
    return _next(token)


def _wait(received: Sequence[torch.Tensor], group_name: str, token: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Complete every pending isend/irecv of the group; returns ``received`` (irecv results) now valid."""
    for work in GRAPH.pending.pop(_pg(group_name).group_name, []):
        work.wait()
    return [t.clone() for t in received], _next(token)


_DEFINED["barrier"] = _register("barrier", "(str group_name, Tensor token) -> Tensor", _barrier,
                                lambda group_name, token: _fake_next(token))
_DEFINED["order"] = _register("order", "(Tensor token, Tensor[] after) -> Tensor", _order,
                              lambda token, after: _fake_next(token))
_DEFINED["wait"] = _register("wait", "(Tensor[] received, str group_name, Tensor token) -> (Tensor[], Tensor)", _wait,
                             lambda received, group_name, token: ([torch.empty_like(t) for t in received],
                                                                  _fake_next(token)))

#: Every op xccl defines, by name (``torch.ops.xccl.<name>``).
OPS: Final = {name: op._opoverload for name, op in _DEFINED.items()}

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
