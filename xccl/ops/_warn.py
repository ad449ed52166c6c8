"""Which frame is the user's, and warnings that name it: the first frame outside xccl, torch, the vendor's adaptor
and the wrappers between them.

A call reaches xccl through layers that are not the user's code: torch.distributed's wrappers (and, since torch
2.13, the ``typing_extensions.deprecated`` wrapper of the names it deprecates, a frame in ``typing_extensions.py``),
the custom-op and autograd machinery of a graph op, xccl's own emulations, and, on a vendor's machine, the vendor's
adaptor: torch_npu's and torch_tpu's replacements of torch.distributed functions, which the user's
``dist.gather`` reaches first (:meth:`xccl.plugin.Plugin.adaptor_modules`), or a framework's communication layer
(:data:`FRAMEWORK_COMM_LAYERS`). :func:`internal` is the one rule, used by :func:`warn_at_user`, by the flight
recorder's call sites (``xccl.collectives._flight.user_frame``) and by the preflight's error sites
(``xccl.tools._preflight_child``). A fixed ``stacklevel`` names one of those layers; :func:`warn_at_user` walks the
stack instead, once per warning, so it costs nothing on the hot path.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Final

import torch
import typing_extensions

__all__ = ["FRAMEWORK_COMM_LAYERS", "adaptor_modules", "internal", "set_adaptor_modules", "user_stacklevel",
           "warn_at_user"]


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) + os.sep


#: Frames in these files (or under these directories) are not the user's: xccl, torch, and the deprecation
#: wrappers (``typing_extensions.deprecated``; ``warnings.deprecated`` from Python 3.13).
_INTERNAL: Final = (
    _directory(os.path.dirname(os.path.abspath(__file__))),  # xccl/
    _directory(torch.__file__),  # torch/
    os.path.abspath(typing_extensions.__file__),
    os.path.abspath(warnings.__file__),
)


#: File names of code generated at run time that is not the user's: torch.fx's GraphModule code.
_GENERATED: Final = ("<eval_with_key>",)


#: Frameworks' communication layers, whose frames sit between the user's code and torch.distributed as a vendor's
#: adaptor does (module-name prefixes). Frameworks, not vendors, so xccl keeps the list: DeepSpeed's ``deepspeed.comm``
#: (``deepspeed/comm/comm.py``'s ``all_reduce`` etc. call ``cdb``, a ``TorchBackend`` in ``deepspeed/comm/torch.py``
#: that calls torch.distributed; deepspeedai/DeepSpeed, as installed by the ``deepspeed`` extra, 0.19.8).
FRAMEWORK_COMM_LAYERS: Final = ("deepspeed.comm",)

#: The module-name prefixes whose frames are not the user's: the frameworks' and the selected plugin's adaptors.
_adaptors: tuple[str, ...] = FRAMEWORK_COMM_LAYERS
#: ``id`` of a code object -> (the code object, whether its frames are not the user's): a dict lookup per frame
#: instead of prefix tests, which the flight recorder reads directly on its hot path. Keyed by ``id`` because a code
#: object's hash is computed from its contents on every lookup; the entry holds the code object, so its ``id`` is not
#: reused while cached. Cleared when the adaptor list changes.
INTERNAL_CODE: Final[dict[int, tuple[types.CodeType, bool]]] = {}


def set_adaptor_modules(modules: Sequence[str]) -> None:
    """Count frames of ``modules`` (module-name prefixes: ``torch_npu`` covers ``torch_npu.distributed``), besides
    :data:`FRAMEWORK_COMM_LAYERS`, as not the user's: the selected plugin's
    :meth:`~xccl.plugin.Plugin.adaptor_modules`, set when ``xccl.init`` makes its runtime current."""
    global _adaptors
    _adaptors = tuple(dict.fromkeys((*FRAMEWORK_COMM_LAYERS, *modules)))
    INTERNAL_CODE.clear()


def adaptor_modules() -> tuple[str, ...]:
    """The module-name prefixes whose frames are not the user's now (see :func:`set_adaptor_modules`)."""
    return _adaptors


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def internal(frame: types.FrameType, skip: tuple[str, ...] = ()) -> bool:
    """Whether ``frame`` is not the user's: it lies in xccl, torch, the deprecation wrappers or ``skip`` (file or
    directory prefixes), or in a module of an adaptor (:func:`adaptor_modules`)."""
    code = frame.f_code
    if not skip and (known := INTERNAL_CODE.get(id(code))) is not None:
        return known[1]
    # "<eval_with_key>.N": the code torch.fx generates for a GraphModule (a compiled region's graph, run by the
    # backend); the user's frame is the compiled function's, further out.
    found = (code.co_filename.startswith(_INTERNAL + skip + _GENERATED)
             or _in(str(frame.f_globals.get("__name__", "")), _adaptors))
    if not skip:
        if len(INTERNAL_CODE) > 4096:  # code objects made at run time (exec, lambdas in loops): start over
            INTERNAL_CODE.clear()
        INTERNAL_CODE[id(code)] = (code, found)
    return found


def user_stacklevel(skip: tuple[str, ...] = ()) -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller name the user's line.

    Args:
        skip: more file or directory prefixes that are not the user's (a plugin passes its package directory).

    Returns:
        1 + the number of frames, from the caller outwards, that are not the user's (:func:`internal`).
    """
    frame: types.FrameType | None = sys._getframe(1)  # the caller: the frame that stacklevel=1 names
    level = 1
    while frame is not None and internal(frame, skip):
        frame, level = frame.f_back, level + 1
    return level


def warn_at_user(message: str, category: type[Warning] = UserWarning, skip: tuple[str, ...] = ()) -> None:
    """``warnings.warn(message, category)`` naming the user's line (see :func:`user_stacklevel`)."""
    # The walk starts at this function's frame, which lies in xccl and is skipped like every other.
    warnings.warn(message, category, stacklevel=user_stacklevel(skip))
