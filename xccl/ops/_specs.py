"""One description per collective: its arguments and their roles, its validation, its capability key.

Every collective runs from the :class:`Spec` in :data:`SPECS`, whichever way it is called:

* ``xccl.<op>(...)`` in eager mode: ``spec.validate`` turns the public arguments into the *kernel arguments*
  (roots and peers as group ranks, split sizes as lists, reduce ops as ``ReduceOp``), ``spec.key_of`` picks the
  capability key, and dispatch (``_dispatch``) plans and runs the kernel;
* ``torch.distributed.<op>(..., group=<xccl's group>)`` and everything built on it (DDP, FSDP2, DTensor,
  functional collectives): the c10d process group (``_process_group``) turns the c10d method call back into the
  public arguments and dispatches exactly as above;
* ``xccl.<op>(...)`` while ``torch.compile`` traces: the graph form (``xccl.graph._forms``) calls the same
  ``spec.validate`` with an error-raiser that Dynamo lets through, so a bad call fails with the same typed error
  in both modes.

Validation is what every rank can check alone (types, devices, dtypes, shapes, sizes, ranks), so a bad call fails
the same way on every rank, before any rank communicates. The validators (``_validate``) never raise themselves:
they call ``fail(op, detail)``, which raises :class:`~xccl.InvalidArgument` in eager mode and its trace-time twin
in graph mode.

Even or uneven is decided from whether split sizes were *passed*, never from their values: a rank sees only its
own row and column of the count matrix ([[1, 1], [1, 2]] is uniform on rank 0 and not on rank 1), and where the
two take different kernels (SCCL: native vs padded) ranks deciding from values would run different collectives
and hang.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, final

import torch

from . import _validate as V
from ._validate import Facts, Fail, Validator
from ._vocab import Collective

__all__ = [
    "SPECS",
    "Access",
    "Arg",
    "Facts",
    "Fail",
    "Kind",
    "Spec",
]

C = Collective


class Kind(enum.Enum):
    """The role of one kernel argument."""

    #: One tensor.
    TENSOR = "tensor"
    #: A list of tensors, one per member of the group.
    TENSORS = "tensors"
    #: A list of tensors on the root only (gather, scatter), ``None`` elsewhere.
    ROOT_TENSORS = "root_tensors"
    #: A list of lists of tensors (all_gather_coalesced's outputs).
    TENSOR_LISTS = "tensor_lists"
    #: A ``torch.distributed.ReduceOp``.
    REDUCE_OP = "reduce_op"
    #: The group rank of a root (src, dst).
    ROOT = "root"
    #: The group rank of a peer, or ``None`` for any source.
    PEER = "peer"
    #: Split sizes (a list of ints), or ``None`` for even splits.
    SPLITS = "splits"
    #: A square count matrix (list of lists of ints).
    MATRIX = "matrix"
    #: A point-to-point tag.
    TAG = "tag"
    #: A plain option of the call (monitored_barrier's timeout and wait_all_ranks).
    OPTION = "option"


class Access(enum.Enum):
    """Whether the collective reads a tensor argument, writes it, or both."""

    READ = "in"
    WRITE = "out"
    UPDATE = "inout"


@final
@dataclass(frozen=True, slots=True)
class Arg:
    """One kernel argument: its name (the public parameter's), its role and, for tensors, its access."""

    name: str
    kind: Kind
    access: Access | None = None

    @property
    def holds_tensors(self) -> bool:
        """Whether the argument is a tensor or a (nested) list of tensors."""
        return self.kind in (Kind.TENSOR, Kind.TENSORS, Kind.ROOT_TENSORS, Kind.TENSOR_LISTS)


@final
@dataclass(frozen=True, slots=True)
class Spec:
    """One collective: how its public call becomes a kernel call, and which capability entry governs it.

    ``validate(facts, fail, *public)`` takes the public function's arguments without ``group`` and ``async_op``
    and returns the kernel arguments, described by ``args``. Every kernel of the op (native, emulated, a plugin's)
    is called as ``kernel(*kernel_args, async_op)``, with its group state already bound.
    """

    #: The public function's name, used in error messages (``"isend"`` for the asynchronous send).
    name: str
    #: The capability-table key of the even (or only) form.
    key: Collective
    #: The kernel arguments, in order.
    args: tuple[Arg, ...]
    #: Public arguments -> kernel arguments, calling ``fail`` on anything every rank can see is wrong.
    validate: Validator = field(repr=False)
    #: The capability key when split sizes are passed (all_to_all_single) or no peer is (recv); None: ``key``.
    variant: Collective | None = None
    #: Names of the kernel arguments the mismatch detector compares across ranks, in order: tensors (by dtype and
    #: shape, under the op's comparison rule), and split sizes or counts that are the same on every rank.
    fingerprint: tuple[str, ...] = ()
    #: The kernel argument whose bytes are the op's agreed size (``xccl.plugin.AGREED_SIZE``: every rank passes
    #: it alike, so a choice by size is the same on every rank); empty where ranks agree on no size.
    agreed: str = ""

    def index(self, name: str) -> int:
        """Position of the kernel argument called ``name``."""
        for i, arg in enumerate(self.args):
            if arg.name == name:
                return i
        raise KeyError(f"{self.name} has no argument {name!r}")

    def key_of(self, kargs: Sequence[Any]) -> Collective:
        """The capability key of this call: the variant when split sizes were passed (or no peer was)."""
        if self.variant is None:
            return self.key
        if self.key is C.RECV:
            return self.variant if kargs[1] is None else self.key
        return self.variant if kargs[2] is not None or kargs[3] is not None else self.key

    def dtype_of(self, kargs: Sequence[Any]) -> torch.dtype | None:
        """The dtype that selects the kernel: the first tensor argument's (``None`` for barrier)."""
        for arg, value in zip(self.args, kargs, strict=False):
            if arg.kind is Kind.TENSOR:
                return value.dtype  # type: ignore[no-any-return]
            if arg.kind in (Kind.TENSORS, Kind.TENSOR_LISTS) and value:
                first = value[0]
                return (first[0] if arg.kind is Kind.TENSOR_LISTS else first).dtype  # type: ignore[no-any-return]
        return None

    @property
    def reduce_op_index(self) -> int | None:
        """Position of the reduce op among the kernel arguments, or None."""
        for i, arg in enumerate(self.args):
            if arg.kind is Kind.REDUCE_OP:
                return i
        return None

    def agreed_bytes(self, kargs: Sequence[Any]) -> int:
        """The call's agreed size in bytes (its ``agreed`` argument: a tensor, or a list of them together)."""
        value = kargs[self.index(self.agreed)]
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        return sum(t.numel() * t.element_size() for t in value)

    def renamed(self, name: str) -> Spec:
        """The same collective under another public name (``isend`` for ``send``)."""
        return replace(self, name=name)



# ------------------------------------------------------------------------------------------------- the table

_T, _TS = Kind.TENSOR, Kind.TENSORS
_R, _W, _U = Access.READ, Access.WRITE, Access.UPDATE
_OP = Arg("op", Kind.REDUCE_OP)


def _spec(name: str, key: Collective, args: tuple[Arg, ...], validate: Validator, fingerprint: tuple[str, ...],
          variant: Collective | None = None, agreed: str = "") -> Spec:
    return Spec(name, key, args, validate, variant, fingerprint, agreed)


ALL_REDUCE: Final = _spec("all_reduce", C.ALL_REDUCE, (Arg("tensor", _T, _U), _OP), V.all_reduce, ("tensor",),
                          agreed="tensor")
ALL_REDUCE_COALESCED: Final = _spec(
    "all_reduce_coalesced", C.ALL_REDUCE_COALESCED, (Arg("tensors", Kind.TENSORS, _U), _OP), V.all_reduce_coalesced,
    ("tensors",), agreed="tensors",
)
ALL_GATHER: Final = _spec(
    "all_gather", C.ALL_GATHER, (Arg("tensor_list", _TS, _W), Arg("tensor", _T, _R)), V.all_gather,
    ("tensor", "tensor_list"), agreed="tensor_list",
)
ALL_GATHER_COALESCED: Final = _spec(
    "all_gather_coalesced", C.ALL_GATHER_COALESCED,
    (Arg("output_tensor_lists", Kind.TENSOR_LISTS, _W), Arg("input_tensor_list", _TS, _R)), V.all_gather_coalesced,
    ("input_tensor_list",),
)
ALL_GATHER_INTO_TENSOR: Final = _spec(
    "all_gather_into_tensor", C.ALL_GATHER_INTO_TENSOR, (Arg("output_tensor", _T, _W), Arg("input_tensor", _T, _R)),
    V.all_gather_into_tensor, ("output_tensor", "input_tensor"), agreed="output_tensor",
)
REDUCE_SCATTER: Final = _spec(
    "reduce_scatter", C.REDUCE_SCATTER, (Arg("output", _T, _W), Arg("input_list", _TS, _R), _OP), V.reduce_scatter,
    ("output", "input_list"), agreed="input_list",
)
REDUCE_SCATTER_TENSOR: Final = _spec(
    "reduce_scatter_tensor", C.REDUCE_SCATTER_TENSOR, (Arg("output", _T, _W), Arg("input", _T, _R), _OP),
    V.reduce_scatter_tensor, ("output", "input"), agreed="input",
)
ALL_TO_ALL: Final = _spec(
    "all_to_all", C.ALL_TO_ALL, (Arg("output_tensor_list", _TS, _W), Arg("input_tensor_list", _TS, _R)), V.all_to_all,
    ("output_tensor_list", "input_tensor_list"),
)
ALL_TO_ALL_SINGLE: Final = _spec(
    "all_to_all_single", C.ALL_TO_ALL_SINGLE,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS),
     Arg("input_split_sizes", Kind.SPLITS)),
    V.all_to_all_single, ("output", "input"), variant=C.ALL_TO_ALL_SINGLE_UNEVEN, agreed="input",
)
BROADCAST: Final = _spec("broadcast", C.BROADCAST, (Arg("tensor", _T, _U), Arg("src", Kind.ROOT)), V.broadcast,
                         ("tensor",), agreed="tensor")
