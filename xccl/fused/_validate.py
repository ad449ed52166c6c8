"""Validation of the fused ops' arguments: shapes, dtypes, devices and options every rank can check alone.

The checks read shapes, dtypes and devices only, so they also run on the meta tensors of a traced graph (the
fake implementations of the graph ops call them) and raise the same :class:`~xccl.InvalidArgument` in both modes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch

from ..errors import InvalidArgument
from ..plugin._capabilities import reduce_op_name

__all__ = [
    "DIFFERENTIABLE_OPS",
    "check_all_gather_mm",
    "check_chunks",
    "check_mm_all_reduce",
    "check_mm_reduce_scatter",
]

_FLOAT_DTYPES: Final = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_REDUCE_OPS: Final = ("sum", "avg", "max", "min", "product")
#: Reduce ops with a gradient.
DIFFERENTIABLE_OPS: Final = ("sum", "avg")


def _check_tensor(op: str, what: str, t: Any, device_type: str | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(op, f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if device_type is not None and t.device.type not in (device_type, "meta"):
        raise InvalidArgument(
            op, f"{what} is on {t.device}, but this group's backend takes {device_type} tensors; move it with .to()"
        )
    if t.dtype not in _FLOAT_DTYPES:
        raise InvalidArgument(op, f"{what} has dtype {t.dtype}; fused ops take float32, float64, float16, bfloat16")
    return t


def _check_common(
    op: str, a: Any, b: Any, bias: Any, device_type: str | None, a_dims: Sequence[int] = (2,)
) -> None:
    _check_tensor(op, "a", a, device_type)
    _check_tensor(op, "b", b, device_type)
    if a.dim() not in a_dims:
        want = " or ".join(f"{d}-D" for d in a_dims)
        raise InvalidArgument(op, f"a must be {want}, got shape {tuple(a.shape)}")
    if b.dim() != 2:
        raise InvalidArgument(op, f"b must be 2-D (k, n), got shape {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise InvalidArgument(
            op, f"a's last dimension ({a.shape[-1]}) must equal b's first (k={b.shape[0]}): a {tuple(a.shape)}, "
            f"b {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise InvalidArgument(op, f"a and b dtypes differ ({a.dtype} vs {b.dtype}); cast one of them")
    if a.device != b.device:
        raise InvalidArgument(op, f"a is on {a.device}, b on {b.device}; put both on the same device")
    if bias is not None:
        _check_tensor(op, "bias", bias, device_type)
        if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise InvalidArgument(op, f"bias must be 1-D with n={b.shape[1]} elements, got shape {tuple(bias.shape)}")
        if bias.dtype != a.dtype:
            raise InvalidArgument(op, f"bias dtype {bias.dtype} differs from a's {a.dtype}")


def check_chunks(op: str, chunks: Any) -> int:
    """Normalise ``chunks``: ``None`` -> 0 (choose from the shape), else a positive int."""
    if chunks is None:
        return 0
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise InvalidArgument(op, f"chunks={chunks!r} must be a positive integer, or None to choose from the shape")
    return chunks


def _check_reduce_op(op: str, reduce_op: Any) -> str:
    try:
        name = reduce_op_name(reduce_op)
    except Exception:  # any unreadable value is the caller's error
        name = repr(reduce_op)
    if name not in _REDUCE_OPS:
        raise InvalidArgument(op, f"reduce_op={reduce_op!r} is not supported; use one of {', '.join(_REDUCE_OPS)}")
    return name


def check_mm_reduce_scatter(
    a: Any, b: Any, world_size: int, reduce_op: Any, bias: Any, device_type: str | None = None
) -> str:
    """Validate ``mm_reduce_scatter``'s arguments; returns the reduce op's name. Works on meta/fake tensors."""
    op = "mm_reduce_scatter"
    _check_common(op, a, b, bias, device_type)
    name = _check_reduce_op(op, reduce_op)
    if a.shape[0] % world_size:
        raise InvalidArgument(
            op, f"a has {a.shape[0]} rows, not divisible by the group's {world_size} ranks; pad m to a multiple "
            f"of {world_size}"
        )
    return name


def check_all_gather_mm(a: Any, b: Any, world_size: int, gather_output: Any, device_type: str | None = None) -> None:
    """Validate ``all_gather_mm``'s arguments. Works on meta/fake tensors."""
    op = "all_gather_mm"
    _check_common(op, a, b, None, device_type)
    if not isinstance(gather_output, bool):
        raise InvalidArgument(op, f"gather_output must be a bool, got {type(gather_output).__name__}")


def check_mm_all_reduce(a: Any, b: Any, world_size: int, bias: Any, device_type: str | None = None) -> None:
    """Validate ``mm_all_reduce``'s arguments. Works on meta/fake tensors."""
    _check_common("mm_all_reduce", a, b, bias, device_type, a_dims=(2, 3))
