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
from functools import partial
from typing import Any, Final

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as dist
import torch.utils._python_dispatch as _python_dispatch
from torch._C._distributed_c10d import HashStore
from torch.utils._python_dispatch import _disable_current_modes

from ..ops._c10d import Tool
from ..ops._specs import SPECS
from ..ops._vocab import Collective
from ..plugin._fake_world import fake_backend

__all__ = ["hook", "visible", "watched"]

C = Collective
_C10D: Final = torch.ops.c10d
_modes: Final = torch._C._len_torch_dispatch_stack


def watched() -> bool:
    """Whether a dispatcher-level tool may be watching: a ``TorchDispatchMode`` was entered (torch's flag, set by
    ``TorchDispatchMode.__enter__``, process-wide) or the profiler is on. :func:`visible` asks precisely."""
    return _python_dispatch._is_in_torch_dispatch_mode or _profiler._is_profiler_enabled


_CARRIERS: Final[dict[tuple[int, int, str], Any]] = {}


def _carrier(st: Any) -> Any:
    """The group the tools see the op on: torch's ``FakeProcessGroup`` (no communication) as the backend for the
    group's device type, with the group's rank and size; built once per (rank, size, device type)."""
    key = (st.rank, st.size, st.device_type)
    carrier = _CARRIERS.get(key)
    if carrier is None:
        pg = dist.ProcessGroup(HashStore(), st.rank, st.size)
        pg._register_backend(torch.device(st.device_type), dist.ProcessGroup.BackendType.CUSTOM,
                             fake_backend(st.rank, st.size))
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        carrier = _CARRIERS[key] = pg.boxed()
    return carrier


def visible(st: Any, key: Collective, name: str, kargs: Sequence[Any], issue: Callable[[], Any],
            c10d: Tool | None = None) -> Any:
    """Run ``issue`` (the collective ``name``, capability key ``key``, with kernel arguments ``kargs``) so that the
    watching tools see it as torch's own path would show it (see the module docstring).

    Args:
        c10d: the c10d op and its argument builder, when ``key`` does not say (the coalesced tensor forms: their
            c10d method's ``tool``).
    """
    modes = _modes()  # this thread's active modes (none inside a mode's own __torch_dispatch__: it pops itself)
    if not modes and not _profiler._is_profiler_enabled:
        return issue()
    op = c10d or SPECS[key].tools.get(key)  # the dispatcher op tools are shown (the spec's), or None
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


class _Tools:
    """The hook that shows a group's calls to dispatcher-level tools while one watches (see the module docstring)."""

    __slots__ = ("st",)

    def __init__(self, st: Any) -> None:
        self.st = st

    def stage(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """Two flag reads per call; the rest only while a tool may watch."""
        st = self.st

        def shown(spec: Any, kargs: Sequence[Any], kernel: Callable[..., Any], async_op: bool) -> Any:
            if _python_dispatch._is_in_torch_dispatch_mode or _profiler._is_profiler_enabled:
                return visible(st, spec.key_of(kargs), spec.name, kargs,
                               partial(inner, spec, kargs, kernel, async_op))
            return inner(spec, kargs, kernel, async_op)

        return shown


def hook(st: Any) -> _Tools:
    """Every group's view for dispatcher-level tools (``_hooks.OBSERVERS``)."""
    return _Tools(st)
