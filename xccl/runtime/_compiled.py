"""A rank's compiled regions, recorded for ``xccl preflight`` and dumped next to its flight record.

With ``XCCL_COMPILED_DUMP_AT_EXIT=1``, ``xccl.init`` adds a handler of xccl's own to Dynamo's ``graph_breaks``
artifact logger (``torch._dynamo.symbolic_convert``, ``log_graph_break``), and the end of the world writes
``<flight record path>.compiled.json``: the ``breaks`` Dynamo logged, Dynamo's metrics of each compiled ``frames``
and the vendor compiler's ``checks`` (:func:`xccl.plugin.report_graph_check`). docs/preflight.md, "Compiled
regions", says what is recorded and how; nothing of torch is replaced.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict
from typing import Any, Final

from ..collectives._flight_dump import path as flight_path
from ..collectives._state import PROCESS
from ..plugin._graph_checks import COMPILED_AT_EXIT, graph_checks, recording_compiled

__all__ = ["COMPILED_AT_EXIT", "compiled_path", "dump_compiled_at_exit", "start_compiled_record"]

LOG = logging.getLogger("xccl")
#: Dynamo's graph-break logger (``getArtifactLogger("torch._dynamo.symbolic_convert", "graph_breaks")``).
BREAK_LOGGER: Final = "torch._dynamo.symbolic_convert.__graph_breaks"
#: Breaks kept per process (a graph break in a loop is logged once per code location, but a program that
#: recompiles forever must not grow).
LIMIT: Final = 1024
_LOCK: Final = threading.Lock()
_BREAKS: list[dict[str, Any]] = []


class _BreakRecorder(logging.Handler):
    """Keeps the text of each graph break Dynamo logs."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is torch's to fix; the run goes on
            return
        with _LOCK:
            if len(_BREAKS) < LIMIT:
                _BREAKS.append({"text": text})


_HANDLER: Final = _BreakRecorder(logging.DEBUG)


def compiled_path(rank: int) -> str:
    """Where rank ``rank`` dumps its compiled regions: next to its flight record."""
    return f"{flight_path(rank)}.compiled.json"


def start_compiled_record() -> None:
    """Start recording graph breaks when :data:`COMPILED_AT_EXIT` asks for it (idempotent)."""
    if not recording_compiled():
        return
    logger = logging.getLogger(BREAK_LOGGER)
    if _HANDLER in logger.handlers:
        return
    if not logger.isEnabledFor(logging.DEBUG):
        # Off (the default): enabled for our handler alone. On (TORCH_LOGS=graph_breaks): left as the user set it.
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    logger.addHandler(_HANDLER)


def _frames() -> list[dict[str, Any]]:
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except Exception:  # no Dynamo, nothing compiled
        return []
    keep = ("compile_id", "co_name", "co_filename", "co_firstlineno", "graph_op_count", "graph_node_count",
            "fail_type", "fail_reason", "fail_user_frame_filename", "fail_user_frame_lineno")
    return [{k: getattr(m, k, None) for k in keep} for m in get_compilation_metrics()]


def _unique_graphs() -> int:
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def dump_compiled_at_exit() -> str | None:
    """Write this rank's compiled regions (when :data:`COMPILED_AT_EXIT` asks for it); the file, or None."""
    if not recording_compiled():
        return None
    world = PROCESS.world
    rank = world.rank if world is not None else int(os.environ.get("RANK", "0"))
    with _LOCK:
        breaks = list(_BREAKS)
    record = {"rank": rank, "breaks": breaks, "frames": _frames(), "unique_graphs": _unique_graphs(),
              "checks": [asdict(c) for c in graph_checks()]}
    target = compiled_path(rank)
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, default=str)
        os.replace(tmp, target)
    except OSError as exc:  # a full disk must not turn a finished run into a failed one
        LOG.warning("xccl: could not dump the compiled regions at exit (%s)", exc)
        return None
    return target
