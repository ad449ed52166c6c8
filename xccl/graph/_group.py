"""Trace-time facts about a group: its c10d name, size, rank, members, capability table, and its order token.

Everything here runs in plain Python at trace time. The functions Dynamo must not trace (they touch the process
group registry, the capability table and the plugin registry) are marked ``assume_constant_result``: Dynamo calls
them once with constant arguments and bakes the answer into the graph. That is sound because the answer is fixed
for the life of a process group, and each rank compiles its own graph.

Errors raised at trace time are re-classed by :func:`trace_error` so that Dynamo lets them through unchanged:
Dynamo re-raises its own ``UserError`` as is but rewraps any other exception as ``InternalTorchDynamoError``
(torch 2.13 ``convert_frame._compile``), which would hide xccl's typed errors from ``except`` clauses.
"""

from __future__ import annotations

import functools
from typing import Any, Final, NamedTuple, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..collectives._groups import state_of
from ..collectives._plan import plan_call
from ..collectives._state import PROCESS
from ..errors import InvalidArgument, InvalidArgumentType, UnsupportedCollective, XcclError
from ..ops._torch import DYNAMO_PYBIND, TORCH
from ..ops._validate import BARE_PREMUL, complex_refusal, group_problem
from ..ops._vocab import premul_factor
from ..plugin._capabilities import (
    COMPLEX_REDUCE_OPS,
    CapabilityTable,
    Collective,
    Mode,
    reduce_op_name,
)
from ..plugin._registry import default_registry
from ._state import GRAPH

F = TypeVar("F")

__all__ = [
    "GraphPlan",
    "assume_constant",
    "GroupInfo",
    "default_info",
    "emittable",
    "fail",
    "group_info",
    "info_by_name",
    "order_joins",
    "redop",
    "refuse",
    "resolve",
    "trace_error",
]


