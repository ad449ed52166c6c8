"""The capability model's vocabulary: collectives, modes, support levels, dtype sets and reduce-op names.

Kept apart from the table (:mod:`._capabilities`) so that both stay small; everything here is re-exported there
and from :mod:`xccl.plugin`.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import torch

__all__ = [
    "ALL_DTYPES",
    "ALL_REDUCE_OPS",
    "COMPLEX_DTYPES",
    "COMPLEX_REDUCE_OPS",
    "REAL_DTYPES",
    "Collective",
    "Level",
    "Mode",
    "premul_factor",
    "reduce_op_name",
    "reduce_op_of",
]


class Collective(str, enum.Enum):
    """Every operation xccl dispatches; the value is the public function's name.

    torch 2.13's names for two of them are aliases: ``Collective.ALL_GATHER_SINGLE is
    Collective.ALL_GATHER_INTO_TENSOR``, and ``Collective("reduce_scatter_single")`` is
    ``Collective.REDUCE_SCATTER_TENSOR``, so capability queries take either name.
    """

    ALL_REDUCE = "all_reduce"
    #: all_reduce of several tensors in one call (``torch.distributed.all_reduce_coalesced``).
    ALL_REDUCE_COALESCED = "all_reduce_coalesced"
    ALL_GATHER = "all_gather"
    #: all_gather of several tensors in one call (``torch.distributed.all_gather_coalesced``).
    ALL_GATHER_COALESCED = "all_gather_coalesced"
    ALL_GATHER_INTO_TENSOR = "all_gather_into_tensor"
    REDUCE_SCATTER = "reduce_scatter"
    REDUCE_SCATTER_TENSOR = "reduce_scatter_tensor"
    ALL_TO_ALL = "all_to_all"
    ALL_TO_ALL_SINGLE = "all_to_all_single"
    #: all_to_all_single with split sizes that differ between peers (SCCL silently ignores them).
    ALL_TO_ALL_SINGLE_UNEVEN = "all_to_all_single_uneven"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    BARRIER = "barrier"
    #: A barrier that names the ranks that did not arrive within a timeout (``torch.distributed.monitored_barrier``).
    MONITORED_BARRIER = "monitored_barrier"
    SEND = "send"
    RECV = "recv"
    #: recv without a source: from whichever peer sends first (``recv(t)``, which returns the sender).
    RECV_ANY_SOURCE = "recv_any_source"
    ALL_GATHER_INTO_TENSOR_UNEVEN = "all_gather_into_tensor_uneven"
    REDUCE_SCATTER_TENSOR_UNEVEN = "reduce_scatter_tensor_uneven"
    ALL_TO_ALL_V = "all_to_all_v"
    MM_REDUCE_SCATTER = "mm_reduce_scatter"
    ALL_GATHER_MM = "all_gather_mm"
    MM_ALL_REDUCE = "mm_all_reduce"

    # torch 2.13's names (it deprecates the older ones): aliases, one member per op.
    ALL_GATHER_SINGLE = "all_gather_into_tensor"
    REDUCE_SCATTER_SINGLE = "reduce_scatter_tensor"

    @classmethod
    def _missing_(cls, value: object) -> Collective | None:
        # An alias's name as a value: Collective("all_gather_single").
        member = cls.__members__.get(str(value).upper()) if isinstance(value, str) and value.islower() else None
        return member if member is not None and member.name != str(value).upper() else None

    @property
    def reduces(self) -> bool:
        """Whether the op takes a reduce op."""
        return self in _REDUCING

    def __str__(self) -> str:
        return self.value


_REDUCING: Final = frozenset(
    {
        Collective.ALL_REDUCE,
        Collective.ALL_REDUCE_COALESCED,
        Collective.REDUCE_SCATTER,
        Collective.REDUCE_SCATTER_TENSOR,
        Collective.REDUCE,
        Collective.REDUCE_SCATTER_TENSOR_UNEVEN,
        Collective.MM_REDUCE_SCATTER,
        Collective.MM_ALL_REDUCE,
    }
)


class Mode(str, enum.Enum):
    """Eager calls, or calls traced into a ``torch.compile`` graph."""

    EAGER = "eager"
    GRAPH = "graph"

    def __str__(self) -> str:
        return self.value


class Level(str, enum.Enum):
    """How a backend runs an op: its own kernel, a composition of other ops, or not at all."""

    NATIVE = "native"
    EMULATED = "emulated"
    UNSUPPORTED = "unsupported"

    def __str__(self) -> str:
        return self.value


ALL_REDUCE_OPS: Final = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul_sum")
#: The real dtypes every built-in table and the tests reason about.
REAL_DTYPES: Final = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                      torch.int64, torch.bool)
#: Complex dtypes: carried as a view of their real parts (``torch.view_as_real``), as torch.distributed does.
COMPLEX_DTYPES: Final = (torch.complex64, torch.complex128)
#: Every dtype a table may claim: also those a vendor moves but gloo does not (HCCL's int16, uints and float8).
ALL_DTYPES: Final = REAL_DTYPES + COMPLEX_DTYPES + (torch.int16, torch.uint16, torch.uint32, torch.uint64,
                                                   torch.float8_e4m3fn, torch.float8_e5m2)
#: Reduce ops that mean something for complex numbers: torch.distributed's ``supports_complex``.
COMPLEX_REDUCE_OPS: Final = frozenset({"sum", "avg", "premul_sum"})

_R: Final = torch.distributed.ReduceOp
_REDOP_NAMES: Final = {getattr(_R, n.upper()): n for n in ALL_REDUCE_OPS}
_BY_NAME: Final = {n: getattr(_R, n.upper()) for n in ALL_REDUCE_OPS} | {"prod": _R.PRODUCT, "mean": _R.AVG}


def reduce_op_name(op: object) -> str:
    """The lower-case name of a reduce op: the one conversion xccl has, used by dispatch, the graph path, the fused
    ops, the simulation and the mismatch detector alike.

    Takes a ``ReduceOp.RedOpType`` (``ReduceOp.SUM``), a ``ReduceOp`` instance (``premul_sum`` carries a factor),
    a name (``"sum"``), DeepSpeed's ``ReduceOp`` enum (its member names are torch's), or a c10d options struct
    carrying one (``AllreduceOptions``: its ``reduceOp``).
    """
    if isinstance(op, str):  # first: traced by Dynamo, a dict keyed by pybind enums fails before torch 2.13
        return op.lower()
    name = _REDOP_NAMES.get(op)
    if name is not None:
        return name
    inner = getattr(op, "reduceOp", None)  # a c10d options struct
    if inner is not None:
        return reduce_op_name(inner)
    inner = getattr(op, "op", None)  # a ReduceOp instance wrapping a RedOpType (premul_sum and friends)
    if inner is not None:
        return _REDOP_NAMES.get(inner, str(inner).rsplit(".", 1)[-1].lower())
    named = getattr(op, "name", None)  # an enum of another library (DeepSpeed's ReduceOp)
    if isinstance(named, str):
        return named.lower()
    return str(op).rsplit(".", 1)[-1].lower()


def reduce_op_of(op: object) -> object:
    """``op`` as a ``torch.distributed.ReduceOp``: torch's own values as given, names and other enums converted.

    Raises:
        ValueError: not a reduce op xccl knows.
    """
    if isinstance(op, (_R, _R.RedOpType)):
        return op
    value = _BY_NAME.get(reduce_op_name(op))
    if value is None:
        raise ValueError(f"op={op!r} is not a reduce op; use torch.distributed.ReduceOp "
                         f"({', '.join(n.upper() for n in ALL_REDUCE_OPS)})")
    return value


def premul_factor(op: object) -> Any:
    """The factor a ``PREMUL_SUM`` carries (a float or a 1-element tensor), or None: a bare ``ReduceOp.PREMUL_SUM``
    or another op. Read from ``ReduceOp.__getstate__()``, which is ``(op, factor)`` on every torch xccl supports;
    ``ReduceOp.factor`` exists only from torch 2.10, and raises for ops without one."""
    return op.__getstate__()[1] if isinstance(op, _R) else None  # type: ignore[index]
