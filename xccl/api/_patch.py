"""``xccl.patch_collectives()``: make code that calls ``torch.distributed`` (or DeepSpeed) directly compile.

Each patched function is replaced by a wrapper that calls the original unchanged in eager mode and, while
``torch.compile`` traces, xccl's function of the same name and signature, whose graph form Dynamo inlines: so
broadcast, reduce, gather, scatter, barrier and send/recv (which break the graph in torch 2.13) and DeepSpeed's
all_reduce (behind its ``timed_op`` wrapper) compile without a break. What the patch reaches: docs/graph.md.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any, Final

import torch

from ..errors import InvalidArgument
from ..ops import _specs as S
from ..ops._vocab import Collective as C
from . import _collectives as A
from . import _p2p as P

__all__ = ["Patch", "patch_collectives"]

_compiling: Final = torch.compiler.is_compiling

#: torch.distributed function name -> xccl's function with the same signature (the aliases torch 2.13 keeps
#: included): the specs' ``torch_functions``, each served by xccl's function of the spec's name.
TORCH_NAMES: Final[dict[str, Callable[..., Any]]] = {
    name: getattr(P if spec.key in (C.SEND, C.RECV) else A, spec.name)
    for spec in (*dict.fromkeys(S.SPECS.values()), S.ISEND, S.IRECV) for name in spec.torch_functions
}
_TORCH_MODULES: Final = ("torch.distributed", "torch.distributed.distributed_c10d")


def _ds_all_reduce(
    tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False, *args: Any, **kwargs: Any
) -> Any:
    """Graph form of ``deepspeed.comm.all_reduce`` (``prof``, ``log_name`` and ``debug`` only matter eagerly)."""
    return A.all_reduce(tensor, "sum" if op is None else op, group, async_op)


def _ds_inference_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Graph form of ``deepspeed.comm.inference_all_reduce``: an in-place all_reduce, like DeepSpeed's."""
    A.all_reduce(tensor, "sum" if op is None else op, group)
    return None


DEEPSPEED_NAMES: Final[dict[str, Callable[..., Any]]] = {
    "all_reduce": _ds_all_reduce,
    "inference_all_reduce": _ds_inference_all_reduce,
}
_DEEPSPEED_MODULES: Final = ("deepspeed.comm", "deepspeed.comm.comm")


def _wrap(original: Callable[..., Any], traced: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return traced(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper.__xccl_original__ = original  # type: ignore[attr-defined]
    return wrapper


class Patch:
    """The patches one :func:`patch_collectives` call applied; a context manager that undoes them on exit."""

    def __init__(self, *, deepspeed: bool | None = None) -> None:
        self._undo: list[tuple[ModuleType, str, Any]] = []
        self._lock = threading.Lock()
        self.deepspeed = False
        self._apply(_TORCH_MODULES, TORCH_NAMES)
        if deepspeed is not False and _deepspeed_present(required=bool(deepspeed)):
            self._apply(_DEEPSPEED_MODULES, DEEPSPEED_NAMES)
            self.deepspeed = True

    def _apply(self, modules: tuple[str, ...], names: dict[str, Callable[..., Any]]) -> None:
        for mod_name in modules:
            module = importlib.import_module(mod_name)
            for name, form in names.items():
                current = getattr(module, name, None)
                if current is None or hasattr(current, "__xccl_original__"):
                    continue  # absent in this version, or already patched (nested patch_collectives)
                self._undo.append((module, name, current))
                setattr(module, name, _wrap(current, form))

    @property
    def patched(self) -> list[str]:
        """``module.name`` of every function this patch replaced."""
        return [f"{m.__name__}.{n}" for m, n, _ in self._undo]

    def restore(self) -> None:
        """Put every original function back (idempotent)."""
        with self._lock:
            while self._undo:
                module, name, original = self._undo.pop()
                setattr(module, name, original)

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()


def _deepspeed_present(required: bool) -> bool:
    if "deepspeed" in sys.modules or importlib.util.find_spec("deepspeed") is not None:
        return True
    if required:
        raise InvalidArgument("patch_collectives", "deepspeed=True but DeepSpeed is not installed (pip install deepspeed)")
    return False


def patch_collectives(*, deepspeed: bool | None = None) -> Patch:
    """Route ``torch.distributed``'s collectives (and DeepSpeed's all_reduce wrappers) through xccl when compiled.

    Works as a call (``xccl.patch_collectives()``, undone by ``.restore()``) and as a context manager
    (``with xccl.patch_collectives(): ...``). Eager calls still go to the original functions.

    Args:
        deepspeed: also patch ``deepspeed.comm.all_reduce`` and ``inference_all_reduce``: ``None`` (default)
            when DeepSpeed is installed (importing it), ``True`` to require it, ``False`` never.

    Returns:
        The :class:`Patch`, whose ``patched`` lists what was replaced.

    Raises:
        InvalidArgument: ``deepspeed=True`` and DeepSpeed is not installed.
    """
    return Patch(deepspeed=deepspeed)
