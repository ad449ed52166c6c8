"""What dispatcher-level tools see of a collective on xccl's group: CommDebugMode, torch.profiler, DebugMode.

Such tools watch the dispatcher: ``CommDebugMode`` (a ``TorchDispatchMode``) counts the ``c10d::*`` ops it sees
go by (``torch/distributed/tensor/debug/_comm_mode.py``), and the profiler records every dispatcher op by name. A
plain process group's collectives are such ops: ``ProcessGroup::allreduce`` in C++ calls ``c10d::allreduce_``
through the dispatcher, whose kernel runs the backend. xccl's group overrides those methods in Python to run its
dispatch, and a Python ``Backend`` cannot exist (no Python constructor), so no ``c10d::*`` kernel can lead into
xccl. Hence, only while a tool watches (:func:`watched`: a dispatch mode was entered or the profiler is on; two
module flags that torch keeps, read on the hot path, about 40 ns each; the dispatch-mode stack itself is asked
only then, as its C call costs several times that):

* with a dispatch mode active, the collective runs with the modes set aside (so the vendor's own ``c10d::*`` calls
  underneath, in simulation, are not counted too), then its ``c10d::*`` op goes through the dispatcher once, with
  the caller's tensors, on a *carrier* group whose backend is torch's ``FakeProcessGroup`` (it communicates
  nothing): every mode sees the op torch's own path would show, once, after the data has moved;
* with only the profiler on, the collective runs inside ``record_function("c10d::<op>")``, the name torch's
  path records, spanning the real work.

Collectives without a ``c10d::*`` op (the uneven ones, all_to_all_v, monitored_barrier) show in the profiler as
``xccl::<op>``; CommDebugMode counts nothing for them, as it would for any op outside its list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as dist
import torch.utils._python_dispatch as _python_dispatch
from torch._C._distributed_c10d import FakeProcessGroup, HashStore
from torch.utils._python_dispatch import _disable_current_modes

from ..plugin._capabilities import Collective

__all__ = ["COALESCED", "visible", "watched"]

C = Collective
_C10D: Final = torch.ops.c10d
_modes: Final = torch._C._len_torch_dispatch_stack


def watched() -> bool:
    """Whether a dispatcher-level tool may be watching: a ``TorchDispatchMode`` was entered (torch's flag, set by
    ``TorchDispatchMode.__enter__``, process-wide) or the profiler is on. :func:`visible` asks precisely."""
    return _python_dispatch._is_in_torch_dispatch_mode or _profiler._is_profiler_enabled


def _sum() -> Any:
    # The only ReduceOp torch lets Python hand to a c10d op (the script class has no other constructor); the carrier
    # computes nothing, and the tools read the op's name and tensors.
    return torch.classes.c10d.ReduceOp()


#: Capability key -> (c10d op name, its arguments from the kernel arguments and the carrier group ``b``).
_OPS: Final[dict[Collective, tuple[str, Callable[[Sequence[Any], Any], tuple[Any, ...]]]]] = {
    C.ALL_REDUCE: ("allreduce_", lambda k, b: ([k[0]], b, _sum(), None, False)),
    C.ALL_REDUCE_COALESCED: ("allreduce_coalesced_", lambda k, b: (list(k[0]), b, _sum(), False)),
    C.ALL_GATHER: ("allgather_", lambda k, b: ([list(k[0])], [k[1]], b, False)),
    C.ALL_GATHER_COALESCED: ("allgather_coalesced_", lambda k, b: ([list(o) for o in k[0]], list(k[1]), b, False)),
    C.ALL_GATHER_INTO_TENSOR: ("_allgather_base_", lambda k, b: (k[0], k[1], b, False)),
    C.REDUCE_SCATTER: ("reduce_scatter_", lambda k, b: ([k[0]], [list(k[1])], b, _sum(), False)),
    C.REDUCE_SCATTER_TENSOR: ("_reduce_scatter_base_", lambda k, b: (k[0], k[1], b, _sum(), False)),
    C.ALL_TO_ALL: ("alltoall_", lambda k, b: (list(k[0]), list(k[1]), b, False)),
    C.ALL_TO_ALL_SINGLE: ("alltoall_base_", lambda k, b: (k[0], k[1], b, list(k[2] or []), list(k[3] or []), False)),
    C.BROADCAST: ("broadcast_", lambda k, b: ([k[0]], b, k[1], 0, False)),
    C.REDUCE: ("reduce_", lambda k, b: ([k[0]], b, _sum(), k[1], 0, False)),
    C.GATHER: ("gather_", lambda k, b: ([list(k[1])] if k[1] else [], [k[0]], b, k[2], False)),
    C.SCATTER: ("scatter_", lambda k, b: ([k[0]], [list(k[1])] if k[1] else [], b, k[2], False)),
    C.SEND: ("send", lambda k, b: ([k[0]], b, k[1], k[2])),
    C.RECV: ("recv_", lambda k, b: ([k[0]], b, k[1], k[2])),
}
#: The c10d op of the coalesced tensor forms (xccl's group runs them as one collective per pair).
COALESCED: Final[dict[str, tuple[str, Callable[[Sequence[Any], Any], tuple[Any, ...]]]]] = {
    "allgather_into_tensor_coalesced": (
        "allgather_into_tensor_coalesced_", lambda k, b: (list(k[0]), list(k[1]), b, False)),
    "reduce_scatter_tensor_coalesced": (
        "reduce_scatter_tensor_coalesced_", lambda k, b: (list(k[0]), list(k[1]), b, _sum(), False)),
}


def _c10d_op(key: Collective, kargs: Sequence[Any]) -> tuple[str, Any] | None:
    if key is C.BARRIER:
        return "barrier", None
    if key is C.RECV and kargs[1] is None:
        return "recv_any_source_", lambda k, b: ([k[0]], b, k[2])
    if key is C.ALL_TO_ALL_SINGLE_UNEVEN:
        key = C.ALL_TO_ALL_SINGLE
    return _OPS.get(key)


def _carrier(st: Any) -> Any:
    """The group the tools see the op on: torch's ``FakeProcessGroup`` (no communication) as the backend for the
    group's device type, with the group's rank and size; built once per group."""
    if st.carrier is None:
        pg = dist.ProcessGroup(HashStore(), st.rank, st.size)
        pg._register_backend(torch.device(st.device_type), dist.ProcessGroup.BackendType.CUSTOM,
                             FakeProcessGroup._create_internal(st.rank, st.size))
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        st.carrier = pg.boxed()
    return st.carrier


def visible(st: Any, key: Collective, name: str, kargs: Sequence[Any], issue: Callable[[], Any],
            c10d: tuple[str, Any] | None = None) -> Any:
    """Run ``issue`` (the collective ``name``, capability key ``key``, with kernel arguments ``kargs``) so that the
    watching tools see it as torch's own path would show it (see the module docstring).

    Args:
        c10d: the c10d op and its argument builder, when ``key`` does not say (the coalesced tensor forms).
    """
    modes = _modes()  # this thread's active modes (none inside a mode's own __torch_dispatch__: it pops itself)
    if not modes and not _profiler._is_profiler_enabled:
        return issue()
    op = c10d or _c10d_op(key, kargs)
    if not modes:  # the profiler only: name the real work as torch's path would
        with _profiler.record_function(f"c10d::{op[0]}" if op else f"xccl::{name}"):
            return issue()
    with _disable_current_modes():
        result = issue()
    if op is not None:
        b = _carrier(st)
        if op[0] == "barrier":
            _C10D.barrier.default(torch.empty(1, device=torch.device(st.device_type)), b, [], False)
        else:
            getattr(_C10D, op[0]).default(*op[1](kargs, b))
    return result
