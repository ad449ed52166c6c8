"""What the installed torch's gloo lacks or gets wrong, in a simulated vendor group: composed from what it has.

A simulated vendor computes with gloo and must compute what the vendor does. HCCL's reduce-scatter applies its
reduce op on every torch, while gloo's sums whatever op it is given on torch 2.7 and 2.8, and 2.7's has neither AVG
nor the list reduce_scatter (``xccl.ops._torch``). On such a torch :func:`call` runs those calls as compositions of
what that gloo has: a reduce-scatter as an all_reduce of a copy and a slice (a simulation's bytes do not matter, its
results do), AVG as SUM then a divide. The list all_to_all gloo lacks before 2.12 takes the simulated group's own
flat path (``_sim._alltoall``). On a torch whose gloo has it all, :func:`call` is the plain gloo call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch
import torch.distributed as dist

from ..ops import _specs as S
from ..ops._torch import GLOO_AVG, GLOO_REDUCE_SCATTER, GLOO_REDUCE_SCATTER_OPS, TORCH
from ..ops._vocab import reduce_op_name
from ._work import Work

__all__ = ["call"]

_SUM: Final = dist.ReduceOp.SUM


def _avg_as_sum(opts: Any) -> bool:
    """Whether ``opts`` asks for AVG, which this gloo lacks, so that the call runs SUM and the caller divides."""
    return not TORCH.has(GLOO_AVG) and reduce_op_name(opts.reduceOp) == "avg"


def _summing(opts: Any) -> Any:
    """A copy of ``opts`` that says SUM: never ``opts`` itself, which xccl's kernels cache and reuse per op."""
    new = type(opts)()
    for name in ("rootRank", "rootTensor", "timeout", "asyncOp"):
        if hasattr(opts, name):
            setattr(new, name, getattr(opts, name))
    new.reduceOp = _SUM
    return new


def _divide(tensors: list[torch.Tensor], n: int) -> None:
    for t in tensors:
        if t.is_floating_point():
            t.div_(n)
        else:
            t.copy_(torch.div(t, n, rounding_mode="trunc"))


def _reducing(inner: Any, method: str, tensors: list[torch.Tensor], opts: Any) -> Any:
    """``allreduce``/``reduce``/``allreduce_coalesced``: AVG as SUM then a divide where gloo has no AVG."""
    if not _avg_as_sum(opts):
        return getattr(inner, method)(tensors, opts)
    work = getattr(inner, method)(tensors, _summing(opts))
    return Work([work], then=lambda: _divide(tensors, inner.size()))


def _scattered(inner: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]], opts: Any) -> Any:
    """A reduce-scatter of each (output, stacked input) pair: an all_reduce of a copy of the input with ``opts``'s
    op, then this rank's slice."""
    avg = _avg_as_sum(opts)
    whole = [inp.detach().clone().reshape(inner.size(), -1) for _, inp in pairs]
    ar: Any = dist.AllreduceOptions()
    ar.reduceOp = _SUM if avg else opts.reduceOp
    works = [inner.allreduce([w], ar) for w in whole]

    def slice_out() -> None:
        if avg:
            _divide(whole, inner.size())
        for (out, _), w in zip(pairs, whole, strict=True):
            out.copy_(w[inner.rank()].view(out.shape))

    return Work(works, then=slice_out)


def _reduce_scatter_base(inner: Any, method: str, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
    return _scattered(inner, [(out, inp)], opts)


def _reduce_scatter(inner: Any, method: str, outs: list[torch.Tensor], ins: list[list[torch.Tensor]],
                    opts: Any) -> Any:
    return _scattered(inner, [(o, torch.stack(i)) for o, i in zip(outs, ins, strict=True)], opts)


def _reduce_scatter_coalesced(inner: Any, method: str, outs: list[torch.Tensor], ins: list[torch.Tensor],
                              opts: Any) -> Any:
    return _scattered(inner, list(zip(outs, ins, strict=True)), opts)


_Fix = Callable[..., Any]
#: ``Backend`` method -> its composition on this torch's gloo (the methods each op's spec names); methods gloo runs
#: right are left out.
_FIXES: Final[dict[str, _Fix]] = {
    **({} if TORCH.has(GLOO_AVG) else {m.name: _reducing for spec in (S.ALL_REDUCE, S.REDUCE, S.ALL_REDUCE_COALESCED)
                                       for m in spec.c10d}),
    **({} if TORCH.has(GLOO_REDUCE_SCATTER_OPS) and TORCH.has(GLOO_REDUCE_SCATTER) else {
        **{m.name: _reduce_scatter for m in S.REDUCE_SCATTER.c10d},
        **{m.name: _reduce_scatter_coalesced if m.pairs else _reduce_scatter_base for m in S.REDUCE_SCATTER_TENSOR.c10d},
    }),
}


def call(inner: Any, key: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``inner.<method>(*args, **kwargs)`` (``key``: the ``Backend`` method it reaches), composed where this
    torch's gloo lacks it or gets it wrong."""
    fix = _FIXES.get(key)
    if fix is None:
        return getattr(inner, method)(*args, **kwargs)
    return fix(inner, method, *args, **kwargs)
