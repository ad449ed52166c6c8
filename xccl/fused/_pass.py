"""Graph pass: fuse matmuls with the collectives next to them into xccl's fused ops (docs/fused.md, "Graph mode").

Over a post-autograd FX graph (what Inductor's ``post_grad_custom_post_pass`` sees, or ``make_fx``'s output), two
rewrites, each for any group and any reduce op (read from the nodes, never matched as literals):

* ``mm(a, b) -> [rows] -> reduce-scatter -> wait_tensor``  becomes  ``xccl.mm_reduce_scatter(a', b)``;
* ``all_gather_into_tensor(x) -> wait_tensor -> [rows] -> mm(., b)``  becomes  ``xccl.all_gather_mm(x', b)``.

``[rows]`` is any chain of ops that only reshape or reorder *rows* and keep the last dimension (views whose last
size is the last dimension; ``split`` / ``getitem`` / ``slice`` / ``cat`` along another dimension; ``clone``): the
3-D reshapes around a matmul and the split/cat forms of a ``scatter_dim`` / ``gather_dim`` other than 0. Such a
chain commutes with a right-multiplication (``P(x) @ b == P'(x @ b)``), so for the reduce-scatter it moves onto
``a`` before the fused op, and for the gather it is replayed on the fused op's product. ``addmm(bias, a, b)``
before a reduce-scatter carries its bias. A match is left alone when the matmul's full product is needed
elsewhere, the product is not 2-D, a shape is unknown (no ``meta["val"]``), or the predicate says no (by default
a native kernel's ``check`` raising :class:`~xccl.ConstraintViolation`).

:class:`FusedMatmulPass` hashes this file and ``_ops.py`` with the plugin's identity for Inductor's FX graph cache.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from ..collectives._groups import state_of
from ..collectives._state import PROCESS
from ..errors import ConstraintViolation
from ..plugin._capabilities import Collective
from . import _ops  # noqa: F401 - defines torch.ops.xccl.mm_reduce_scatter & co., which the rewrites emit
from ._ops import _resolve_group

__all__ = ["FusedMatmulPass", "Predicate", "fuse_matmul_collectives", "plugin_predicate"]

LOG = logging.getLogger("xccl")

aten = torch.ops.aten
c10d = torch.ops._c10d_functional
#: The functional reduce-scatter a matmul feeds (torch's op has the name of xccl's).
_REDUCE_SCATTER: Final = getattr(c10d, Collective.REDUCE_SCATTER_TENSOR.value).default

#: ``predicate(op, a, b, group_name, group_size, **options) -> bool``: may the pass emit ``op`` here? ``a`` and
#: ``b`` are meta tensors of the fused op's operands; options as the kernel takes them.
Predicate = Callable[..., bool]

_VIEWS: Final = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
#: The row ops that take a dimension: the position of its argument.
_DIM_AT: Final = {aten.split.Tensor: 2, aten.split_with_sizes.default: 2, aten.slice.Tensor: 1, aten.cat.default: 1}
_ROW_OPS: Final = _VIEWS | _DIM_AT.keys() | {aten.clone.default, operator.getitem}


# ------------------------------------------------------------------------------------------------ predicate


def plugin_predicate(op: Collective, a: torch.Tensor, b: torch.Tensor, group_name: str, group_size: int,
                     **options: Any) -> bool:
    """The default predicate: False only where the group's plugin has a native kernel whose ``check`` refuses.

    Where xccl is not initialised, or the group is unknown, nothing is refused: the fused op's own dispatch still
    applies the fallback policy at run time.
    """
    try:
        st = state_of(_resolve_group(group_name))
    except Exception:  # no world or unknown group: the run-time dispatch decides
        return True
    kernel = st.runtime.kernels().get(op)
    check = getattr(kernel, "check", None)
    if check is None:
        return True
    try:
        check(a, b, group_size, **options)
    except ConstraintViolation as exc:
        LOG.debug("fused pass: %s left unfused: %s", op.value, exc)
        return False
    return True


# ------------------------------------------------------------------------------------------------ row chains


def _target(node: fx.Node) -> Any:
    return node.target


def _args(node: fx.Node) -> Any:
    """A node's positional arguments, untyped (FX's ``Argument`` union defeats static typing here)."""
    return node.args


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _ndim(node: fx.Node) -> int | None:
    v = _val(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def _keeps_rows(node: fx.Node) -> bool:
    """Whether ``node`` only reshapes or reorders rows of its tensor input, leaving the last dimension alone."""
    t = node.target
    if t not in _ROW_OPS:
        return False
    if t is operator.getitem:
        src = _args(node)[0]
        return isinstance(src, fx.Node) and src.target in (aten.split.Tensor, aten.split_with_sizes.default)
    first = _args(node)[0][0] if t is aten.cat.default else _args(node)[0]
    if not isinstance(first, fx.Node):
        return False
    nd = _ndim(first)
    if nd is None:
        return False
    if t in _VIEWS:
        shape, last = _args(node)[1], _val(first).shape[-1]
        return isinstance(shape, (list, tuple)) and len(shape) >= 1 and shape[-1] == last and nd >= 1
    if t is aten.clone.default:
        return True
    at = _DIM_AT[_target(node)]  # split, slice or cat: along a dimension other than the last
    dim = _args(node)[at] if len(_args(node)) > at else node.kwargs.get("dim", 0)
    return isinstance(dim, int) and dim % nd != nd - 1


def _row_chain(source: fx.Node, sink: fx.Node) -> list[fx.Node] | None:
    """The nodes strictly between ``source`` and ``sink`` (inclusive of ``sink``) when ``sink`` is a row-only
    function of ``source`` alone, in graph order; None otherwise. ``sink is source`` gives ``[]``."""
    if sink is source:
        return []
    chain: set[fx.Node] = set()
    todo = [sink]
    while todo:
        node = todo.pop()
        if node in chain:
            continue
        if not _keeps_rows(node):
            return None
        chain.add(node)
        for inp in node.all_input_nodes:
            if inp is not source:
                todo.append(inp)
    order = {n: i for i, n in enumerate(sink.graph.nodes)}
    return sorted(chain, key=order.__getitem__)


def _replay(graph: fx.Graph, chain: list[fx.Node], source: fx.Node, new_source: fx.Node, last: int) -> fx.Node:
    """Re-emit ``chain`` on ``new_source`` (whose last dimension is ``last``) at the graph's insertion point;
    returns the new sink."""
    mapping: dict[fx.Node, fx.Node] = {source: new_source}

    def arg(x: Any) -> Any:
        return fx.map_arg(x, lambda n: mapping.get(n, n))

    for node in chain:
        args = list(arg(_args(node)))
        if node.target in _VIEWS:
            args[1] = [*_args(node)[1][:-1], last]
        mapping[node] = _emit(graph, _target(node), tuple(args), arg(node.kwargs))
    return mapping[chain[-1]] if chain else new_source


# ------------------------------------------------------------------------------------------------ the rewrites


def _is(node: Any, target: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is target


def _meta(shape: Iterable[int], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=like.dtype, device="meta")


def _emit(graph: fx.Graph, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> fx.Node:
    """A new ``call_function`` node at the insertion point, fake-propagated over its inputs' values into
    ``meta["val"]`` (best effort: Inductor's FakeTensorUpdater recomputes what is missing)."""
    node = graph.call_function(target, args, kwargs)
    vals = fx.map_arg(_args(node), lambda n: n.meta.get("val"))
    kwvals = fx.map_arg(node.kwargs, lambda n: n.meta.get("val"))
    try:
        from torch._guards import detect_fake_mode

        flat = [v for v in (*vals, *(vals[0] if vals and isinstance(vals[0], (list, tuple)) else ()))
                if isinstance(v, torch.Tensor)]
        mode = detect_fake_mode(flat)
        if mode is not None:
            with mode:
                node.meta["val"] = node.target(*vals, **kwvals)  # type: ignore[operator]
    except Exception:  # best effort, see above
        LOG.debug("fused pass: no fake value for %s", node, exc_info=True)
    return node


def _fuse_reduce_scatter(graph: fx.Graph, wait: fx.Node, predicate: Predicate) -> bool:
    rs = _args(wait)[0]
    if not _is(rs, _REDUCE_SCATTER):
        return False
    x, reduce_op, group_size, group_name = _args(rs)[:4]
    # Find the matmul feeding the reduce-scatter through a row chain.
    mm, chain = None, None
    for cand in [x, *_ancestors(x)]:
        if _is(cand, aten.mm.default) or _is(cand, aten.addmm.default):
            chain = _row_chain(cand, x)
            if chain is not None:
                mm = cand
            break
    if mm is None or chain is None:
        return False
    # The product must feed only the reduce-scatter: otherwise the full matmul is needed anyway.
    inside = {mm, *chain}
    if any(u not in inside and u is not rs for n in inside for u in n.users):
        return False
    bias, a, b = (_args(mm)[0], _args(mm)[1], _args(mm)[2]) if mm.target is aten.addmm.default else (None, *_args(mm)[:2])
    va, vb, vout = _val(a), _val(b), _val(wait)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vout)) or va.dim() != 2:
        return False
    if bias is not None and (_ndim(bias) != 1):
        return False
    k, n = va.shape[1], vb.shape[1]
    rows = _val(x).numel() // n  # rows reaching the reduce-scatter (a row chain may select some)
    if rows % group_size:
        return False
    options = {"reduce_op": reduce_op, "bias": None if bias is None else _meta(_val(bias).shape, va)}
    if not predicate(Collective.MM_REDUCE_SCATTER, _meta((rows, k), va), _meta(vb.shape, vb), group_name,
                     group_size, **options):
        return False
    with graph.inserting_before(rs):
        moved = _replay(graph, chain, mm, a, k)  # the row chain, applied to a instead of a @ b
        flat = _emit(graph, aten.reshape.default, (moved, [rows, k])) if chain else moved
        fused = _emit(graph, torch.ops.xccl.mm_reduce_scatter.default,
                      (flat, b, group_name, group_size, reduce_op, bias, 0))
        out = _emit(graph, aten.reshape.default, (fused, list(vout.shape)))
    wait.replace_all_uses_with(out)
    for node in (wait, rs, *reversed(chain), mm):
        if not node.users:
            graph.erase_node(node)
    return True


