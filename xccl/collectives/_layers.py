"""The layers an emulated resolution puts around a kernel: avg as sum, premul_sum as sum, a dtype cast, complex as
real.

Each layer is a kernel wrapping a kernel (``kernel(*kernel_args, async_op)``), and finds the arguments it
rewrites from the op's :class:`~xccl.ops._specs.Spec`: which arguments are tensors, whether the op reads
or writes them, where the reduce op and the root are. Order, outermost first: complex view, cast, premul, avg.

* **avg as sum**: the reduce op becomes SUM; the written tensors are divided by the group size afterwards (on the
  root only, for reduce). Integers divide with truncation, as gloo's AVG would if it had one.
* **premul_sum as sum** (gloo and SCCL lack PREMUL_SUM; FSDP2 uses it for a gradient divide factor): the inputs
  are multiplied by the op's factor first, then summed, as NCCL and HCCL do on the device. A tensor the op
  updates in place (all_reduce's, reduce's) is scaled in place, since the result overwrites it; a tensor it only
  reads (reduce_scatter's input) is scaled into a scratch copy, so the caller's input is left untouched.
* **cast**: for ops that only move bytes between dtypes of one size (bool as uint8, float64 as int64), a free
  ``view``; otherwise a converting copy in, and a copy back into the caller's written tensors. Reductions over
  bool run on the cast dtype as max/min, which is logical or/and.
* **complex as real**: ``torch.view_as_real`` on every tensor (free: the result aliases the input), as
  ``torch.distributed``'s own wrappers do; element counts (all_to_all_v's matrix) double. Only sum, avg and
  premul_sum are defined for complex numbers, which the capability table enforces.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final

import torch
import torch.distributed as dist

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..ops._vocab import premul_factor
from ..plugin._capabilities import BOOL_REDUCE_AS, Resolution, reduce_op_name, reduce_op_of
from ..plugin._work import finish

__all__ = ["BOOL_OPS", "describe", "wrap"]

R = dist.ReduceOp
Kernel = Callable[..., Any]
K = S.Kind

#: Reductions over bool as they run on the cast dtype (``BOOL_REDUCE_AS``: sum is "or", product is "and").
BOOL_OPS: Final = {name: reduce_op_of(as_name) for name, as_name in BOOL_REDUCE_AS.items()}
_WRITTEN: Final = (S.Access.WRITE, S.Access.UPDATE)


def wrap(spec: S.Spec, st: Any, res: Resolution, kernel: Kernel) -> Kernel:
    """``kernel`` with the layers ``res`` asks for."""
    if res.avg_via_sum:
        kernel = partial(_avg, spec, st, kernel)
    if res.premul_via_sum:
        kernel = partial(_premul, spec, st, kernel)
    if res.cast is not None:
        kernel = _cast_for(spec, st, kernel, res.cast)
    if res.complex_view:
        kernel = partial(_complex, spec, kernel)
    return kernel


# -------------------------------------------------------------------------------------------------------- avg


def _avg(spec: S.Spec, st: Any, base: Kernel, *kargs: Any) -> Any:
    args, a = list(kargs[:-1]), kargs[-1]
    args[spec.reduce_op_index] = R.SUM  # type: ignore[index]
    is_root = spec.key is not S.C.REDUCE or args[spec.index("dst")] == st.rank
    written = [args[i] for i, arg in enumerate(spec.args) if arg.access in _WRITTEN] if is_root else []
    work = base(*args, a)

    def divide() -> None:
        for value in written:
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if t.is_floating_point() or t.is_complex():
                    t.div_(st.size)
                else:
                    t.copy_(torch.div(t, st.size, rounding_mode="trunc"))

    return finish(work, a, divide)


# ------------------------------------------------------------------------------------------------- premul_sum


def _premul(spec: S.Spec, st: Any, base: Kernel, *kargs: Any) -> Any:
    args, a = list(kargs[:-1]), kargs[-1]
    at = spec.reduce_op_index
    factor = premul_factor(args[at])  # type: ignore[index]
    args[at] = R.SUM  # type: ignore[index]
    leases: list[Any] = []

    def scaled(t: torch.Tensor) -> torch.Tensor:
        lease = st.scratch.take(t.numel(), t.dtype, t.device)
        leases.append(lease)
        return torch.mul(t.reshape(-1), factor, out=lease.tensor).view(t.shape)

    for i, arg in enumerate(spec.args):
        if not arg.holds_tensors or args[i] is None:
            continue
        if arg.access is S.Access.UPDATE:
            for t in _flat(args[i]):
                t.mul_(factor)
        elif arg.access is S.Access.READ:
            args[i] = _map(args[i], scaled)
    work = base(*args, a)

    def release() -> None:
        for lease in leases:
            lease.release()

    return finish(work, a, release if leases else None)


# ------------------------------------------------------------------------------------------------------- cast


def _cast_for(spec: S.Spec, st: Any, base: Kernel, dst: torch.dtype) -> Kernel:
    """The cast layer, built per source dtype on first use (the plan is keyed by dtype, known only per call)."""
    cache: dict[torch.dtype, Kernel] = {}

    def kernel(*kargs: Any) -> Any:
        src = S.Spec.dtype_of(spec, kargs)
        k = cache.get(src)  # type: ignore[arg-type]
        if k is None:
            k = cache[src] = _cast(spec, st, base, src, dst)  # type: ignore[index,arg-type]
        return k(*kargs)

    return kernel


def _cast(spec: S.Spec, st: Any, base: Kernel, src: torch.dtype, dst: torch.dtype) -> Kernel:
    redop_at = spec.reduce_op_index
    by_view = redop_at is None and src.itemsize == dst.itemsize

    def convert(t: torch.Tensor, access: S.Access | None) -> torch.Tensor:
        if by_view:
            return t.view(dst)  # aliases t: nothing to copy back
        return torch.empty_like(t, dtype=dst) if access is S.Access.WRITE else t.to(dst)

    def kernel(*kargs: Any) -> Any:
        args, a = list(kargs[:-1]), kargs[-1]
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, arg in enumerate(spec.args):
            value = args[i]
            if value is None or not arg.holds_tensors:
                continue
            new = _map(value, partial(convert, access=arg.access))
            args[i] = new
            if arg.access is not S.Access.READ and not by_view:
                copies.extend(zip(_flat(value), _flat(new), strict=True))
        if redop_at is not None and src == torch.bool:
            name = reduce_op_name(args[redop_at])
            if name not in BOOL_OPS:
                raise UnsupportedCollective(spec.name, st.backend, f"reduce op {name!r} over bool")
            args[redop_at] = BOOL_OPS[name]
        work = base(*args, a)

        def copy_back() -> None:
            for orig, new in copies:
                orig.copy_(new)

        return finish(work, a, copy_back if copies else None)

    return kernel


# ---------------------------------------------------------------------------------------------------- complex


def _complex(spec: S.Spec, base: Kernel, *kargs: Any) -> Any:
    args = list(kargs)
    for i, arg in enumerate(spec.args):
        value = args[i]
        if value is None:
            continue
        if arg.holds_tensors:
            args[i] = _map(value, _as_real)
        elif arg.kind is K.MATRIX:
            args[i] = [[2 * c for c in row] for row in value]
    return base(*args)


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


# ---------------------------------------------------------------------------------------------------- helpers


def _map(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` over a tensor, a list of tensors or a list of lists of them."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    return [_map(v, fn) for v in value]


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def describe(spec: S.Spec, res: Resolution, dtype: torch.dtype | None) -> list[str]:
    """The layers' part of the fallback warning: what each costs."""
    parts = []
    if res.avg_via_sum:
        parts.append("avg as sum then a local divide (no extra traffic)")
    if res.premul_via_sum:
        parts.append("premul_sum as a local scale by its factor then sum (no extra traffic; a scaled copy of an "
                     "input the op only reads)")
    if res.cast is not None:
        to = str(res.cast).removeprefix("torch.")
        base = dtype.to_real() if dtype is not None and res.complex_view else dtype
        if base is None:
            parts.append(f"dtype cast to {to}")
        else:
            ratio = res.cast.itemsize / base.itemsize
            wire = "the same bytes on the wire" if ratio == 1 else f"{ratio:g}x the bytes on the wire"
            local = "a free view" if spec.reduce_op_index is None and ratio == 1 else "a local copy each way"
            parts.append(f"{str(base).removeprefix('torch.')} cast to {to} ({wire}, {local})")
    if res.complex_view:
        parts.append("complex viewed as real (free)")
    return parts

