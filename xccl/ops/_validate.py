"""The validators of the collectives: what every rank can check alone, before anything is sent.

Each op's validator (``Spec.validate`` in ``_specs``) turns the public arguments into the kernel arguments and
calls ``fail(op, detail)`` on anything wrong: the eager path passes a ``fail`` that raises
:class:`~xccl.InvalidArgument`, the graph path one that raises its trace-time twin, so both modes refuse a bad call
with the same typed error. The shared checks below are the pieces every op's validator is made of.

Where ``torch.distributed`` refuses the same call itself before communicating (torch 2.13's
``distributed_c10d.py``), the detail starts with torch's own message and the error is the same builtin: a wrong
type is ``fail(op, detail, wrong_type=True)``, an :class:`~xccl.InvalidArgumentType` (a ``TypeError``); every other
refusal a ``ValueError``. Code that catches torch's errors, or matches their text, keeps working.
"""

from __future__ import annotations

import datetime as _dt
import operator
from collections.abc import Callable
from typing import Any, Final, NoReturn, Protocol

import torch
import torch.distributed as dist

from ._vocab import COMPLEX_REDUCE_OPS, reduce_op_of
from ._warn import warn_at_user

__all__ = [
    "BARE_PREMUL",
    "Facts",
    "Fail",
    "Validator",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_uneven",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "complex_refusal",
    "broadcast",
    "gather",
    "p2p",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_uneven",
    "scatter",
    "counts",
    "group_problem",
    "member",
    "monitored_barrier",
    "same_dtype",
    "splits",
    "tensor",
    "tensor_list",
]


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


class Fail(Protocol):
    """``fail(op, detail)`` raises the invalid-argument error of the calling path (``wrong_type``: its
    ``TypeError`` form); it never returns."""

    def __call__(self, op: str, detail: str, wrong_type: bool = False) -> NoReturn: ...


Validator = Callable[..., tuple[Any, ...]]
_TENSOR: Final = torch.Tensor


# ------------------------------------------------------------------------------------------- shared validators


def _not_a_tensor(what: str, value: Any) -> str:
    """torch's message for a parameter that is not a tensor (``_check_single_tensor``, whitespace normalised)."""
    return f"Invalid function argument. Expected parameter `{what}` of type torch.Tensor but got {type(value)} instead."


def tensor(g: Facts, fail: Fail, op: str, what: str, t: Any) -> torch.Tensor:
    """``t`` if it is a contiguous tensor on the group's device type."""
    if type(t) is not _TENSOR and not isinstance(t, _TENSOR):
        fail(op, _not_a_tensor(what, t), True)
    dev = g.device_type
    # is_cpu and is_cuda read a flag; t.device builds a device object (on every call of every collective).
    if not (t.is_cpu if dev == "cpu" else t.is_cuda if dev == "cuda" else t.device.type == dev):
        fail(op, f"{what} is on {t.device}, but the {g.backend} backend takes {dev} tensors; move it with .to()")
    if not t.is_contiguous():
        fail(op, f"{what} is not contiguous; call .contiguous() first")
    return t


def group_problem(group: Any) -> str | None:
    """Why ``group`` is not a process group this rank can use (None when it is; ``None`` is the world)."""
    if group is None:
        return None
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return "this rank is not a member of the group it passed"
    if not isinstance(group, dist.ProcessGroup):
        return f"expected a torch.distributed ProcessGroup or None, got {type(group).__name__}"
    return None


def _dtypes_differ(a: torch.dtype, b: torch.dtype, what: str) -> str:
    # torch's message (``_ensure_all_tensors_same_dtype``, its missing space and double space included), then ours.
    return f"Invalid usage of tensors with different dtypesFound {a} and  {b} ({what} dtypes differ)"


def same_dtype(fail: Fail, op: str, a: torch.Tensor, b: torch.Tensor, what: str = "output and input") -> None:
    """Both tensors have one dtype."""
    if a.dtype != b.dtype:
        fail(op, _dtypes_differ(a.dtype, b.dtype, what))


