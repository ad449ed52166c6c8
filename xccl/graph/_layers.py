"""The local layers of a graph-mode resolution, done in the graph: a dtype cast, and avg as sum then a divide.

The twin of eager ``xccl.collectives._layers``, for a :class:`~xccl.graph._group.GraphPlan`:

* **cast**: a converting copy in (``.to``), and a copy back into the caller's written tensors. For ops that
  only move bytes this needs a conversion that is exact both ways (bool to any, a float to a wider float, an
  integer to a wider one that holds it); otherwise, between dtypes of one size, a ``view`` (bit for bit). A
  conversion rather than eager mode's view wherever both would do: a vendor graph compiler converts ``.to``
  (TorchAir: GE Cast) but may have no bit-cast of a tensor (TorchAir has no converter for ``aten.view.dtype``).
  Reductions over bool run on the cast dtype as max/min, which is logical or/and;
* **avg as sum**: the form gets ``"sum"``; the written tensors are divided by the group size afterwards (on the
  root only, for reduce; integers with truncation, as in eager mode).

Done in the graph, not by the process group's dispatch, so that a vendor graph compiler that runs the standard
collective itself (TorchAir) still gets a dtype and a reduce op it has (docs/graph.md).
"""

from __future__ import annotations

from typing import Any, Final

import torch

from ..ops import _specs as S
from ..plugin._capabilities import BOOL_REDUCE_AS
from ._group import GraphPlan, GroupInfo, assume_constant, refuse

__all__ = ["carry", "exact_conversion"]

_WRITTEN: Final = (S.Access.WRITE, S.Access.UPDATE)


def carry(spec: S.Spec, g: GroupInfo, plan: GraphPlan, form: Any, red: str | None, async_op: bool,
          kargs: tuple[Any, ...] | list[Any]) -> Any:
    """``form(g, plan.standard, red, async_op, *kargs)`` inside the layers ``plan`` asks for."""
    if plan.cast is None and not plan.avg:
        return form(g, plan.standard, red, async_op, *kargs)
    args = list(kargs)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    if plan.cast is not None:
        red = _cast(spec, g, plan.cast, red, args, copies)
    if plan.avg:
        red = "sum"
    out = form(g, plan.standard, red, async_op, *args)
    if plan.avg and (spec.key is not S.C.REDUCE or args[spec.index("dst")] == g.rank):
        for i, arg in enumerate(spec.args):
            if arg.access in _WRITTEN and args[i] is not None:
                for t in _flat(args[i]):
                    t.copy_(t / g.size if t.is_floating_point() or t.is_complex()
                            else torch.div(t, g.size, rounding_mode="trunc"))
    for orig, new in copies:
        _real(orig).copy_(new)
    return out


def _cast(spec: S.Spec, g: GroupInfo, dst: torch.dtype, red: str | None, args: list[Any],
          copies: list[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
    """Replace the tensor arguments in ``args`` by their ``dst`` form; returns the reduce op to use."""
    src = spec.dtype_of(args)
    base = src.to_real() if src is not None and src.is_complex else src
    moves = spec.reduce_op_index is None
    exact, same_size = _conversion(base, dst)
    by_view = moves and not exact and same_size
    if moves and not exact and not by_view:
        refuse(spec.name, g.backend, f"graph mode moves {src} as {dst}, which is neither an exact conversion nor a "
               "bit-for-bit view (a table entry that asks for it is wrong)")
    if spec is S.IRECV and not by_view:
        # The copy back would run when the form returns, before the handle's wait() fills the buffer.
        refuse(spec.name, g.backend, f"graph mode cannot receive {src} as {dst} with irecv; use recv")
    for i, arg in enumerate(spec.args):
        value = args[i]
        if value is None or not arg.holds_tensors:
            continue
        args[i] = _convert(value, dst, by_view, arg.access)
        if arg.access is not S.Access.READ and not by_view:
            copies.extend(zip(_flat(value), _flat(args[i]), strict=True))
    if red is not None and src == torch.bool:
        return BOOL_REDUCE_AS.get(red, red)
    return red


@assume_constant
def _conversion(src: torch.dtype | None, dst: torch.dtype) -> tuple[bool, bool]:
    """Whether converting ``src`` to ``dst`` is exact (:func:`exact_conversion`), and whether both have one size:
    a constant function: torch 2.8's Dynamo cannot read ``dtype.itemsize``."""
    return src is not None and exact_conversion(src, dst), src is not None and src.itemsize == dst.itemsize


def exact_conversion(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether ``.to(dst)`` and back gives every ``src`` value back (bool to anything, a float to a wider float,
    an integer to a wider integer that holds its range)."""
    if src == dst or src == torch.bool:
        return True
    if src.is_floating_point and dst.is_floating_point:
        return dst.itemsize > src.itemsize
    if src.is_floating_point or dst.is_floating_point or src.is_complex or dst.is_complex or dst == torch.bool:
        return False
    return dst.itemsize > src.itemsize and (dst.is_signed or not src.is_signed)


def _convert(t: Any, dst: torch.dtype, by_view: bool, access: S.Access | None) -> Any:
    """``t`` (a tensor, or a list of tensors or of lists of them) as ``dst``."""
    if not isinstance(t, torch.Tensor):
        return [_convert(x, dst, by_view, access) for x in t]
    x = _real(t)
    if by_view:
        return x.view(dst)
    return torch.empty_like(x, dtype=dst) if access is S.Access.WRITE else x.to(dst)


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]
