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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, final

import torch

from . import _c10d as K
from . import _validate as V
from ._c10d import Method, Tool
from ._validate import Facts, Fail, Validator
from ._vocab import Collective

__all__ = [
    "FUSED",
    "KERNEL_SIGNATURES",
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
    #: Whether a plugin's kernel receives it (a fused op's ``chunks`` is xccl's own: its portable version's).
    kernel: bool = True

    @property
    def holds_tensors(self) -> bool:
        """Whether the argument is a tensor or a (nested) list of tensors."""
        return self.kind in (Kind.TENSOR, Kind.TENSORS, Kind.ROOT_TENSORS, Kind.TENSOR_LISTS)


@final
@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed by identity: one object per op
class Spec:
    """One op: how its public call becomes a kernel call, which capability entry governs it, and every other fact
    the layers keep about it (how torch's c10d calls reach it, how it reaches the vendor's group, what tools and
    torch's flight recorder call it, its graph form, its bus factor).

    ``validate(facts, fail, *public)`` takes the public function's arguments without ``group`` and ``async_op``
    and returns the kernel arguments, described by ``args``. Every kernel of the op (native, emulated, a plugin's)
    is called as ``kernel(*kernel_args, async_op)`` (a fused op's without ``async_op``), with its group state
    already bound.
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
    #: What that agreed size is, in words (``xccl caps`` and table errors).
    agreed_doc: str = ""
    #: c10d's ``ProcessGroup`` methods that lead to this op (xccl's process group decodes them).
    c10d: tuple[Method, ...] = field(default=(), repr=False)
    #: The kernel over the vendor's own c10d group, per capability key (the variant included): ``native ->
    #: kernel``; missing where c10d has no method for the op (the uneven and fused ops come from the plugin).
    kernels: dict[Collective, Callable[[Any], Any]] = field(default_factory=dict, repr=False)
    #: What dispatcher-level tools are shown of a call, per capability key (``xccl.collectives._observe``).
    tools: dict[Collective, Tool] = field(default_factory=dict, repr=False)
    #: The name torch's flight recorder and its analyzer give the op (``profiling_name``); empty: :attr:`name`.
    torch_name: str = ""
    #: nccl-tests' factor from algorithm to bus bandwidth over ``n`` ranks, as it prints it (``"2(n-1)/n"``).
    bus: str = "1"
    #: How the op appears in a compiled graph where it is native, per capability key (empty: no graph form).
    graphs: dict[Collective, str] = field(default_factory=dict, repr=False)
    #: The xccl graph op an emulated standard form compiles to on groups created outside xccl (None: its own).
    graph_via: Collective | None = None
    #: ``torch.distributed`` functions that are this op, with the signature of xccl's (``patch_collectives``).
    torch_functions: tuple[str, ...] = ()
    #: A fused matmul + collective op: its kernel takes no ``async_op`` and returns its result.
    fused: bool = False
    #: A fused op's communication as torch's flight recorder would see it (``torch_name``): ``(kernel_args, group
    #: size) -> (inputs, outputs)``, each a tuple of ``(shape, dtype)``; its analyzer matches ranks on these.
    comm: Callable[[Sequence[Any], int], tuple[tuple[Any, ...], tuple[Any, ...]]] | None = field(default=None,
                                                                                                  repr=False)
    #: Position of the reduce op among the kernel arguments, or None (derived from ``args``).
    reduce_op_index: int | None = field(default=None, init=False)
    #: Position of the op's one tensor when that tensor is all it reads and writes (all_reduce, broadcast, reduce),
    #: or None (derived from ``args``): the flight recorder describes such a call by that tensor alone.
    solo_index: int | None = field(default=None, init=False)
    #: Positions of the tensor the op reads and of the one it writes when those two plain tensors are all it
    #: touches (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single), or None (derived from ``args``):
    #: the flight recorder describes such a call by the two alone.
    pair: tuple[int, int] | None = field(default=None, init=False)
    #: Position of the first tensor argument when it is a plain tensor (whose dtype selects the kernel), or None
    #: (derived from ``args``): :meth:`dtype_of` reads it there without the search.
    dtype_index: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        idx = next((i for i, a in enumerate(self.args) if a.kind is Kind.REDUCE_OP), None)
        object.__setattr__(self, "reduce_op_index", idx)
        tensors = [(i, a) for i, a in enumerate(self.args) if a.access is not None]
        plain = all(a.kind is Kind.TENSOR for _, a in tensors)
        solo = plain and len(tensors) == 1 and tensors[0][1].access is Access.UPDATE
        object.__setattr__(self, "solo_index", tensors[0][0] if solo else None)
        by_access = {a.access: i for i, a in tensors}
        if plain and len(tensors) == 2 and set(by_access) == {Access.READ, Access.WRITE}:
            object.__setattr__(self, "pair", (by_access[Access.READ], by_access[Access.WRITE]))
        first = next((i for i, a in enumerate(self.args) if a.kind in (Kind.TENSOR, Kind.TENSORS, Kind.TENSOR_LISTS)),
                     None)
        if first is not None and self.args[first].kind is Kind.TENSOR:
            object.__setattr__(self, "dtype_index", first)

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
        if self.dtype_index is not None:
            return kargs[self.dtype_index].dtype  # type: ignore[no-any-return]
        for arg, value in zip(self.args, kargs, strict=False):
            if arg.kind is Kind.TENSOR:
                return value.dtype  # type: ignore[no-any-return]
            if arg.kind in (Kind.TENSORS, Kind.TENSOR_LISTS) and value:
                first = value[0]
                return (first[0] if arg.kind is Kind.TENSOR_LISTS else first).dtype  # type: ignore[no-any-return]
        return None

    def agreed_bytes(self, kargs: Sequence[Any]) -> int:
        """The call's agreed size in bytes (its ``agreed`` argument: a tensor, or a list of them together)."""
        value = kargs[self.index(self.agreed)]
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        return sum(t.numel() * t.element_size() for t in value)

    @property
    def signature(self) -> tuple[str, ...]:
        """The arguments a plugin's kernel of this op takes after its context: the kernel arguments' names, then
        ``async_op`` (a fused op's kernel takes none)."""
        names = tuple(a.name for a in self.args if a.kernel)
        return names if self.fused else (*names, "async_op")

    @property
    def profiling_name(self) -> str:
        """The op's name in torch's flight recorder (:attr:`torch_name`, else :attr:`name`)."""
        return self.torch_name or self.name

    def bus_factor(self, n: int) -> float:
        """nccl-tests' bus-bandwidth factor over ``n`` ranks (:attr:`bus`)."""
        return _BUS[self.bus](n)


#: nccl-tests' bus factors, by how it prints them.
_BUS: Final[dict[str, Callable[[int], float]]] = {
    "2(n-1)/n": lambda n: 2 * (n - 1) / n,
    "(n-1)/n": lambda n: (n - 1) / n,
    "1": lambda n: 1.0,
    "0": lambda n: 0.0,
}

# ------------------------------------------------------------------------------------------------- the table

_T, _TS = Kind.TENSOR, Kind.TENSORS
_R, _W, _U = Access.READ, Access.WRITE, Access.UPDATE
_OP = Arg("op", Kind.REDUCE_OP)
_F: Final = "torch.ops._c10d_functional"
_X: Final = "torch.ops.xccl"
_RING: Final = "(n-1)/n"


def _sum() -> Any:
    return K.sum_op()


ALL_REDUCE: Final = Spec(
    "all_reduce", C.ALL_REDUCE, (Arg("tensor", _T, _U), _OP), V.all_reduce, fingerprint=("tensor",),
    agreed="tensor", agreed_doc="the tensor",
    c10d=(Method("allreduce", K.d_allreduce, reduces=True, in_place=True),),
    kernels={C.ALL_REDUCE: K.k_allreduce},
    tools={C.ALL_REDUCE: ("allreduce_", lambda k, b: ([k[0]], b, _sum(), None, False))},
    bus="2(n-1)/n", graphs={C.ALL_REDUCE: f"{_F}.all_reduce"}, torch_functions=("all_reduce",),
)
ALL_REDUCE_COALESCED: Final = Spec(
    "all_reduce_coalesced", C.ALL_REDUCE_COALESCED, (Arg("tensors", Kind.TENSORS, _U), _OP), V.all_reduce_coalesced,
    fingerprint=("tensors",), agreed="tensors", agreed_doc="the tensors together",
    c10d=(Method("allreduce_coalesced", K.d_allreduce_coalesced, reduces=True, in_place=True),),
    kernels={C.ALL_REDUCE_COALESCED: K.k_allreduce_coalesced},
    tools={C.ALL_REDUCE_COALESCED: ("allreduce_coalesced_", lambda k, b: (list(k[0]), b, _sum(), False))},
    torch_name="allreduce_coalesced", bus="2(n-1)/n",
    graphs={C.ALL_REDUCE_COALESCED: f"{_F}.all_reduce per tensor"}, graph_via=C.ALL_REDUCE,
)
ALL_GATHER: Final = Spec(
    "all_gather", C.ALL_GATHER, (Arg("tensor_list", _TS, _W), Arg("tensor", _T, _R)), V.all_gather,
    fingerprint=("tensor", "tensor_list"), agreed="tensor_list",
    agreed_doc="the output list together (world size x the input)",
    c10d=(Method("allgather", K.d_allgather),), kernels={C.ALL_GATHER: K.k_allgather},
    tools={C.ALL_GATHER: ("allgather_", lambda k, b: ([list(k[0])], [k[1]], b, False))},
    bus=_RING, graphs={C.ALL_GATHER: f"{_F}.all_gather_into_tensor, sliced into the list"},
    graph_via=C.ALL_GATHER_INTO_TENSOR, torch_functions=("all_gather",),
)
ALL_GATHER_COALESCED: Final = Spec(
    "all_gather_coalesced", C.ALL_GATHER_COALESCED,
    (Arg("output_tensor_lists", Kind.TENSOR_LISTS, _W), Arg("input_tensor_list", _TS, _R)), V.all_gather_coalesced,
    fingerprint=("input_tensor_list",),
    c10d=(Method("allgather_coalesced", K.d_allgather_coalesced),),
    kernels={C.ALL_GATHER_COALESCED: K.k_allgather_coalesced},
    tools={C.ALL_GATHER_COALESCED: (
        "allgather_coalesced_", lambda k, b: ([list(o) for o in k[0]], list(k[1]), b, False))},
    torch_name="all_gather_into_tensor_coalesced", bus=_RING,
    graphs={C.ALL_GATHER_COALESCED: f"{_F}.all_gather_into_tensor per tensor"}, graph_via=C.ALL_GATHER_INTO_TENSOR,
)
ALL_GATHER_INTO_TENSOR: Final = Spec(
    "all_gather_into_tensor", C.ALL_GATHER_INTO_TENSOR, (Arg("output_tensor", _T, _W), Arg("input_tensor", _T, _R)),
    V.all_gather_into_tensor, fingerprint=("output_tensor", "input_tensor"), agreed="output_tensor",
    agreed_doc="the output (world size x the input)",
    c10d=(Method("_allgather_base", K.d_allgather_base, ("all_gather_single",)),
          Method("allgather_into_tensor_coalesced", K.d_allgather_pairs, ("all_gather_single_coalesced",),
                 pairs=True, tool=("allgather_into_tensor_coalesced_",
                                   lambda k, b: (list(k[0]), list(k[1]), b, False)))),
    kernels={C.ALL_GATHER_INTO_TENSOR: K.k_allgather_base},
    tools={C.ALL_GATHER_INTO_TENSOR: ("_allgather_base_", lambda k, b: (k[0], k[1], b, False))},
    torch_name="_all_gather_base", bus=_RING, graphs={C.ALL_GATHER_INTO_TENSOR: f"{_F}.all_gather_into_tensor"},
    torch_functions=("all_gather_into_tensor", "all_gather_single", "_all_gather_base"),
)
REDUCE_SCATTER: Final = Spec(
    "reduce_scatter", C.REDUCE_SCATTER, (Arg("output", _T, _W), Arg("input_list", _TS, _R), _OP), V.reduce_scatter,
    fingerprint=("output", "input_list"), agreed="input_list",
    agreed_doc="the input list together (world size x the output)",
    c10d=(Method("reduce_scatter", K.d_reduce_scatter, reduces=True),),
    kernels={C.REDUCE_SCATTER: K.k_reduce_scatter},
    tools={C.REDUCE_SCATTER: ("reduce_scatter_", lambda k, b: ([k[0]], [list(k[1])], b, _sum(), False))},
    bus=_RING, graphs={C.REDUCE_SCATTER: f"{_F}.reduce_scatter_tensor over the concatenated list"},
    graph_via=C.REDUCE_SCATTER_TENSOR, torch_functions=("reduce_scatter",),
)
REDUCE_SCATTER_TENSOR: Final = Spec(
    "reduce_scatter_tensor", C.REDUCE_SCATTER_TENSOR, (Arg("output", _T, _W), Arg("input", _T, _R), _OP),
    V.reduce_scatter_tensor, fingerprint=("output", "input"), agreed="input",
    agreed_doc="the input (world size x the output)",
    c10d=(Method("_reduce_scatter_base", K.d_reduce_scatter_base, ("reduce_scatter_single",), reduces=True),
          Method("reduce_scatter_tensor_coalesced", K.d_reduce_scatter_pairs, ("reduce_scatter_single_coalesced",),
                 reduces=True, pairs=True,
                 tool=("reduce_scatter_tensor_coalesced_",
                       lambda k, b: (list(k[0]), list(k[1]), b, _sum(), False)))),
    kernels={C.REDUCE_SCATTER_TENSOR: K.k_reduce_scatter_base},
    tools={C.REDUCE_SCATTER_TENSOR: ("_reduce_scatter_base_", lambda k, b: (k[0], k[1], b, _sum(), False))},
    torch_name="_reduce_scatter_base", bus=_RING, graphs={C.REDUCE_SCATTER_TENSOR: f"{_F}.reduce_scatter_tensor"},
    torch_functions=("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base"),
)
ALL_TO_ALL: Final = Spec(
    "all_to_all", C.ALL_TO_ALL, (Arg("output_tensor_list", _TS, _W), Arg("input_tensor_list", _TS, _R)),
    V.all_to_all, fingerprint=("output_tensor_list", "input_tensor_list"),
    c10d=(Method("alltoall", K.d_alltoall),), kernels={C.ALL_TO_ALL: K.k_alltoall},
    tools={C.ALL_TO_ALL: ("alltoall_", lambda k, b: (list(k[0]), list(k[1]), b, False))},
    bus=_RING, graphs={C.ALL_TO_ALL: f"{_F}.all_to_all_single over the concatenated list"},
    graph_via=C.ALL_TO_ALL_SINGLE, torch_functions=("all_to_all",),
)


def _a2a_tool(k: Sequence[Any], b: Any) -> tuple[Any, ...]:
    return (k[0], k[1], b, list(k[2] or []), list(k[3] or []), False)


ALL_TO_ALL_SINGLE: Final = Spec(
    "all_to_all_single", C.ALL_TO_ALL_SINGLE,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS),
     Arg("input_split_sizes", Kind.SPLITS)),
    V.all_to_all_single, variant=C.ALL_TO_ALL_SINGLE_UNEVEN, fingerprint=("output", "input"), agreed="input",
    agreed_doc="the input (even splits)",
    c10d=(Method("alltoall_base", K.d_alltoall_base, ("all_to_all_single",)),),
    kernels={C.ALL_TO_ALL_SINGLE: K.k_alltoall_base, C.ALL_TO_ALL_SINGLE_UNEVEN: K.k_alltoall_base},
    tools={C.ALL_TO_ALL_SINGLE: ("alltoall_base_", _a2a_tool), C.ALL_TO_ALL_SINGLE_UNEVEN: ("alltoall_base_", _a2a_tool)},
    bus=_RING, graphs={C.ALL_TO_ALL_SINGLE: f"{_F}.all_to_all_single",
                       C.ALL_TO_ALL_SINGLE_UNEVEN: f"{_F}.all_to_all_single with split sizes"},
    graph_via=C.ALL_TO_ALL_SINGLE, torch_functions=("all_to_all_single",),
)
BROADCAST: Final = Spec(
    "broadcast", C.BROADCAST, (Arg("tensor", _T, _U), Arg("src", Kind.ROOT)), V.broadcast, fingerprint=("tensor",),
    agreed="tensor", agreed_doc="the tensor",
    c10d=(Method("broadcast", K.d_broadcast),), kernels={C.BROADCAST: K.k_broadcast},
    tools={C.BROADCAST: ("broadcast_", lambda k, b: ([k[0]], b, k[1], 0, False))},
    graphs={C.BROADCAST: f"{_F}.broadcast"}, torch_functions=("broadcast",),
)
REDUCE: Final = Spec(
    "reduce", C.REDUCE, (Arg("tensor", _T, _U), Arg("dst", Kind.ROOT), _OP), V.reduce, fingerprint=("tensor",),
    agreed="tensor", agreed_doc="the tensor",
    c10d=(Method("reduce", K.d_reduce, reduces=True, in_place=True),), kernels={C.REDUCE: K.k_reduce},
    tools={C.REDUCE: ("reduce_", lambda k, b: ([k[0]], b, _sum(), k[1], 0, False))},
    graphs={C.REDUCE: f"{_X}.reduce"}, torch_functions=("reduce",),
)
GATHER: Final = Spec(
    "gather", C.GATHER, (Arg("tensor", _T, _R), Arg("gather_list", Kind.ROOT_TENSORS, _W), Arg("dst", Kind.ROOT)),
    V.gather, fingerprint=("tensor",),
    c10d=(Method("gather", K.d_gather),), kernels={C.GATHER: K.k_gather},
    tools={C.GATHER: ("gather_", lambda k, b: ([list(k[1])] if k[1] else [], [k[0]], b, k[2], False))},
    bus=_RING, graphs={C.GATHER: f"{_X}.gather"}, torch_functions=("gather",),
)
SCATTER: Final = Spec(
    "scatter", C.SCATTER, (Arg("tensor", _T, _W), Arg("scatter_list", Kind.ROOT_TENSORS, _R), Arg("src", Kind.ROOT)),
    V.scatter, fingerprint=("tensor",),
    c10d=(Method("scatter", K.d_scatter),), kernels={C.SCATTER: K.k_scatter},
    tools={C.SCATTER: ("scatter_", lambda k, b: ([k[0]], [list(k[1])] if k[1] else [], b, k[2], False))},
    bus=_RING, graphs={C.SCATTER: f"{_X}.scatter"}, torch_functions=("scatter",),
)
BARRIER: Final = Spec(
    "barrier", C.BARRIER, (), V.barrier, c10d=(Method("barrier", K.d_barrier),), kernels={C.BARRIER: K.k_barrier},
    tools={C.BARRIER: ("barrier", lambda k, b: ())}, bus="0", graphs={C.BARRIER: f"{_X}.barrier"},
    torch_functions=("barrier",),
)
MONITORED_BARRIER: Final = Spec(
    "monitored_barrier", C.MONITORED_BARRIER, (Arg("timeout", Kind.OPTION), Arg("wait_all_ranks", Kind.OPTION)),
    V.monitored_barrier, torch_name="barrier", bus="0",
)
SEND: Final = Spec(
    "send", C.SEND, (Arg("tensor", _T, _R), Arg("dst", Kind.PEER), Arg("tag", Kind.TAG)),
    V.p2p("send", "dst", any_source=False), c10d=(Method("send", K.d_send),), kernels={C.SEND: K.k_send},
    tools={C.SEND: ("send", lambda k, b: ([k[0]], b, k[1], k[2]))}, graphs={C.SEND: f"{_X}.send"},
    torch_functions=("send",),
)
ISEND: Final = replace(SEND, name="isend", validate=V.p2p("isend", "dst", any_source=False), torch_name="send",
                       torch_functions=("isend",))