def tensor_list(g: Facts, fail: Fail, op: str, what: str, ts: Any, n: int | None = None) -> list[torch.Tensor]:
    """``ts`` as a list of valid tensors, one per member (or ``n``)."""
    if not isinstance(ts, (list, tuple)):
        fail(op, f"Invalid function argument. Expected parameter `{what}` of type List[torch.Tensor] but got "
             f"{type(ts)} instead.", True)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        fail(op, f"Invalid function argument. Expected parameter `{what}` of type List[torch.Tensor] but got "
             f"{type(ts)} with elements of type {[type(t) for t in ts]}.", True)
    want = g.size if n is None else n
    if len(ts) != want:
        fail(op, f"{what} has {len(ts)} tensors; the group has {g.size} ranks")
    for i, t in enumerate(ts):
        tensor(g, fail, op, f"{what}[{i}]", t)
    return list(ts)


def member(g: Facts, fail: Fail, op: str, what: str, rank: Any, group_rank: Any) -> int:
    """A root or peer given as a global rank (``rank``) or a group rank (``group_<what>``), as a group rank.

    The messages start with torch's (``_canonicalize_group_rank``, ``get_group_rank``, ``get_global_rank``).
    """
    if group_rank is not None:
        if rank is not None:
            fail(op, f"Can't specify both group_rank and global_rank: pass {what} or group_{what}, not both")
        if not isinstance(group_rank, int) or isinstance(group_rank, bool) or not 0 <= group_rank < g.size:
            fail(op, f"Group rank {group_rank!r} is not part of group (ranks {list(g.ranks)}): group_{what} is "
                 f"outside [0, {g.size})")
        return group_rank
    if rank is None:
        fail(op, f"Must specify global_rank or group_rank: {what} is required")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in g.ranks:
        fail(op, f"Global rank {rank!r} is not part of group (ranks {list(g.ranks)}): {what} must be a member")
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
        if not hasattr(s, "__index__"):  # not try/except: torch 2.8's Dynamo cannot trace catching the TypeError
            fail(op, f"{what}={items!r} must hold integers, but has {s!r} ({type(s).__name__})")
        out.append(operator.index(s))
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
    """A ``ReduceOp`` (kept as given) from a ``ReduceOp``, its name, or DeepSpeed's enum.

    What else torch refuses about a reduce op (one not defined for complex numbers on a complex tensor, a
    ``PREMUL_SUM`` without its factor) is checked where the op's name is known without tracing into it:
    ``_dispatch.plan`` and the graph path's ``resolve``/``redop`` (:data:`BARE_PREMUL`, :func:`complex_refusal`).
    """
    try:
        return reduce_op_of(value)
    except ValueError as exc:
        fail(op, str(exc))


def complex_refusal(op: str, reduce_op: Any) -> str:
    """torch's message for a reduce op not defined for complex numbers (its all_reduce refuses them)."""
    what = "all_reduce" if op.startswith("all_reduce") else op  # all_reduce_coalesced says "all_reduce" too
    return (f"{what} does not support {reduce_op} on complex tensors (only {', '.join(sorted(COMPLEX_REDUCE_OPS))} "
            "are defined for complex numbers)")


#: A bare ``ReduceOp.PREMUL_SUM`` has no factor (torch's own wrappers fail on it with a pybind TypeError).
BARE_PREMUL = ("ReduceOp.PREMUL_SUM needs its factor: pass torch.distributed._make_nccl_premul_sum(factor), as FSDP "
                "does")