def assume_constant(fn: F) -> F:
    """``torch.compiler.assume_constant_result`` without its import of ``torch._dynamo`` (seconds at import).

    This is the whole of what that decorator does in torch 2.1 to 2.13 (``torch/_dynamo/decorators.py``);
    ``tests/test_graph.py`` checks that Dynamo still honours it.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


class GroupInfo(NamedTuple):
    """What the graph path needs to know about one process group (constant for the group's life).

    A named tuple of plain constants: Dynamo folds it into the graph without guarding on an object. It has the
    attributes validation reads (``_specs.Facts``), so the graph forms validate with the eager validators.
    """

    #: The c10d group name: what ``_c10d_functional`` ops and xccl's graph ops take instead of the group object.
    name: str
    size: int
    #: This process's rank within the group.
    rank: int
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: The plugin (or backend) name used in error messages.
    backend: str
    #: Device of the group's tensors (where its order token lives).
    device: torch.device
    #: Its type, which validation checks tensors against.
    device_type: str
    #: True when the group's c10d methods run xccl's dispatch (xccl's process group): a standard functional
    #: collective on it runs the emulation where the table says emulated, so the graph path can emit it.
    dispatches: bool


class GraphPlan(NamedTuple):
    """How a graph form carries one call, from the group's table in graph mode (constant, like ``GroupInfo``); the
    local layers of the resolution are done in the graph itself (``_layers`` says why)."""

    #: True when the standard functional collective carries the call once the layers are applied (see
    #: :func:`resolve`); False: xccl's graph op of the same name.
    standard: bool
    #: The dtype the tensors travel as (a view when the op moves bytes between dtypes of one size, else a
    #: converting copy and a copy back); None: their own.
    cast: torch.dtype | None
    #: True when avg runs as sum then a divide of the written tensors.
    avg: bool


@functools.cache
def _combined(cls: type[XcclError]) -> type[XcclError]:
    from torch._dynamo.exc import UserError

    # UserError first in the bases so that cls's own __init__ chain ends at Exception, not UserError.__init__.
    return type(cls.__name__, (UserError, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                  "__init__": cls.__init__})


def trace_error(cls: type[XcclError], *args: Any) -> XcclError:
    """An instance of ``cls(*args)`` that Dynamo re-raises unchanged (still ``isinstance(e, cls)``)."""
    from torch._dynamo.exc import UserErrorType

    # mypy reads a class's __hash__ as the unbound instance method and calls the class unhashable; classes hash.
    exc = _combined(cls)(*args)  # type: ignore[arg-type]
    # The attributes UserError.__init__ would have set; Dynamo reads them when it re-raises.
    exc.error_type = UserErrorType.INVALID_INPUT  # type: ignore[attr-defined]
    exc.msg = str(exc)  # type: ignore[attr-defined]
    exc.real_stack = None  # type: ignore[attr-defined]
    exc.skip_frame = False  # type: ignore[attr-defined]
    exc.logged = False  # type: ignore[attr-defined]
    return exc


def _table_of(pg: Any) -> tuple[CapabilityTable, torch.device, str]:
    """Capability table, device and fallback policy for ``pg``.

    Groups of an initialised xccl world use its plugin; a process group created with plain
    ``torch.distributed`` (code run under ``xccl.patch_collectives``) uses the installed plugin whose
    torch.distributed backend it is (gloo -> cpu, nccl -> cuda).
    """
    world = PROCESS.world
    if world is not None:
        st = state_of(pg)
        return st.table, world.device, st.fallback
    backend = str(dist.get_backend(pg))
    for info in default_registry().infos().values():
        if info.plugin is not None and info.plugin.backend == backend:
            device = torch.device("cpu") if info.plugin.device_type == "cpu" else torch.device(
                info.plugin.device_type, torch.accelerator.current_device_index()
            )
            return info.plugin.capabilities(), device, "emulate"
    raise trace_error(
        UnsupportedCollective, "graph mode", backend,
        f"no installed xccl plugin drives the torch.distributed backend {backend!r}; call xccl.init() or install "
        "the vendor's xccl plugin",
    )


def _info(pg: Any) -> GroupInfo:
    # Every graph form asks for its group's info (Dynamo runs this eagerly, at trace time) before it emits one
    # of xccl's own ops: define them now. Defining them costs more than the rest of xccl's start-up, and eager
    # programs never use them.
    from . import _ops  # noqa: F401 - registers torch.ops.xccl.*

    table, device, _ = _table_of(pg)
    name = pg.group_name
    if name not in GRAPH.tokens:
        GRAPH.tokens[name] = torch.zeros(1, dtype=torch.int32, device=device)
    return GroupInfo(name, pg.size(), pg.rank(), tuple(dist.get_process_group_ranks(pg)), table.backend, device,
                     device.type, hasattr(pg, "native"))


@assume_constant
def default_info() -> GroupInfo:
    """The world group's :class:`GroupInfo`."""
    return _info(c10d._get_default_group())


@assume_constant
def info_by_name(name: str) -> GroupInfo:
    """The :class:`GroupInfo` of the process group called ``name``."""
    return _info(c10d._resolve_process_group(name))  # type: ignore[arg-type]


def group_info(group: Any) -> GroupInfo:
    """The :class:`GroupInfo` of ``group`` (``None``: the world). Traced by Dynamo; cheap.

    A ``group`` that is not a process group of this rank fails as in eager mode (the same check).
    """
    if group is None:
        return default_info()
    problem = group_problem(group)
    if problem is not None:
        fail("group", problem)
    return info_by_name(group.group_name)


_RED_OP_TYPE: Final = dist.ReduceOp.RedOpType
_REDUCE_OP: Final = dist.ReduceOp
#: Whether Dynamo folds a ``ReduceOp`` object into a constant (``_torch.DYNAMO_PYBIND``).
_FOLDS: Final = TORCH.has(DYNAMO_PYBIND)


def redop(op: Any) -> str:
    """``op`` (a ``ReduceOp``, DeepSpeed's ``ReduceOp`` or a string) as the lower-case name graph ops take.

    Traced: Dynamo folds a pybind enum member (``ReduceOp.SUM``) or a ``ReduceOp`` object into a constant only from
    torch 2.13 ("RedOpType is not a constant" before), so the constant function below gets what Dynamo reads of them
    on every torch: the member's ``.name``; an object's ``.op.name`` before 2.13, the object itself from 2.13 (where
    reading ``.op`` trips a guard: pybind hands out a new object per read). An object always carries PREMUL_SUM's
    factor (torch refuses to build one without it); a bare ``ReduceOp.PREMUL_SUM`` is a member.

    Raises:
        InvalidArgument: a ``PREMUL_SUM`` without its factor, as eager dispatch refuses it.
    """
    if isinstance(op, _RED_OP_TYPE):
        return _redop(op.name, False)
    if type(op) is _REDUCE_OP and not _FOLDS:  # Dynamo's isinstance says False for these
        return _redop(op.op.name, True)  # type: ignore[attr-defined]  # bound in C++, not in the .pyi
    return _redop(op, False)


@assume_constant
def _redop(op: Any, factored: bool) -> str:
    name = reduce_op_name(op)
    if name == "premul_sum" and not factored and premul_factor(op) is None:
        raise trace_error(InvalidArgument, "reduce op", BARE_PREMUL)
    return name


@assume_constant
def resolve(name: str, op: Collective, dtype: torch.dtype | None, reduce_op: str | None) -> GraphPlan:
    """Consult the group's capability table in graph mode; raise at trace time when the op cannot run.

    Returns:
        The :class:`GraphPlan`: the layers (a dtype cast, avg as sum) the graph applies itself, and whether the
        op's standard graph form carries the call after them: when the op's own kernel runs that call (the
        planner's rule: no composition), or when the group is xccl's process group (whose c10d methods run
        dispatch); otherwise xccl's graph op (which runs the eager emulation) does. A native op the table prefers
        to compose at some sizes (``Prefer``) keeps the standard form: on xccl's process group dispatch makes the
        eager call's choice per call size; elsewhere the backend's kernel runs (the same result), and nothing here
        depends on a size Dynamo may make symbolic.

    Raises:
        UnsupportedCollective: the table says unsupported (the vendor SDK below the entry's floor included), or
            emulated under the ``"error"`` fallback policy.
    """
    if dtype is not None and dtype.is_complex and reduce_op is not None and reduce_op not in COMPLEX_REDUCE_OPS:
        # What torch refuses itself, with its message and builtin (ValueError), as in eager mode.
        raise trace_error(InvalidArgument, op.value, complex_refusal(op.value, f"RedOpType.{reduce_op.upper()}"))
    pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]
    # A group spanning islands of a mixed-vendor world has a derived table with no graph column (``_mixed``): each
    # rank's own compiler would lower the op for its own island, so the ranks would not meet; refused at trace time,
    # on every rank alike.
    table, _, fallback = _table_of(pg)
    runtime = PROCESS.runtime
    try:
        plan = plan_call(table, op, fallback, mode=Mode.GRAPH, dtype=dtype, reduce_op=reduce_op,
                         world_size=pg.size(), sdk_versions=runtime.sdk_versions() if runtime is not None else {})
    except UnsupportedCollective as exc:
        raise trace_error(UnsupportedCollective, exc.op, exc.backend, f"{exc.detail} (graph mode)") from None
    res = plan.resolution
    return GraphPlan(plan.native or hasattr(pg, "native"), res.cast, res.avg_via_sum)


