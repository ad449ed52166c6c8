"""Warnings that name the user's line: the first frame outside xccl, torch and the wrappers between them.

A call reaches xccl through layers that are not the user's code: torch.distributed's wrappers (and, since torch
2.13, the ``typing_extensions.deprecated`` wrapper of the names it deprecates, a frame in ``typing_extensions.py``),
the custom-op and autograd machinery of a graph op, xccl's own emulations. A fixed ``stacklevel`` names one of
those; :func:`warn_at_user` walks the stack instead, once per warning, so it costs nothing on the hot path.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from typing import Final

import torch
import typing_extensions

__all__ = ["user_stacklevel", "warn_at_user"]


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


def user_stacklevel(skip: tuple[str, ...] = ()) -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller name the user's line.

    Args:
        skip: more file or directory prefixes that are not the user's (a plugin passes its package directory).

    Returns:
        1 + the number of frames, from the caller outwards, that lie in xccl, torch, the deprecation wrappers or
        ``skip``.
    """
    internal = _INTERNAL + skip
    frame: types.FrameType | None = sys._getframe(1)  # the caller: the frame that stacklevel=1 names
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    return level


def warn_at_user(message: str, category: type[Warning] = UserWarning, skip: tuple[str, ...] = ()) -> None:
    """``warnings.warn(message, category)`` naming the user's line (see :func:`user_stacklevel`)."""
    # The walk starts at this function's frame, which lies in xccl and is skipped like every other.
    warnings.warn(message, category, stacklevel=user_stacklevel(skip))