def _fuse_all_gather(graph: fx.Graph, wait: fx.Node, predicate: Predicate) -> bool:
    ag = _args(wait)[0]
    if not _is(ag, c10d.all_gather_into_tensor.default):
        return False
    x, group_size, group_name = _args(ag)[:3]
    vx, vw = _val(x), _val(wait)
    if not isinstance(vx, torch.Tensor) or vx.dim() < 2:
        return False
    # The first matmul (in graph order) whose left operand is a row chain of the gathered tensor.
    order = {n: i for i, n in enumerate(graph.nodes)}
    for mm in sorted(_descendants(wait), key=order.__getitem__):
        if not _is(mm, aten.mm.default):
            continue
        chain = _row_chain(wait, _args(mm)[0])
        if chain is not None:
            break
    else:
        return False
    b = _args(mm)[1]
    vb = _val(b)
    if not isinstance(vb, torch.Tensor):
        return False
    k, n = vx.shape[-1], vb.shape[1]
    local_rows = vx.numel() // k
    # The gathered tensor is needed as such when anything but the chain into this matmul reads it.
    inside = set(chain)
    gather_output = any(u not in inside and u is not mm for node in (wait, *chain) for u in node.users)
    if not predicate(Collective.ALL_GATHER_MM, _meta((local_rows, k), vx), _meta(vb.shape, vb), group_name,
                     group_size, gather_output=gather_output):
        return False
    # Right after the gather's wait (or b, if later), so every reader of the gathered tensor comes after it.
    anchor = max((wait, b), key=lambda node: order.get(node, -1))
    with graph.inserting_after(anchor):
        flat = _emit(graph, aten.reshape.default, (x, [local_rows, k])) if vx.dim() != 2 else x
        fused = _emit(graph, torch.ops.xccl.all_gather_mm.default, (flat, b, group_name, group_size, gather_output, 0))
        product = _emit(graph, operator.getitem, (fused, 0))
        gathered = _emit(graph, operator.getitem, (fused, 1))
        gathered_shaped = _emit(graph, aten.reshape.default, (gathered, list(vw.shape)))
    with graph.inserting_before(mm):
        shaped = _emit(graph, aten.reshape.default, (product, [*vw.shape[:-1], n]))
        result = _emit(graph, aten.reshape.default, (_replay(graph, chain, wait, shaped, n), list(_val(mm).shape)))
    mm.replace_all_uses_with(result)
    graph.erase_node(mm)
    if gather_output:
        wait.replace_all_uses_with(gathered_shaped)
    for node in (*reversed(chain), wait, ag, gathered_shaped, gathered):
        if not node.users:
            graph.erase_node(node)
    return True


