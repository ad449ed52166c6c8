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
the same way on every rank, before any rank communicates. The validators never raise themselves: they call
``fail(op, detail)``, which raises :class:`~xccl.InvalidArgument` in eager mode and its trace-time twin in graph
mode.

Even or uneven is decided from whether split sizes were *passed*, never from their values: a rank sees only its
own row and column of the count matrix ([[1, 1], [1, 2]] is uniform on rank 0 and not on rank 1), and where the
two take different kernels (SCCL: native vs padded) ranks deciding from values would run different collectives
and hang.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, NoReturn, Protocol, final

import torch

from ..plugin._capabilities import Collective, reduce_op_of

__all__ = [
    "SPECS",
    "Access",
    "Arg",
    "Facts",
    "Fail",
    "Kind",
    "Spec",
    "counts",
    "splits",
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


class Facts(Protocol):
    """What validation needs to know about a group: the eager state and the graph path's trace-time facts both
    have these attributes."""

    #: Number of members.
    size: int
    #: This process's rank within the group.
    rank: int
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: Device type of the group's tensors (``"cpu"`` in simulation).
    device_type: str
    #: The plugin name, for messages.
    backend: str


#: ``fail(op, detail)`` raises the invalid-argument error of the calling path; it never returns.
Fail = Callable[[str, str], NoReturn]
Validator = Callable[..., tuple[Any, ...]]


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

    def renamed(self, name: str) -> Spec:
        """The same collective under another public name (``isend`` for ``send``)."""
        return replace(self, name=name)


# ------------------------------------------------------------------------------------------- shared validators


def tensor(g: Facts, fail: Fail, op: str, what: str, t: Any) -> torch.Tensor:
    """``t`` if it is a contiguous tensor on the group's device type."""
    if not isinstance(t, torch.Tensor):
        fail(op, f"{what} must be a torch.Tensor, got {type(t).__name__}")
    dev = g.device_type
    if t.device.type != dev:
        fail(op, f"{what} is on {t.device}, but the {g.backend} backend takes {dev} tensors; move it with .to()")
    if not t.is_contiguous():
        fail(op, f"{what} is not contiguous; call .contiguous() first")
    return t


def same_dtype(fail: Fail, op: str, a: torch.Tensor, b: torch.Tensor, what: str = "output and input") -> None:
    """Both tensors have one dtype."""
    if a.dtype != b.dtype:
        fail(op, f"{what} dtypes differ ({a.dtype} vs {b.dtype})")


def tensor_list(g: Facts, fail: Fail, op: str, what: str, ts: Any, n: int | None = None) -> list[torch.Tensor]:
    """``ts`` as a list of valid tensors, one per member (or ``n``)."""
    if not isinstance(ts, (list, tuple)):
        fail(op, f"{what} must be a list of tensors, got {type(ts).__name__}")
    want = g.size if n is None else n
    if len(ts) != want:
        fail(op, f"{what} has {len(ts)} tensors; the group has {g.size} ranks")
    for i, t in enumerate(ts):
        tensor(g, fail, op, f"{what}[{i}]", t)
    return list(ts)


def member(g: Facts, fail: Fail, op: str, what: str, rank: Any, group_rank: Any) -> int:
    """A root or peer given as a global rank (``rank``) or a group rank (``group_<what>``), as a group rank."""
    if group_rank is not None:
        if rank is not None:
            fail(op, f"pass {what} or group_{what}, not both")
        if not isinstance(group_rank, int) or isinstance(group_rank, bool) or not 0 <= group_rank < g.size:
            fail(op, f"group_{what}={group_rank!r} is outside [0, {g.size}) for this group")
        return group_rank
    if rank is None:
        fail(op, f"{what} is required")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in g.ranks:
        fail(op, f"{what}={rank!r} is not a member of this group (ranks {list(g.ranks)})")
    return g.ranks.index(rank)


def counts(fail: Fail, op: str, what: str, values: Any) -> list[int]:
    """``values`` as a list of non-negative ints. Anything ``operator.index`` takes (numpy ints, integer 0-d
    tensors) is accepted; floats, bools and strings are refused rather than truncated. Symbolic ints (traced
    split sizes) are kept as they are, unchecked: their values are known only when the graph runs."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        fail(op, f"{what} must be a sequence of integers, got {type(values).__name__}")
    items = list(values)
    out: list[Any] = []
    for s in items:
        if isinstance(s, bool):
            fail(op, f"{what}={items!r} must hold integers, but has {s!r} (bool)")
        if isinstance(s, (int, torch.SymInt)):
            out.append(s)
            continue
        try:
            out.append(operator.index(s))
        except TypeError:
            fail(op, f"{what}={items!r} must hold integers, but has {s!r} ({type(s).__name__})")
    if any(not isinstance(c, torch.SymInt) and c < 0 for c in out):
        fail(op, f"{what}={out} must be non-negative integers")
    return out


def splits(g: Facts, fail: Fail, op: str, what: str, sizes: Any, total: int | None) -> list[int] | None:
    """Split sizes: ``None``, or one non-negative int per member summing to ``total`` (dim 0 of the tensor)."""
    if sizes is None:
        return None
    out = counts(fail, op, what, sizes)
    if len(out) != g.size:
        fail(op, f"{what} has {len(out)} entries; the group has {g.size} ranks")
    symbolic = any(isinstance(c, torch.SymInt) for c in out) or isinstance(total, torch.SymInt)
    if total is not None and not symbolic and sum(out) != total:
        fail(op, f"{what}={out} sums to {sum(out)}, but the tensor's dim 0 is {total}")
    return out


def reduce_op(fail: Fail, op: str, value: Any) -> Any:
    """A ``ReduceOp`` (kept as given) from a ``ReduceOp``, its name, or DeepSpeed's enum."""
    try:
        return reduce_op_of(value)
    except ValueError as exc:
        fail(op, str(exc))


def _rows(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() else 0


def _dim0(fail: Fail, op: str, *ts: torch.Tensor) -> None:
    if any(t.dim() == 0 for t in ts):
        fail(op, "output and input need at least one dimension")


# -------------------------------------------------------------------------------------------------- per op


def _all_reduce(g: Facts, fail: Fail, t: Any, op: Any) -> tuple[Any, ...]:
    return tensor(g, fail, "all_reduce", "tensor", t), reduce_op(fail, "all_reduce", op)


def _all_reduce_coalesced(g: Facts, fail: Fail, ts: Any, op: Any) -> tuple[Any, ...]:
    name = "all_reduce_coalesced"
    if not isinstance(ts, (list, tuple)) or not ts:
        fail(name, "tensors must be a non-empty list of tensors")
    lst = [tensor(g, fail, name, f"tensors[{i}]", t) for i, t in enumerate(ts)]
    return lst, reduce_op(fail, name, op)


def _all_gather(g: Facts, fail: Fail, outs: Any, t: Any) -> tuple[Any, ...]:
    name = "all_gather"
    tensor(g, fail, name, "tensor", t)
    lst = tensor_list(g, fail, name, "tensor_list", outs)
    for i, o in enumerate(lst):
        same_dtype(fail, name, o, t, f"tensor_list[{i}] and tensor")
    if lst[g.rank].shape != t.shape:
        fail(name, f"tensor_list[{g.rank}] has shape {tuple(lst[g.rank].shape)}, tensor has {tuple(t.shape)}")
    return lst, t


def _all_gather_coalesced(g: Facts, fail: Fail, out_lists: Any, ins: Any) -> tuple[Any, ...]:
    name = "all_gather_coalesced"
    if not isinstance(ins, (list, tuple)) or not ins:
        fail(name, "input_tensor_list must be a non-empty list of tensors")
    if not isinstance(out_lists, (list, tuple)) or len(out_lists) != g.size:
        fail(name, f"output_tensor_lists must hold one list per rank of the group ({g.size})")
    inputs = [tensor(g, fail, name, f"input_tensor_list[{i}]", t) for i, t in enumerate(ins)]
    outs = []
    for r, lst in enumerate(out_lists):
        row = tensor_list(g, fail, name, f"output_tensor_lists[{r}]", lst, len(inputs))
        for i, (o, t) in enumerate(zip(row, inputs, strict=True)):
            same_dtype(fail, name, o, t, f"output_tensor_lists[{r}][{i}] and input_tensor_list[{i}]")
            if o.shape != t.shape:
                fail(name, f"output_tensor_lists[{r}][{i}] has shape {tuple(o.shape)}, input {tuple(t.shape)}")
        outs.append(row)
    return outs, inputs


def _all_gather_into_tensor(g: Facts, fail: Fail, out: Any, inp: Any) -> tuple[Any, ...]:
    name = "all_gather_into_tensor"
    tensor(g, fail, name, "output_tensor", out)
    tensor(g, fail, name, "input_tensor", inp)
    same_dtype(fail, name, out, inp)
    if out.numel() != inp.numel() * g.size:
        fail(name, f"output has {out.numel()} elements; expected input's {inp.numel()} x {g.size} ranks")
    return out, inp


def _reduce_scatter(g: Facts, fail: Fail, out: Any, ins: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter"
    tensor(g, fail, name, "output", out)
    lst = tensor_list(g, fail, name, "input_list", ins)
    for i, t in enumerate(lst):
        same_dtype(fail, name, out, t, f"output and input_list[{i}]")
        if t.shape != out.shape:
            fail(name, f"input_list[{i}] has shape {tuple(t.shape)}, output has {tuple(out.shape)}")
    return out, lst, reduce_op(fail, name, op)


def _reduce_scatter_tensor(g: Facts, fail: Fail, out: Any, inp: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter_tensor"
    tensor(g, fail, name, "output", out)
    tensor(g, fail, name, "input", inp)
    same_dtype(fail, name, out, inp)
    if inp.numel() != out.numel() * g.size:
        fail(name, f"input has {inp.numel()} elements; expected output's {out.numel()} x {g.size} ranks")
    return out, inp, reduce_op(fail, name, op)


def _all_to_all(g: Facts, fail: Fail, outs: Any, ins: Any) -> tuple[Any, ...]:
    name = "all_to_all"
    o = tensor_list(g, fail, name, "output_tensor_list", outs)
    i = tensor_list(g, fail, name, "input_tensor_list", ins)
    dtype = i[0].dtype
    for t in [*o, *i]:
        if t.dtype != dtype:
            fail(name, f"tensors have mixed dtypes ({t.dtype} vs {dtype})")
    if o[g.rank].numel() != i[g.rank].numel():
        fail(name, f"output/input sizes for this rank ({g.rank}) differ")
    return o, i


def _all_to_all_single(g: Facts, fail: Fail, out: Any, inp: Any, osz: Any, isz: Any) -> tuple[Any, ...]:
    name = "all_to_all_single"
    tensor(g, fail, name, "output", out)
    tensor(g, fail, name, "input", inp)
    same_dtype(fail, name, out, inp)
    n = g.size
    o = splits(g, fail, name, "output_split_sizes", osz, _rows(out))
    i = splits(g, fail, name, "input_split_sizes", isz, _rows(inp))
    if o is None and (out.dim() == 0 or out.shape[0] % n):
        fail(name, f"output dim 0 must divide evenly by {n} without output_split_sizes")
    if i is None and (inp.dim() == 0 or inp.shape[0] % n):
        fail(name, f"input dim 0 must divide evenly by {n} without input_split_sizes")
    if o is None and i is None and out.numel() != inp.numel():
        fail(name, f"output has {out.numel()} elements, input {inp.numel()}")
    return out, inp, o, i


def _broadcast(g: Facts, fail: Fail, t: Any, src: Any, group_src: Any) -> tuple[Any, ...]:
    return tensor(g, fail, "broadcast", "tensor", t), member(g, fail, "broadcast", "src", src, group_src)


def _reduce(g: Facts, fail: Fail, t: Any, dst: Any, op: Any, group_dst: Any) -> tuple[Any, ...]:
    tensor(g, fail, "reduce", "tensor", t)
    return t, member(g, fail, "reduce", "dst", dst, group_dst), reduce_op(fail, "reduce", op)


def _rooted_list(g: Facts, fail: Fail, op: str, what: str, t: Any, lst: Any, root: int, list_name: str) -> Any:
    if g.rank == root:
        items = tensor_list(g, fail, op, list_name, lst)
        for i, x in enumerate(items):
            same_dtype(fail, op, x, t, f"{list_name}[{i}] and tensor")
            if x.shape != t.shape:
                fail(op, f"{list_name}[{i}] has shape {tuple(x.shape)}, tensor {tuple(t.shape)}")
        return items
    if lst:
        fail(op, f"{list_name} must be None or empty on ranks other than {what}")
    return None


def _gather(g: Facts, fail: Fail, t: Any, lst: Any, dst: Any, group_dst: Any) -> tuple[Any, ...]:
    tensor(g, fail, "gather", "tensor", t)
    # torch.distributed's default root is global rank 0.
    root = member(g, fail, "gather", "dst", 0 if dst is None and group_dst is None else dst, group_dst)
    return t, _rooted_list(g, fail, "gather", "dst", t, lst, root, "gather_list"), root


def _scatter(g: Facts, fail: Fail, t: Any, lst: Any, src: Any, group_src: Any) -> tuple[Any, ...]:
    tensor(g, fail, "scatter", "tensor", t)
    root = member(g, fail, "scatter", "src", 0 if src is None and group_src is None else src, group_src)
    return t, _rooted_list(g, fail, "scatter", "src", t, lst, root, "scatter_list"), root


def _barrier(g: Facts, fail: Fail) -> tuple[Any, ...]:
    return ()


def _p2p(name: str, what: str, any_source: bool) -> Validator:
    def validate(g: Facts, fail: Fail, t: Any, peer: Any, tag: Any, group_peer: Any) -> tuple[Any, ...]:
        tensor(g, fail, name, "tensor", t)
        if any_source and peer is None and group_peer is None:
            return t, None, _tag(fail, name, tag)
        p = member(g, fail, name, what, peer, group_peer)
        if p == g.rank:
            fail(name, f"{what}={g.ranks[p]} is this rank itself")
        return t, p, _tag(fail, name, tag)

    return validate


def _tag(fail: Fail, op: str, tag: Any) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool):
        fail(op, f"tag must be an int, got {type(tag).__name__}")
    return tag  # type: ignore[no-any-return]


def _all_gather_uneven(g: Facts, fail: Fail, out: Any, inp: Any, sizes: Any) -> tuple[Any, ...]:
    name = "all_gather_into_tensor_uneven"
    tensor(g, fail, name, "output", out)
    tensor(g, fail, name, "input", inp)
    same_dtype(fail, name, out, inp)
    _dim0(fail, name, out, inp)
    s = splits(g, fail, name, "output_split_sizes", sizes, out.shape[0])
    if s is None:
        s = [inp.shape[0]] * g.size
        if out.shape[0] != inp.shape[0] * g.size:
            fail(name, f"output dim 0 is {out.shape[0]}; expected {inp.shape[0]} x {g.size}")
    if inp.shape[0] != s[g.rank] or inp.shape[1:] != out.shape[1:]:
        fail(name, f"input shape {tuple(inp.shape)} does not match output_split_sizes[{g.rank}]={s[g.rank]} "
             f"and output's trailing shape {tuple(out.shape[1:])}")
    return out, inp, s


def _reduce_scatter_uneven(g: Facts, fail: Fail, out: Any, inp: Any, sizes: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter_tensor_uneven"
    tensor(g, fail, name, "output", out)
    tensor(g, fail, name, "input", inp)
    same_dtype(fail, name, out, inp)
    _dim0(fail, name, out, inp)
    s = splits(g, fail, name, "input_split_sizes", sizes, inp.shape[0])
    if s is None:
        s = [out.shape[0]] * g.size
        if inp.shape[0] != out.shape[0] * g.size:
            fail(name, f"input dim 0 is {inp.shape[0]}; expected {out.shape[0]} x {g.size}")
    if out.shape[0] != s[g.rank] or inp.shape[1:] != out.shape[1:]:
        fail(name, f"output shape {tuple(out.shape)} does not match input_split_sizes[{g.rank}]={s[g.rank]} "
             f"and input's trailing shape {tuple(inp.shape[1:])}")
    return out, inp, s, reduce_op(fail, name, op)


def _all_to_all_v(g: Facts, fail: Fail, out: Any, inp: Any, matrix: Any) -> tuple[Any, ...]:
    name = "all_to_all_v"
    tensor(g, fail, name, "output", out)
    tensor(g, fail, name, "input", inp)
    same_dtype(fail, name, out, inp)
    n = g.size
    if isinstance(matrix, (str, bytes)) or not hasattr(matrix, "__iter__"):
        fail(name, "send_count_matrix must be a list of lists of integers")
    rows = list(matrix)
    m = [counts(fail, name, f"send_count_matrix[{i}]", row) for i, row in enumerate(rows)]
    if len(m) != n or any(len(row) != n for row in m):
        fail(name, f"send_count_matrix must be {n}x{n} (the group size), got {[len(r) for r in m]}")
    sent, got = sum(m[g.rank]), sum(row[g.rank] for row in m)
    if inp.numel() != sent:
        fail(name, f"input has {inp.numel()} elements; row {g.rank} of the matrix sums to {sent}")
    if out.numel() != got:
        fail(name, f"output has {out.numel()} elements; column {g.rank} of the matrix sums to {got}")
    # A traced tensor has no data pointer: there the same tensor object is what in-place looks like.
    if out is inp or (out.numel() and not torch.compiler.is_compiling() and out.data_ptr() == inp.data_ptr()):
        fail(name, "output and input are the same buffer; in-place is not allowed")
    return out, inp, m


# ------------------------------------------------------------------------------------------------- the table

_T, _TS = Kind.TENSOR, Kind.TENSORS
_R, _W, _U = Access.READ, Access.WRITE, Access.UPDATE
_OP = Arg("op", Kind.REDUCE_OP)


def _spec(name: str, key: Collective, args: tuple[Arg, ...], validate: Validator, fingerprint: tuple[str, ...],
          variant: Collective | None = None) -> Spec:
    return Spec(name, key, args, validate, variant, fingerprint)


ALL_REDUCE: Final = _spec("all_reduce", C.ALL_REDUCE, (Arg("tensor", _T, _U), _OP), _all_reduce, ("tensor",))
ALL_REDUCE_COALESCED: Final = _spec(
    "all_reduce_coalesced", C.ALL_REDUCE_COALESCED, (Arg("tensors", Kind.TENSORS, _U), _OP), _all_reduce_coalesced,
    ("tensors",),
)
ALL_GATHER: Final = _spec(
    "all_gather", C.ALL_GATHER, (Arg("tensor_list", _TS, _W), Arg("tensor", _T, _R)), _all_gather,
    ("tensor", "tensor_list"),
)
ALL_GATHER_COALESCED: Final = _spec(
    "all_gather_coalesced", C.ALL_GATHER_COALESCED,
    (Arg("output_tensor_lists", Kind.TENSOR_LISTS, _W), Arg("input_tensor_list", _TS, _R)), _all_gather_coalesced,
    ("input_tensor_list",),
)
ALL_GATHER_INTO_TENSOR: Final = _spec(
    "all_gather_into_tensor", C.ALL_GATHER_INTO_TENSOR, (Arg("output_tensor", _T, _W), Arg("input_tensor", _T, _R)),
    _all_gather_into_tensor, ("output_tensor", "input_tensor"),
)
REDUCE_SCATTER: Final = _spec(
    "reduce_scatter", C.REDUCE_SCATTER, (Arg("output", _T, _W), Arg("input_list", _TS, _R), _OP), _reduce_scatter,
    ("output", "input_list"),
)
REDUCE_SCATTER_TENSOR: Final = _spec(
    "reduce_scatter_tensor", C.REDUCE_SCATTER_TENSOR, (Arg("output", _T, _W), Arg("input", _T, _R), _OP),
    _reduce_scatter_tensor, ("output", "input"),
)
ALL_TO_ALL: Final = _spec(
    "all_to_all", C.ALL_TO_ALL, (Arg("output_tensor_list", _TS, _W), Arg("input_tensor_list", _TS, _R)), _all_to_all,
    ("output_tensor_list", "input_tensor_list"),
)
ALL_TO_ALL_SINGLE: Final = _spec(
    "all_to_all_single", C.ALL_TO_ALL_SINGLE,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS),
     Arg("input_split_sizes", Kind.SPLITS)),
    _all_to_all_single, ("output", "input"), variant=C.ALL_TO_ALL_SINGLE_UNEVEN,
)
BROADCAST: Final = _spec("broadcast", C.BROADCAST, (Arg("tensor", _T, _U), Arg("src", Kind.ROOT)), _broadcast,
                         ("tensor",))
REDUCE: Final = _spec("reduce", C.REDUCE, (Arg("tensor", _T, _U), Arg("dst", Kind.ROOT), _OP), _reduce, ("tensor",))
GATHER: Final = _spec(
    "gather", C.GATHER, (Arg("tensor", _T, _R), Arg("gather_list", Kind.ROOT_TENSORS, _W), Arg("dst", Kind.ROOT)),
    _gather, ("tensor",),
)
SCATTER: Final = _spec(
    "scatter", C.SCATTER, (Arg("tensor", _T, _W), Arg("scatter_list", Kind.ROOT_TENSORS, _R), Arg("src", Kind.ROOT)),
    _scatter, ("tensor",),
)
BARRIER: Final = _spec("barrier", C.BARRIER, (), _barrier, ())
SEND: Final = _spec("send", C.SEND, (Arg("tensor", _T, _R), Arg("dst", Kind.PEER), Arg("tag", Kind.TAG)),
                    _p2p("send", "dst", any_source=False), ())
ISEND: Final = _spec("isend", C.SEND, SEND.args, _p2p("isend", "dst", any_source=False), ())
RECV: Final = _spec("recv", C.RECV, (Arg("tensor", _T, _W), Arg("src", Kind.PEER), Arg("tag", Kind.TAG)),
                    _p2p("recv", "src", any_source=True), (), variant=C.RECV_ANY_SOURCE)
IRECV: Final = _spec("irecv", C.RECV, RECV.args, _p2p("irecv", "src", any_source=True), (), variant=C.RECV_ANY_SOURCE)
ALL_GATHER_INTO_TENSOR_UNEVEN: Final = _spec(
    "all_gather_into_tensor_uneven", C.ALL_GATHER_INTO_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("output_split_sizes", Kind.SPLITS)), _all_gather_uneven,
    ("output", "output_split_sizes"),
)
REDUCE_SCATTER_TENSOR_UNEVEN: Final = _spec(
    "reduce_scatter_tensor_uneven", C.REDUCE_SCATTER_TENSOR_UNEVEN,
    (Arg("output", _T, _W), Arg("input", _T, _R), Arg("input_split_sizes", Kind.SPLITS), _OP),
    _reduce_scatter_uneven, ("input", "input_split_sizes"),
)
ALL_TO_ALL_V: Final = _spec(
    "all_to_all_v", C.ALL_TO_ALL_V, (Arg("output", _T, _W), Arg("input", _T, _R), Arg("send_count_matrix", Kind.MATRIX)),
    _all_to_all_v, ("send_count_matrix",),
)

#: Every collective's spec by capability key (the even form; ``isend``/``irecv`` are the send/recv specs renamed).
SPECS: Final[dict[Collective, Spec]] = {
    s.key: s
    for s in (
        ALL_REDUCE, ALL_REDUCE_COALESCED, ALL_GATHER, ALL_GATHER_COALESCED, ALL_GATHER_INTO_TENSOR, REDUCE_SCATTER,
        REDUCE_SCATTER_TENSOR, ALL_TO_ALL, ALL_TO_ALL_SINGLE, BROADCAST, REDUCE, GATHER, SCATTER, BARRIER, SEND, RECV,
        ALL_GATHER_INTO_TENSOR_UNEVEN, REDUCE_SCATTER_TENSOR_UNEVEN, ALL_TO_ALL_V,
    )
}
SPECS[C.ALL_TO_ALL_SINGLE_UNEVEN] = ALL_TO_ALL_SINGLE
SPECS[C.RECV_ANY_SOURCE] = RECV