def _rows(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() else 0


def _pair(g: Facts, fail: Fail, op: str, out: Any, inp: Any, names: tuple[str, str] = ("output", "input")) -> None:
    """An output and an input tensor, each valid (:func:`tensor`), of one dtype."""
    tensor(g, fail, op, names[0], out)
    tensor(g, fail, op, names[1], inp)
    same_dtype(fail, op, out, inp)


def _dim0(fail: Fail, op: str, *ts: torch.Tensor) -> None:
    if any(t.dim() == 0 for t in ts):
        fail(op, "output and input need at least one dimension")


# -------------------------------------------------------------------------------------------------- per op


def all_reduce(g: Facts, fail: Fail, t: Any, op: Any) -> tuple[Any, ...]:
    return tensor(g, fail, "all_reduce", "tensor", t), reduce_op(fail, "all_reduce", op)


def all_reduce_coalesced(g: Facts, fail: Fail, ts: Any, op: Any) -> tuple[Any, ...]:
    name = "all_reduce_coalesced"
    if not isinstance(ts, (list, tuple)):
        fail(name, f"Invalid function argument. Expected parameter `tensor` of type List[torch.Tensor] but got "
             f"{type(ts)} instead.", True)
    if not ts:
        fail(name, "tensors must be a non-empty list of tensors")
    lst = [tensor(g, fail, name, f"tensors[{i}]", t) for i, t in enumerate(ts)]
    return lst, reduce_op(fail, name, op)


def all_gather(g: Facts, fail: Fail, outs: Any, t: Any) -> tuple[Any, ...]:
    name = "all_gather"
    tensor(g, fail, name, "tensor", t)
    lst = tensor_list(g, fail, name, "tensor_list", outs)
    for i, o in enumerate(lst):
        same_dtype(fail, name, o, t, f"tensor_list[{i}] and tensor")
    if lst[g.rank].shape != t.shape:
        fail(name, f"tensor_list[{g.rank}] has shape {tuple(lst[g.rank].shape)}, tensor has {tuple(t.shape)}")
    return lst, t


def all_gather_coalesced(g: Facts, fail: Fail, out_lists: Any, ins: Any) -> tuple[Any, ...]:
    name = "all_gather_coalesced"
    if not isinstance(ins, (list, tuple)):
        fail(name, f"Invalid function argument. Expected parameter `input_tensor_list` of type List[torch.Tensor] "
             f"but got {type(ins)} instead.", True)
    if not ins:
        fail(name, "input_tensor_list must be a non-empty list of tensors")
    if not isinstance(out_lists, (list, tuple)):
        fail(name, "Invalid function argument: output_tensor_lists should be a list", True)
    if len(out_lists) != g.size:
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


def all_gather_into_tensor(g: Facts, fail: Fail, out: Any, inp: Any) -> tuple[Any, ...]:
    name = "all_gather_into_tensor"
    _pair(g, fail, name, out, inp, ("output_tensor", "input_tensor"))
    if out.numel() != inp.numel() * g.size:
        fail(name, f"output has {out.numel()} elements; expected input's {inp.numel()} x {g.size} ranks")
    return out, inp


def reduce_scatter(g: Facts, fail: Fail, out: Any, ins: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter"
    tensor(g, fail, name, "output", out)
    lst = tensor_list(g, fail, name, "input_list", ins)
    for i, t in enumerate(lst):
        same_dtype(fail, name, out, t, f"output and input_list[{i}]")
        if t.shape != out.shape:
            fail(name, f"input_list[{i}] has shape {tuple(t.shape)}, output has {tuple(out.shape)}")
    return out, lst, reduce_op(fail, name, op)


def reduce_scatter_tensor(g: Facts, fail: Fail, out: Any, inp: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter_tensor"
    _pair(g, fail, name, out, inp)
    if inp.numel() != out.numel() * g.size:
        fail(name, f"input has {inp.numel()} elements; expected output's {out.numel()} x {g.size} ranks")
    return out, inp, reduce_op(fail, name, op)


def all_to_all(g: Facts, fail: Fail, outs: Any, ins: Any) -> tuple[Any, ...]:
    name = "all_to_all"
    o = tensor_list(g, fail, name, "output_tensor_list", outs)
    i = tensor_list(g, fail, name, "input_tensor_list", ins)
    dtype = i[0].dtype
    for t in [*o, *i]:
        if t.dtype != dtype:
            fail(name, _dtypes_differ(dtype, t.dtype, "input and output tensors'"))
    if o[g.rank].numel() != i[g.rank].numel():
        fail(name, f"output/input sizes for this rank ({g.rank}) differ")
    return o, i


def all_to_all_single(g: Facts, fail: Fail, out: Any, inp: Any, osz: Any, isz: Any) -> tuple[Any, ...]:
    name = "all_to_all_single"
    _pair(g, fail, name, out, inp)
    n = g.size
    if osz is None and isz is None and out.dim() and inp.dim() and not out.shape[0] % n and not inp.shape[0] % n:
        if out.numel() != inp.numel():  # the even case, the common one, without the general checks' loop
            fail(name, f"output has {out.numel()} elements, input {inp.numel()}")
        return out, inp, None, None
    o = splits(g, fail, name, "output_split_sizes", osz, _rows(out))
    i = splits(g, fail, name, "input_split_sizes", isz, _rows(inp))
    for what, t, sizes in (("output", out, o), ("input", inp, i)):
        if sizes is None and (t.dim() == 0 or t.shape[0] % n):
            fail(name, f"{what} dim 0 must divide evenly by {n} without {what}_split_sizes")
    if o is None and i is None and out.numel() != inp.numel():
        fail(name, f"output has {out.numel()} elements, input {inp.numel()}")
    return out, inp, o, i


def broadcast(g: Facts, fail: Fail, t: Any, src: Any, group_src: Any) -> tuple[Any, ...]:
    return tensor(g, fail, "broadcast", "tensor", t), member(g, fail, "broadcast", "src", src, group_src)


def reduce(g: Facts, fail: Fail, t: Any, dst: Any, op: Any, group_dst: Any) -> tuple[Any, ...]:
    tensor(g, fail, "reduce", "tensor", t)
    return t, member(g, fail, "reduce", "dst", dst, group_dst), reduce_op(fail, "reduce", op)


def _rooted(g: Facts, fail: Fail, op: str, what: str, t: Any, lst: Any, rank: Any, group_rank: Any) -> tuple[Any, ...]:
    """gather's and scatter's ``(tensor, <op>_list on the root else None, root)``; the list only on the root."""
    tensor(g, fail, op, "tensor", t)
    # torch.distributed's default root is global rank 0.
    root = member(g, fail, op, what, 0 if rank is None and group_rank is None else rank, group_rank)
    role, list_name = ("destination" if what == "dst" else "source"), f"{op}_list"
    if g.rank != root:
        if lst:
            fail(op, f"Argument ``{list_name}`` must NOT be specified on non-{role} ranks.")
        return t, None, root
    if not lst:  # torch's _validate_output_list_for_rank (gather) and scatter's own check
        fail(op, f"Argument ``{list_name}`` must be specified on {role} rank.")
    items = tensor_list(g, fail, op, list_name, lst)
    for i, x in enumerate(items):
        same_dtype(fail, op, x, t, f"{list_name}[{i}] and tensor")
        if x.shape != t.shape:
            fail(op, f"{list_name}[{i}] has shape {tuple(x.shape)}, tensor {tuple(t.shape)}")
    return t, items, root


def gather(g: Facts, fail: Fail, t: Any, lst: Any, dst: Any, group_dst: Any) -> tuple[Any, ...]:
    return _rooted(g, fail, "gather", "dst", t, lst, dst, group_dst)


def scatter(g: Facts, fail: Fail, t: Any, lst: Any, src: Any, group_src: Any) -> tuple[Any, ...]:
    return _rooted(g, fail, "scatter", "src", t, lst, src, group_src)


def barrier(g: Facts, fail: Fail) -> tuple[Any, ...]:
    return ()


def monitored_barrier(g: Facts, fail: Fail, timeout: Any, wait_all_ranks: Any) -> tuple[Any, ...]:
    """torch's checks (``monitored_barrier``, ``_check_valid_timeout``): a ``timedelta`` or None (the group's
    timeout); a float is taken as seconds, with torch's warning."""
    if isinstance(timeout, float) and not isinstance(timeout, bool):
        warn_at_user("Please specify timeout arg as a timedelta. "
                     f"Converting current value of {timeout} assuming it represents seconds")
        timeout = _dt.timedelta(seconds=timeout)
    if timeout is not None and not isinstance(timeout, _dt.timedelta):
        fail("monitored_barrier", f"Expected timeout argument to be of type datetime.timedelta, got {timeout}", True)
    return timeout, bool(wait_all_ranks)


def p2p(name: str, what: str, any_source: bool) -> Validator:
    def validate(g: Facts, fail: Fail, t: Any, peer: Any, tag: Any, group_peer: Any) -> tuple[Any, ...]:
        tensor(g, fail, name, "tensor", t)
        if any_source and peer is None and group_peer is None:
            return t, None, _tag(fail, name, tag)
        p = member(g, fail, name, what, peer, group_peer)
        if p == g.rank:
            role = "destination" if what == "dst" else "source"
            fail(name, f"Invalid {role} rank: {role} rank should not be the same as the rank of the current "
                 f"process. ({what}={g.ranks[p]} is this rank itself)")
        return t, p, _tag(fail, name, tag)

    return validate


def _tag(fail: Fail, op: str, tag: Any) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool):
        fail(op, f"tag must be an int, got {type(tag).__name__}", True)
    return tag


def _uneven_splits(g: Facts, fail: Fail, name: str, sizes_name: str, sizes: Any, whole: tuple[str, Any],
                   part: tuple[str, Any]) -> list[int]:
    """The split sizes of an uneven all_gather / reduce_scatter: ``whole`` (the gathered output, or the input to
    reduce) is split along dim 0 by ``sizes``; ``part`` (this rank's share) must be row ``g.rank`` of it. No sizes:
    even splits."""
    (whole_name, w), (part_name, p) = whole, part
    s = splits(g, fail, name, sizes_name, sizes, w.shape[0])
    if s is None:
        s = [p.shape[0]] * g.size
        if w.shape[0] != p.shape[0] * g.size:
            fail(name, f"{whole_name} dim 0 is {w.shape[0]}; expected {p.shape[0]} x {g.size}")
    if p.shape[0] != s[g.rank] or p.shape[1:] != w.shape[1:]:
        fail(name, f"{part_name} shape {tuple(p.shape)} does not match {sizes_name}[{g.rank}]={s[g.rank]} "
             f"and {whole_name}'s trailing shape {tuple(w.shape[1:])}")
    return s


def all_gather_uneven(g: Facts, fail: Fail, out: Any, inp: Any, sizes: Any) -> tuple[Any, ...]:
    name = "all_gather_into_tensor_uneven"
    _pair(g, fail, name, out, inp)
    _dim0(fail, name, out, inp)
    return out, inp, _uneven_splits(g, fail, name, "output_split_sizes", sizes, ("output", out), ("input", inp))


def reduce_scatter_uneven(g: Facts, fail: Fail, out: Any, inp: Any, sizes: Any, op: Any) -> tuple[Any, ...]:
    name = "reduce_scatter_tensor_uneven"
    _pair(g, fail, name, out, inp)
    _dim0(fail, name, out, inp)
    s = _uneven_splits(g, fail, name, "input_split_sizes", sizes, ("input", inp), ("output", out))
    return out, inp, s, reduce_op(fail, name, op)


def all_to_all_v(g: Facts, fail: Fail, out: Any, inp: Any, matrix: Any) -> tuple[Any, ...]:
    name = "all_to_all_v"
    _pair(g, fail, name, out, inp)
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