def _graph_ops() -> frozenset[str] | None:
    runtime = PROCESS.runtime
    return runtime.graph_ops() if runtime is not None else None


@assume_constant
def order_joins() -> bool:
    """Whether standard collectives join the order token chain: unless the plugin's graph compiler takes no
    ``xccl.order`` (it keeps program order itself, ``Runtime.graph_ops``)."""
    ops = _graph_ops()
    return ops is None or "order" in ops


@assume_constant
def emittable(name: str, op: str) -> bool:
    """Return True when the graph compiler of group ``name``'s plugin takes xccl's graph op ``op``.

    Raises:
        UnsupportedCollective: it does not (``Runtime.graph_ops``): at trace time, before any rank communicates,
            rather than from the compiler, or as a hang where the compiler would have reordered the op.
    """
    ops = _graph_ops()
    if ops is None or op in ops:
        return True
    table, _, _ = _table_of(c10d._resolve_process_group(name))  # type: ignore[arg-type]
    raise trace_error(
        UnsupportedCollective, op, table.backend,
        f"graph mode: the {table.backend} plugin's graph compiler has no lowering for xccl.{op}, the graph op this "
        f"call compiles to (it takes {', '.join(sorted(ops)) or 'none'}); call it outside the compiled region, or "
        "see the graph column of `xccl caps` and the plugin's documentation for the form that compiles",
    )


@assume_constant
def refuse(op: str, backend: str, detail: str) -> None:
    """Raise ``UnsupportedCollective(op, backend, detail)`` from traced code."""
    raise trace_error(UnsupportedCollective, op, backend, detail)


@assume_constant
def fail(op: str, detail: str, wrong_type: bool = False) -> None:
    """Raise ``InvalidArgument(op, detail)`` (``InvalidArgumentType`` for a wrong type) from traced code (Dynamo
    cannot trace xccl's error constructors)."""
    raise trace_error(InvalidArgumentType if wrong_type else InvalidArgument, op, detail)