REDUCE: Final = _spec("reduce", C.REDUCE, (Arg("tensor", _T, _U), Arg("dst", Kind.ROOT), _OP), V.reduce, ("tensor",),
                      agreed="tensor")
GATHER: Final = _spec(
    "gather", C.GATHER, (Arg("tensor", _T, _R), Arg("gather_list", Kind.ROOT_TENSORS, _W), Arg("dst", Kind.ROOT)),
    V.gather, ("tensor",),
)
SCATTER: Final = _spec(
    "scatter", C.SCATTER, (Arg("tensor", _T, _W), Arg("scatter_list", Kind.ROOT_TENSORS, _R), Arg("src", Kind.ROOT)),
    V.scatter, ("tensor",),
)
BARRIER: Final = _spec("barrier", C.BARRIER, (), V.barrier, ())
MONITORED_BARRIER: Final = _spec(
    "monitored_barrier", C.MONITORED_BARRIER, (Arg("timeout", Kind.OPTION), Arg("wait_all_ranks", Kind.OPTION)),
    V.monitored_barrier, (),
)
SEND: Final = _spec("send", C.SEND, (Arg("tensor", _T, _R), Arg("dst", Kind.PEER), Arg("tag", Kind.TAG)),
                    V.p2p("send", "dst", any_source=False), ())