RECV: Final = Spec(
    "recv", C.RECV, (Arg("tensor", _T, _W), Arg("src", Kind.PEER), Arg("tag", Kind.TAG)),
    V.p2p("recv", "src", any_source=True), variant=C.RECV_ANY_SOURCE,
    c10d=(Method("recv", K.d_recv), Method("recv_anysource", K.d_recv_anysource)),
    kernels={C.RECV: K.k_recv, C.RECV_ANY_SOURCE: K.k_recv_anysource},
    tools={C.RECV: ("recv_", lambda k, b: ([k[0]], b, k[1], k[2])),
           C.RECV_ANY_SOURCE: ("recv_any_source_", lambda k, b: ([k[0]], b, k[2]))},
    graphs={C.RECV: f"{_X}.recv"}, torch_functions=("recv",),
)
IRECV: Final = replace(RECV, name="irecv", validate=V.p2p("irecv", "src", any_source=True), torch_name="recv",
                       torch_functions=("irecv",))
ALL_GATHER_INTO_TENSOR_UNEVEN: Final = Spec(
    "all_gather_into_tensor_uneven", C.ALL_GATHER_INTO_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS)), V.all_gather_uneven,
    fingerprint=("output", "output_split_sizes"), agreed="output",
    agreed_doc="the output (the sum of the split sizes)", torch_name="all_gather_v", bus=_RING,
    graphs={C.ALL_GATHER_INTO_TENSOR_UNEVEN: f"{_X}.all_gather_into_tensor_uneven"},
)
REDUCE_SCATTER_TENSOR_UNEVEN: Final = Spec(
    "reduce_scatter_tensor_uneven", C.REDUCE_SCATTER_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("input_split_sizes", Kind.SPLITS), _OP),
    V.reduce_scatter_uneven, fingerprint=("input", "input_split_sizes"), agreed="input",
    agreed_doc="the input (the sum of the split sizes)", torch_name="reduce_scatter_v", bus=_RING,
    graphs={C.REDUCE_SCATTER_TENSOR_UNEVEN: f"{_X}.reduce_scatter_tensor_uneven"},
)
ALL_TO_ALL_V: Final = Spec(
    "all_to_all_v", C.ALL_TO_ALL_V,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("send_count_matrix", Kind.MATRIX)), V.all_to_all_v,
    fingerprint=("send_count_matrix",), torch_name="all_to_all_v_single", bus=_RING,
    graphs={C.ALL_TO_ALL_V: f"{_X}.all_to_all_v"},
)


