"""What a vendor's graph compiler said of each graph it was given: the hook a plugin calls, and the record of it.

xccl keeps the reports of :func:`report_graph_check` only while a rank records its compiled regions
(``XCCL_COMPILED_DUMP_AT_EXIT``, which ``xccl preflight`` sets; :mod:`xccl.runtime._compiled` dumps them), so a
program that never asks pays nothing and holds nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

__all__ = ["COMPILED_AT_EXIT", "GraphCheck", "NodeProblem", "graph_checks", "recording_compiled",
           "report_graph_check"]

#: The variable that asks a rank to record its compiled regions and dump them when its world ends.
COMPILED_AT_EXIT: Final = "XCCL_COMPILED_DUMP_AT_EXIT"
#: Reports kept per process: a preflight compiles a few regions; a program compiling in a loop must not grow.
LIMIT: Final = 256
_LOCK: Final = threading.Lock()
_CHECKS: list[GraphCheck] = []


@final
@dataclass(frozen=True, slots=True)
class NodeProblem:
    """A node the vendor's compiler cannot convert.

    Attributes:
        node: the node, as the FX graph prints it (``all_reduce = torch.ops._c10d_functional.all_reduce(...)``).
        target: the op, by the name the vendor's registry knows it.
        message: why, in the vendor compiler's words, with where that comes from.
    """

    node: str
    target: str
    message: str


@final
@dataclass(frozen=True, slots=True)
class GraphCheck:
    """One graph a vendor's compiler was given, and whether it converts every node.

    Attributes:
        compiler: the vendor's compiler (``TorchAir (simulated)``).
        phase: ``forward``, ``backward`` or ``inference``.
        compile_id: Dynamo's id of the frame compilation the graph came from (``0/0``; empty when unknown): it
            ties the graph to its compiled region.
        nodes: the nodes checked; collectives: the communication ops among them, by the vendor's names.
        problems: every node it cannot convert (empty: it converts every node).
    """

    compiler: str
    phase: str
    compile_id: str
    nodes: int
    collectives: tuple[str, ...]
    problems: tuple[NodeProblem, ...]


def recording_compiled() -> bool:
    """Whether this rank records its compiled regions (:data:`COMPILED_AT_EXIT` set and not ``0``)."""
    return os.environ.get(COMPILED_AT_EXIT, "").strip() not in ("", "0")


def _compile_id() -> str:
    try:
        from torch._guards import CompileContext  # lazy: only while compiling

        cid = CompileContext.current_compile_id()
    except Exception:  # an id is a nicety; the report is what matters
        return ""
    return "" if cid is None else str(cid)


def report_graph_check(compiler: str, phase: str, nodes: int, collectives: Sequence[str],
                       problems: Sequence[NodeProblem]) -> None:
    """Record what the vendor's graph compiler found in one graph (a no-op unless the rank records).

    Call it from the compiler, while Dynamo compiles (the graph is tied to its region by Dynamo's compile id),
    with every node it cannot convert, before raising on the first one.

    Args:
        compiler: the compiler's name, as the report shows it.
        phase: ``forward``, ``backward`` or ``inference``.
        nodes: how many nodes were checked.
        collectives: the communication ops of the graph, by the vendor's names, in graph order.
        problems: the nodes it cannot convert, in graph order.
    """
    if not recording_compiled():
        return
    check = GraphCheck(compiler, phase, _compile_id(), int(nodes), tuple(collectives), tuple(problems))
    with _LOCK:
        if len(_CHECKS) < LIMIT:
            _CHECKS.append(check)


def graph_checks() -> list[GraphCheck]:
    """The graphs reported so far in this process, in the order they were compiled."""
    with _LOCK:
        return list(_CHECKS)