ISEND: Final = _spec("isend", C.SEND, SEND.args, V.p2p("isend", "dst", any_source=False), ())
RECV: Final = _spec("recv", C.RECV, (Arg("tensor", _T, _W), Arg("src", Kind.PEER), Arg("tag", Kind.TAG)),
                    V.p2p("recv", "src", any_source=True), (), variant=C.RECV_ANY_SOURCE)
IRECV: Final = _spec("irecv", C.RECV, RECV.args, V.p2p("irecv", "src", any_source=True), (), variant=C.RECV_ANY_SOURCE)
ALL_GATHER_INTO_TENSOR_UNEVEN: Final = _spec(
    "all_gather_into_tensor_uneven", C.ALL_GATHER_INTO_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS)), V.all_gather_uneven,
    ("output", "output_split_sizes"), agreed="output",
)
REDUCE_SCATTER_TENSOR_UNEVEN: Final = _spec(
    "reduce_scatter_tensor_uneven", C.REDUCE_SCATTER_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("input_split_sizes", Kind.SPLITS), _OP),
    V.reduce_scatter_uneven, ("input", "input_split_sizes"), agreed="input",
)
ALL_TO_ALL_V: Final = _spec(
    "all_to_all_v", C.ALL_TO_ALL_V, (Arg("output", _T, _W), Arg("input", _T, _R), Arg("send_count_matrix", Kind.MATRIX)),
    V.all_to_all_v, ("send_count_matrix",),
)

#: Every collective's spec by capability key (the even form; ``isend``/``irecv`` are the send/recv specs renamed).
SPECS: Final[dict[Collective, Spec]] = {
    s.key: s
    for s in (
        ALL_REDUCE, ALL_REDUCE_COALESCED, ALL_GATHER, ALL_GATHER_COALESCED, ALL_GATHER_INTO_TENSOR, REDUCE_SCATTER,
        REDUCE_SCATTER_TENSOR, ALL_TO_ALL, ALL_TO_ALL_SINGLE, BROADCAST, REDUCE, GATHER, SCATTER, BARRIER,
        MONITORED_BARRIER, SEND, RECV,
        ALL_GATHER_INTO_TENSOR_UNEVEN, REDUCE_SCATTER_TENSOR_UNEVEN, ALL_TO_ALL_V,
    )
}
SPECS[C.ALL_TO_ALL_SINGLE_UNEVEN] = ALL_TO_ALL_SINGLE
SPECS[C.RECV_ANY_SOURCE] = RECV