def _ancestors(node: Any) -> list[fx.Node]:
    """Inputs reachable through row ops only, nearest first."""
    out: list[fx.Node] = []
    todo = [node] if isinstance(node, fx.Node) else []
    seen: set[fx.Node] = set()
    while todo:
        cur = todo.pop(0)
        if cur in seen:
            continue
        seen.add(cur)
        if cur is not node:
            out.append(cur)
        if cur is node or _keeps_rows(cur):
            todo.extend(cur.all_input_nodes)
    return out


def _descendants(node: fx.Node) -> list[fx.Node]:
    """Users reachable through row ops only (and the first non-row users)."""
    out: list[fx.Node] = []
    todo, seen = list(node.users), set()
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        out.append(cur)
        if _keeps_rows(cur):
            todo.extend(cur.users)
    return out


def fuse_matmul_collectives(graph: fx.Graph | fx.GraphModule, predicate: Predicate | None = None) -> int:
    """Rewrite matmul + collective pairs in ``graph`` into xccl's fused ops (see the module docstring).

    Args:
        graph: a post-autograd FX graph (or its GraphModule), with ``meta["val"]`` on its nodes.
        predicate: may the pass emit a fused op here (default :func:`plugin_predicate`).

    Returns:
        The number of rewrites; also added to ``torch._dynamo.utils.counters["xccl"]``.
    """
    g = graph.graph if isinstance(graph, fx.GraphModule) else graph
    predicate = predicate or plugin_predicate
    done = {"mm_reduce_scatter": 0, "all_gather_mm": 0}
    # Each rewrite erases only its own wait node, so the list stays valid.
    for wait in [n for n in g.nodes if _is(n, c10d.wait_tensor.default)]:
        if _fuse_reduce_scatter(g, wait, predicate):
            done["mm_reduce_scatter"] += 1
        elif _fuse_all_gather(g, wait, predicate):
            done["all_gather_mm"] += 1
    total = sum(done.values())
    if total:
        from torch._inductor.pattern_matcher import stable_topological_sort

        stable_topological_sort(g)
        g.lint()
        if isinstance(graph, fx.GraphModule):
            graph.recompile()
        from torch._dynamo.utils import counters

        for name, count in done.items():
            counters["xccl"][f"fused_{name}"] += count
        LOG.debug("fused pass: %s", done)
    return total


