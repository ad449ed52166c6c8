"""What every collective should return, computed on CPU from the known inputs of every rank: the kit's reference.

The reference is independent of the plugin under test and of xccl's simulation: it is the operation's
mathematical result, computed with plain tensor arithmetic in a wide dtype (int64 for integers and bool, float64
for floating point) and converted once to the call's dtype. A plugin's table and its simulation profile come from
the same author's facts, so comparing the plugin with its own simulation would only show that the two agree; this
shows that they are right.

Inputs are small integers (:func:`make`), so that every dtype a table may claim holds them exactly (float8
included) and sums and averages over the tested world sizes stay exact; where an integer result overflows its
dtype the reference wraps, as every library's fixed-width arithmetic does.

Semantics, per dtype:

* floating point: ``sum``, ``product``, ``min``, ``max``, ``avg`` (sum / n), ``premul_sum`` (factor x sum); the
  bitwise ops are undefined;
* integers: the same, with ``avg`` the sum divided with truncation (what xccl's sum-then-divide computes) and the
  bitwise ops defined;
* bool: logical, as every library that reduces bool does it (``sum`` and ``max`` and ``bor`` are "or",
  ``product`` and ``min`` and ``band`` are "and", ``bxor`` is "xor"); ``avg`` and ``premul_sum`` are undefined.

An undefined result is :data:`UNDEFINED`-shaped (an empty tensor), which no output matches: a table that claims
such a shape fails the kit with "has no defined result".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import torch

__all__ = ["BITWISE", "PREMUL", "make", "mismatch", "reduce_ref"]

#: The scale of the premul_sum cases.
PREMUL: Final = 2.0

_UNSIGNED: Final = frozenset({torch.uint8, torch.uint16, torch.uint32, torch.uint64})
#: The bitwise reduce ops: undefined over floating point.
BITWISE: Final = frozenset({"band", "bor", "bxor"})
#: Bool reductions as integer ones over 0 and 1.
_BOOL_AS: Final = {"sum": "max", "product": "min", "bor": "max", "band": "min", "min": "min", "max": "max",
                   "bxor": "bxor"}
_COMBINE: Final[dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "sum": torch.add,
    "avg": torch.add,
    "premul_sum": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def make(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s deterministic input: integers in [-4, 4] ([0, 4] for unsigned dtypes, {0, 1} for bool),
    exact in every dtype a table may claim."""
    gen = torch.Generator().manual_seed(7919 * rank + 104729 * salt + 1)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(dtype)
    low = 0 if dtype in _UNSIGNED else -4
    return torch.randint(low, 5, shape, generator=gen).to(dtype)


def reduce_ref(ts: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction ``op`` of ``ts`` (one tensor per rank, in rank order), in their dtype; an empty tensor when
    ``op`` has no defined result over that dtype (bitwise ops over floats, avg over bool)."""
    dtype = ts[0].dtype
    undefined = ts[0].new_empty((0,))
    floating = dtype.is_floating_point
    if (floating and op in BITWISE) or (dtype == torch.bool and op not in _BOOL_AS):
        return undefined
    name = _BOOL_AS[op] if dtype == torch.bool else op
    wide = [t.to(torch.float64 if floating else torch.int64) for t in ts]
    acc = wide[0]
    for t in wide[1:]:
        acc = _COMBINE[name](acc, t)
    if op == "avg":
        acc = acc / len(ts) if floating else torch.div(acc, len(ts), rounding_mode="trunc")
    elif op == "premul_sum":
        acc = acc * PREMUL if floating else (acc.to(torch.float64) * PREMUL).to(torch.int64)
    bits = 8 * ts[0].element_size()
    if not floating and dtype != torch.bool and bits < 64:
        # Fixed-width arithmetic wraps; a direct conversion from int64 would be undefined for some dtypes.
        acc = acc % (1 << bits)
        if dtype not in _UNSIGNED:
            acc = torch.where(acc >= 1 << (bits - 1), acc - (1 << bits), acc)
    return acc.to(dtype)


def mismatch(got: object, want: torch.Tensor) -> str | None:
    """Why ``got`` is not ``want`` (None when it is): dtype, shape, then values."""
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a tensor"
    got = got.detach().cpu()
    if want.numel() == 0 and got.numel() != 0:
        return (f"the op has no defined result over {str(want.dtype).removeprefix('torch.')} with this reduce op, "
                "yet the call returned one")
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if want.is_floating_point():
        tol = 1e-5 if want.element_size() >= 4 else 1e-2 if want.element_size() == 2 else 0.13
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        # Compared as int64: torch has no equality kernel for every unsigned dtype.
        ok = torch.equal(got.to(torch.int64), want.to(torch.int64))
    if ok:
        return None
    shown = torch.float64 if want.is_floating_point() else torch.int64
    return (f"values {got.to(shown).flatten()[:8].tolist()}..., expected "
            f"{want.to(shown).flatten()[:8].tolist()}...")
