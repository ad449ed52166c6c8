"""What every composition is made of: the building-block runner's type, scratch leases, the host reduction.

A composition (``_emulate``, ``_uneven``) is a kernel ``fn(st, call, *kernel_args, async_op)``. ``call(spec,
kernel_args, async_op=False)`` runs a building block on the same group through dispatch (blocking by default);
a composition runs its *last* block with the caller's ``async_op`` through :func:`last`, so an asynchronous
emulated call returns while that block is in flight, and its local step (a reduction, a copy out) runs when the
handle completes.

Temporaries come from the group's scratch pool (``_scratch``) through :func:`take` and go back once the last
building block has completed: at once when blocking, in the handle's ``then`` step when asynchronous, never while
a collective that uses them may be in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch

from ..errors import UnsupportedCollective
from ..ops import _specs as S
from ..ops._vocab import premul_factor
from ..plugin._capabilities import reduce_op_name
from ..plugin._work import finish
from ._scratch import Lease

__all__ = ["Call", "last", "local_reduce", "nothing", "take"]

#: Runs a building block on the composition's group: ``call(spec, kernel_args, async_op=False)``.
Call = Callable[..., Any]

_LOCAL: Final[dict[str, Callable[..., torch.Tensor]]] = {
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def local_reduce(stack: torch.Tensor, op: Any, out: torch.Tensor) -> None:
    """Reduce ``stack`` (ranks along dim 0) with ``op`` (a ``ReduceOp`` or its name) into ``out``, in rank order.

    ``out`` (contiguous, ``stack[0].numel()`` elements, not aliasing ``stack``) is the accumulator: no temporary.
    """
    name = reduce_op_name(op)
    n = stack.shape[0]
    rows, acc = stack.reshape(n, out.numel()), out.view(-1)
    if name in ("sum", "avg", "premul_sum"):
        fn: Callable[..., torch.Tensor] = torch.add
    else:
        fn = _LOCAL.get(name)  # type: ignore[assignment]
        if fn is None:
            raise UnsupportedCollective("local reduction", "xccl emulation", f"reduce op {name!r} cannot be emulated")
    # Accumulate in rank order, as a ring does, so float results match the native kernel's up to rounding.
    if n == 1:
        acc.copy_(rows[0])
    else:
        fn(rows[0], rows[1], out=acc)
    for i in range(2, n):
        fn(acc, rows[i], out=acc)
    if name == "avg":
        if acc.is_floating_point() or acc.is_complex():
            acc.div_(n)
        else:
            torch.div(acc, n, rounding_mode="trunc", out=acc)
    elif name == "premul_sum":
        acc.mul_(premul_factor(op))


def take(st: Any, numel: int, like: torch.Tensor) -> Lease:
    """Lend a scratch buffer of ``numel`` elements of ``like``'s dtype and device from ``st``'s pool."""
    return st.scratch.take(numel, like.dtype, like.device)  # type: ignore[no-any-return]


def last(call: Call, spec: S.Spec, kargs: Sequence[Any], a: bool, then: Callable[[], object], *leases: Lease) -> Any:
    """Run a composition's last building block (asynchronously when ``a``), then ``then`` and give the leases
    back: now, or when the returned handle completes."""

    def done() -> None:
        then()
        for lease in leases:
            lease.release()

    return finish(call(spec, kargs, a), a, done)


def nothing() -> None:
    """A composition's local step when it has none (its last block wrote the caller's output)."""