# ------------------------------------------------------------------------------------------------ Inductor hook

_SOURCES: Final = (str(Path(__file__)), str(Path(__file__).with_name("_ops.py")))


def _plugin_identity() -> str:
    try:
        runtime = PROCESS.runtime
        if runtime is None:
            return "uninitialised"
        kernels = sorted(op.value for op in runtime.kernels() if op in (
            Collective.MM_REDUCE_SCATTER, Collective.ALL_GATHER_MM, Collective.MM_ALL_REDUCE))
        return f"{runtime.plugin.name}:{runtime.simulate}:{','.join(kernels)}"
    except Exception:  # the identity only salts a cache key
        return "unknown"


class FusedMatmulPass(CustomGraphPass):
    """:func:`fuse_matmul_collectives` as an Inductor post-grad pass, with a cache-safe ``uuid()``.

    Example::

        with torch._inductor.config.patch(post_grad_custom_post_pass=FusedMatmulPass()):
            compiled = torch.compile(model)
    """

    def __init__(self, predicate: Predicate | None = None) -> None:
        self.predicate = predicate

    def __call__(self, graph: fx.Graph) -> None:
        fuse_matmul_collectives(graph, self.predicate)

    def uuid(self) -> bytes:
        """Hash of the pass's source files and the plugin (whose kernels' predicates it consults)."""
        extra = _plugin_identity() + ("" if self.predicate is None else f":{getattr(self.predicate, '__qualname__', '?')}")
        return get_hash_for_files(_SOURCES, extra=extra)
