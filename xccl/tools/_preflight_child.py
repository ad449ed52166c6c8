"""One rank of a preflight: run the user's unmodified script (``python -m xccl.tools._preflight_child DIR -- ARGV``).

``ARGV`` is what follows ``python`` on the command line the user gave: ``train.py ARGS`` or ``-m module ARGS``. The
script runs as ``__main__`` with that ``sys.argv``, exactly as ``python`` would run it. If it raises, this rank
writes what it raised to ``DIR/error_<RANK>.json`` (the error's type, message, ``fix`` where the error has one,
and the user's frame that raised it: the innermost frame outside xccl, torch, the adaptors and this runner), prints the
traceback as Python would, and exits 1. The flight recorder dumps its record at exit on its own
(``XCCL_TRACE_DUMP_AT_EXIT``, set by the launcher).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

__all__ = ["error_path", "main"]

#: Path prefixes of frames that are not the user's, besides xccl's rule (xccl, this runner included, torch, the
#: adaptors): the standard library's, runpy's among them.
_NOT_USERS = (os.path.dirname(runpy.__file__),)


def error_path(directory: str, rank: int) -> str:
    """Where rank ``rank`` writes the error it died of."""
    return os.path.join(directory, f"error_{rank}.json")


def _user_frame(tb: TracebackType | None) -> dict[str, Any] | None:
    """The innermost frame of ``tb`` that is the user's: outside the standard library (runpy), and not xccl's,
    torch's or an adaptor's (the flight recorder's rule, :func:`xccl.ops._warn.internal`): where the user's code called
    what failed."""
    from xccl.ops._warn import internal  # imports torch: only once a rank has failed

    site: dict[str, Any] | None = None
    for frame, line in traceback.walk_tb(tb):
        code = frame.f_code
        if not internal(frame, _NOT_USERS):
            site = {"filename": code.co_filename, "line": line, "name": code.co_name}
    return site


def describe(exc: BaseException) -> dict[str, Any]:
    """What the preflight report shows of an error a rank raised."""
    kind = type(exc)
    return {
        "type": kind.__name__,
        "module": kind.__module__,
        "message": str(exc),
        "op": str(getattr(exc, "op", "") or ""),
        "fix": str(getattr(exc, "fix", "") or ""),
        "site": _user_frame(exc.__traceback__),
    }


def _run(argv: Sequence[str]) -> None:
    if argv and argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("xccl preflight: -m needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if not argv:
        raise SystemExit("xccl preflight: no script to run")
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


def main(args: Sequence[str]) -> int:
    """Run the script; 0 when it returned, its own status on ``SystemExit``, 1 when it raised."""
    if len(args) < 2 or args[1] != "--":
        raise SystemExit("usage: python -m xccl.tools._preflight_child DIR -- script.py ARGS | -m module ARGS")
    directory, argv = args[0], args[2:]
    try:
        _run(argv)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)  # what Python does with sys.exit("message")
        return 1
    except BaseException as exc:  # reported, then the traceback printed as Python would
        rank = int(os.environ.get("RANK", "0"))
        with open(error_path(directory, rank), "w", encoding="utf-8") as f:
            json.dump(describe(exc), f)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