def _fused(args: Any, *public: Any) -> tuple[Any, ...]:
    # The fused ops validate their arguments themselves (``xccl.fused._validate``), before planning.
    return public


# A fused op's kernel arguments end with ``chunks`` (its portable version's split, 0: chosen from the shape), which
# a plugin's kernel does not take.
_A, _B, _BIAS = Arg("a", _T, _R), Arg("b", _T, _R), Arg("bias", _T, _R)
_CHUNKS = Arg("chunks", Kind.OPTION, kernel=False)


def _product(k: Sequence[Any]) -> tuple[Any, ...]:
    """``a @ b``'s (shape, dtype): what a fused op reduces."""
    return ((torch.Size((*k[0].shape[:-1], k[1].shape[1])), k[0].dtype),)


def _rs_comm(k: Sequence[Any], n: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    (shape, dtype), = _product(k)
    return _product(k), ((torch.Size((shape[0] // n, shape[1])), dtype),)


def _ag_comm(k: Sequence[Any], n: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    a = k[0]
    return ((a.shape, a.dtype),), ((torch.Size((a.shape[0] * n, *a.shape[1:])), a.dtype),)


MM_REDUCE_SCATTER: Final = Spec(
    "mm_reduce_scatter", C.MM_REDUCE_SCATTER, (_A, _B, Arg("reduce_op", Kind.OPTION), _BIAS, _CHUNKS), _fused,
    fingerprint=("a", "b"), torch_name="_reduce_scatter_base", bus=_RING, fused=True, comm=_rs_comm,
)
ALL_GATHER_MM: Final = Spec(
    "all_gather_mm", C.ALL_GATHER_MM, (_A, _B, Arg("gather_output", Kind.OPTION), _CHUNKS), _fused,
    fingerprint=("a", "b"), torch_name="_all_gather_base", bus=_RING, fused=True, comm=_ag_comm,
)
MM_ALL_REDUCE: Final = Spec(
    "mm_all_reduce", C.MM_ALL_REDUCE, (_A, _B, _BIAS, _CHUNKS), _fused, fingerprint=("a", "b"),
    torch_name="all_reduce", bus="2(n-1)/n", fused=True, comm=lambda k, n: (_product(k), _product(k)),
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
#: The fused matmul + collective ops' specs, by key.
FUSED: Final[dict[Collective, Spec]] = {s.key: s for s in (MM_REDUCE_SCATTER, ALL_GATHER_MM, MM_ALL_REDUCE)}
#: Every op by key: the collectives and the fused ops.
ALL: Final[dict[Collective, Spec]] = SPECS | FUSED
#: The arguments of each op's plugin kernel after its context (``xccl.plugin.KERNEL_SIGNATURES``).
KERNEL_SIGNATURES: Final[dict[Collective, tuple[str, ...]]] = {
    key: spec.signature for key, spec in ALL.items() if key is not C.MONITORED_BARRIER
}
