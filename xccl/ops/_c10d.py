"""c10d's side of each op: the methods torch calls on a process group, and the calls xccl makes on the vendor's.

Three facts per op, attached to its :class:`~xccl.ops._specs.Spec` (``Spec.c10d``, ``Spec.kernel``, ``Spec.tool``):

* **decoding** (:class:`Method`): torch reaches a ``ProcessGroup`` through its C++ virtuals (``allreduce``,
  ``_reduce_scatter_base``, ...) under other names too: torch 2.13 renamed the single-tensor collectives
  (``reduce_scatter_single`` for ``_reduce_scatter_base``) and the trampoline exposes the coalesced C++ methods under
  both names (the functional all_gather calls ``allgather_into_tensor_coalesced``, which Python sees as
  ``all_gather_single_coalesced``). A method's decoder turns the c10d call (tensors, options struct) back into the
  public arguments of xccl's function: xccl's process group dispatches them, the simulated vendor group checks them;
* **encoding** (``Spec.kernel``): the kernel that calls the vendor's own c10d method, with the options struct torch's
  own wrappers would build. It never re-enters xccl (``dist.all_reduce`` on xccl's group lands in xccl's group,
  whose kernel calls the vendor's ``allreduce``); roots and peers are group ranks, translated once in validation;
  options structs that carry no per-call value are built once per kernel and reused: building one costs about a
  microsecond, as much as the rest of dispatch, and backends copy what they need when the work is enqueued. Each
  tells the backend whether the caller blocks (``asyncOp``), as torch's wrappers do: NCCL launches a blocking
  call on the current stream, without the two event syncs and the tensor stashing of an asynchronous one
  (pytorch/pytorch#150398, torch 2.8; on 2.7 the options have no such field, and every call is asynchronous to the
  backend: ``_torch.ASYNC_OP``);
* **what tools see** (``Spec.tool``): the dispatcher op torch's own path would run (``torch.ops.c10d.<op>``) with
  its arguments, for CommDebugMode and the profiler (``xccl.collectives._observe``).

A kernel is called as ``kernel(*kernel_args, async_op)`` and returns the work (async) or None once complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from ._torch import ASYNC_OP, TORCH
from ._vocab import Collective

__all__ = ["Method", "Tool", "done", "op_of", "root_of", "sum_op", "tensors_of"]

C = Collective
Kernel = Callable[..., Any]
#: What tools are shown of a call: the dispatcher op torch's own path runs (``torch.ops.c10d.<name>``) and its
#: arguments, built from the kernel arguments ``k`` and a carrier group ``b`` (``xccl.collectives._observe``).
Tool = tuple[str, Callable[[Sequence[Any], Any], tuple[Any, ...]]]
_RED_OP_TYPE: Final = ReduceOp.RedOpType
_SUM: Final = ReduceOp.SUM
_PREMUL_SUM: Final = ReduceOp.RedOpType.PREMUL_SUM  # type: ignore[attr-defined]
#: Each plain reduce op's one ``RedOpType`` object, by value (pybind hands out a new object on every read).
_CANONICAL: Final = {v.value: v for v in ReduceOp.RedOpType.__members__.values()}
_PREMUL: Final = _PREMUL_SUM.value
#: ``id`` of each of those objects -> its value. pybind's ``RedOpType.__hash__`` is a call into pybind (about
#: 0.35 us), paid by every dict keyed on one; these objects live as long as the process, so their ids are theirs
#: alone and key a dict for the price of an int's hash (the plan cache, the options caches).
PLAIN_OP_KEY: Final = {id(v): value for value, v in _CANONICAL.items()}


@final
@dataclass(frozen=True, slots=True)
class Method:
    """One of c10d's ``ProcessGroup`` methods that leads to an op.

    ``decode(*args)`` takes the method's arguments (after ``self``) and returns ``(key, public)``: the capability
    key of the call and the public arguments of xccl's function (without ``group`` and ``async_op``); a method that
    stands for one call per pair (:attr:`pairs`) returns ``(key, [public, ...])``.
    """

    #: The C++ virtual's name.
    name: str
    decode: Callable[..., tuple[Collective, Any]]
    #: The other names Python code and the trampoline call it by.
    aliases: tuple[str, ...] = ()
    #: Whether the vendor's method reduces (a simulated vendor checks its reduce op), and in place on its first
    #: argument (the others read their second).
    reduces: bool = False
    in_place: bool = False
    #: One collective per (output, input) pair: the coalesced tensor forms.
    pairs: bool = False
    #: The dispatcher op tools see for the whole call, for :attr:`pairs` methods (the others: their op's).
    tool: Tool | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the method is called by."""
        return (self.name, *self.aliases)


# ------------------------------------------------------------------------------------------- decoding helpers


def tensors_of(value: Any) -> list[torch.Tensor]:
    """A c10d tensor argument as a list (a bare tensor, or a list of them)."""
    return [value] if isinstance(value, torch.Tensor) else list(value)


def op_of(opts: Any) -> Any:
    """The reduce op of a c10d call: its options struct's, a ``ReduceOp`` passed directly, or SUM.

    An options struct holds a ``ReduceOp`` *object* (a new one per read); a plain op is returned as the one
    ``RedOpType`` object of its kind (``ReduceOp.SUM``...), which the plan cache keys on, as it does for
    ``xccl.all_reduce(op=SUM)``: pybind hands out a new ``RedOpType`` object on every read, and comparing two of them
    is a call into pybind (about 0.4 us, on every plan lookup) where comparing one with itself is not. Only
    premul_sum, whose object carries its factor, stays an object.
    """
    if opts is None:
        return _SUM
    op = getattr(opts, "reduceOp", opts)
    if type(op) is ReduceOp and op == _SUM:  # type: ignore[comparison-overlap]  # SUM: one call into pybind, not two
        return _SUM
    kind = getattr(op, "op", None)
    if kind is None:
        return op
    value = kind.value
    return op if value == _PREMUL else _CANONICAL[value]


def root_of(opts: Any) -> int:
    """The root (a group rank) of a c10d call: its options struct's, or an int passed directly."""
    return opts if isinstance(opts, int) else int(getattr(opts, "rootRank", 0))


def d_allreduce(tensors: Any, opts: Any = None) -> tuple[Collective, Any]:
    ts = tensors_of(tensors)
    if len(ts) == 1:
        return C.ALL_REDUCE, (ts[0], op_of(opts))
    return C.ALL_REDUCE_COALESCED, (ts, op_of(opts))


def d_allreduce_coalesced(tensors: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.ALL_REDUCE_COALESCED, (list(tensors), op_of(opts))


def d_allgather(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    # ``[[outputs]], [input]`` as c10d passes them, or ``[outputs], input``.
    if isinstance(inputs, torch.Tensor):
        return C.ALL_GATHER, (list(outputs), inputs)
    return C.ALL_GATHER, (list(outputs[0]), inputs[0])


def d_allgather_coalesced(output_lists: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.ALL_GATHER_COALESCED, ([list(o) for o in output_lists], list(inputs))


def d_allgather_base(output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> tuple[Collective, Any]:
    return C.ALL_GATHER_INTO_TENSOR, (output, input)


def d_allgather_pairs(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.ALL_GATHER_INTO_TENSOR, [(o, i) for o, i in zip(outputs, inputs, strict=True)]


def d_reduce_scatter(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    # ``[output], [[inputs]]`` as c10d passes them, or ``output, [inputs]``.
    if isinstance(outputs, torch.Tensor):
        return C.REDUCE_SCATTER, (outputs, list(inputs), op_of(opts))
    return C.REDUCE_SCATTER, (outputs[0], list(inputs[0]), op_of(opts))


def d_reduce_scatter_base(output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> tuple[Collective, Any]:
    return C.REDUCE_SCATTER_TENSOR, (output, input, op_of(opts))


def d_reduce_scatter_pairs(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    op = op_of(opts)
    return C.REDUCE_SCATTER_TENSOR, [(o, i, op) for o, i in zip(outputs, inputs, strict=True)]


def d_alltoall(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.ALL_TO_ALL, (list(outputs), list(inputs))


def d_alltoall_base(output: torch.Tensor, input: torch.Tensor, osz: Any, isz: Any, opts: Any = None
                   ) -> tuple[Collective, Any]:
    # Empty split sizes mean even splits, as in c10d.
    return C.ALL_TO_ALL_SINGLE, (output, input, list(osz) or None, list(isz) or None)


def d_broadcast(tensors: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.BROADCAST, (tensors_of(tensors)[0], None, root_of(opts))


def d_reduce(tensors: Any, opts: Any = None) -> tuple[Collective, Any]:
    return C.REDUCE, (tensors_of(tensors)[0], None, op_of(opts), root_of(opts))


def d_gather(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    # ``[[outputs]]`` on the root, ``[]`` elsewhere.
    lst = list(outputs[0]) if outputs else None
    return C.GATHER, (tensors_of(inputs)[0], lst, None, root_of(opts))


def d_scatter(outputs: Any, inputs: Any, opts: Any = None) -> tuple[Collective, Any]:
    # ``[[inputs]]`` on the root, ``[]`` elsewhere.
    lst = list(inputs[0]) if inputs else None
    return C.SCATTER, (tensors_of(outputs)[0], lst, None, root_of(opts))


def d_barrier(opts: Any = None) -> tuple[Collective, Any]:
    return C.BARRIER, ()


def d_send(tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> tuple[Collective, Any]:
    return C.SEND, (tensors[0], None, tag, dst)


def d_recv(tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> tuple[Collective, Any]:
    return C.RECV, (tensors[0], None, tag, src)


def d_recv_anysource(tensors: Sequence[torch.Tensor], tag: int = 0) -> tuple[Collective, Any]:
    # The returned work reports the sender (``_source_rank()``).
    return C.RECV, (tensors[0], None, tag, None)


def sum_op() -> Any:
    # The only ReduceOp torch lets Python hand to a c10d op (the script class has no other constructor); tools read
    # the op's name and tensors.
    return torch.classes.c10d.ReduceOp()


# ---------------------------------------------------------------------------------------------------- encoding


def done(work: Any, async_op: bool) -> Any:
    """``work`` for an asynchronous call; otherwise wait for it and return None (torch's wrappers do the same). A
    blocking call may return no work: NCCL runs it on the current stream and returns None."""
    if async_op:
        return work
    if work is not None:
        work.wait()
    return None


#: Whether the options structs say if the caller blocks (``asyncOp``, torch 2.8 on).
_TELLS_ASYNC: Final = TORCH.has(ASYNC_OP)


def _options(cls: type, async_op: bool, **fields: Any) -> Any:
    """An options struct of ``cls`` with ``fields`` set, and ``asyncOp`` where this torch has it."""
    opts = cls()
    if _TELLS_ASYNC:
        opts.asyncOp = async_op
    for k, v in fields.items():
        setattr(opts, k, v)
    return opts


def _both(cls: type, **fixed: Any) -> tuple[Any, Any]:
    """Options of ``cls`` for a blocking call and for an asynchronous one: ``_both(cls)[async_op]``."""
    return _options(cls, False, **fixed), _options(cls, True, **fixed)


def _with_op(cls: type) -> Callable[[Any, bool], Any]:
    """Options of ``cls`` with ``reduceOp`` set: cached per plain reduce op (and ``asyncOp``), built per call for
    instances (``premul_sum`` carries its factor)."""
    caches: tuple[dict[int, Any], dict[int, Any]] = ({}, {})

    def options(op: Any, async_op: bool) -> Any:
        cache = caches[async_op]
        opts = cache.get(id(op))  # only the plain ops' own objects are cached (PLAIN_OP_KEY)
        if opts is None:
            opts = _options(cls, async_op, reduceOp=op)
            if id(op) in PLAIN_OP_KEY:
                cache[id(op)] = opts
        return opts

    return options


def _rooted(cls: type, **fixed: Any) -> Callable[[int, bool], Any]:
    """Options of ``cls`` with ``rootRank`` set, cached per root (both ``asyncOp`` values: :func:`_both`)."""
    cache: dict[int, tuple[Any, Any]] = {}

    def options(root: int, async_op: bool) -> Any:
        both = cache.get(root)
        if both is None:
            both = cache[root] = _both(cls, rootRank=root, **fixed)
        return both[async_op]

    return options


def _rows_of(big: torch.Tensor, small: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``big`` viewed as ``small``'s rows stacked along dim 0 (a 0-d ``small`` as one row): the layout c10d's
    tensor collectives check chunk by chunk, whatever shape the caller's tensor has (stacked, or flat). Two flat
    tensors, the common case, already are: they are passed as they are (a view is a dispatcher call, a
    microsecond)."""
    dim = small.dim()
    if dim == 1 and big.dim() == 1:
        return big, small
    if dim == 0:
        small = small.view(1)
    return big.view(-1, *small.shape[1:]), small


def k_allreduce(native: Any) -> Kernel:
    call, options = native.allreduce, _with_op(AllreduceOptions)

    def all_reduce(t: torch.Tensor, op: Any, a: bool) -> Any:
        work = call([t], options(op, a))
        if a:
            return work
        if work is not None:  # none from NCCL for a blocking call (see done)
            work.wait()
        return None

    return all_reduce


def k_allreduce_coalesced(native: Any) -> Kernel:
    call, options = native.allreduce_coalesced, _with_op(AllreduceCoalescedOptions)
    return lambda ts, op, a: done(call(list(ts), options(op, a)), a)


def k_allgather(native: Any) -> Kernel:
    call, opts = native.allgather, _both(AllgatherOptions)
    return lambda outs, t, a: done(call([list(outs)], [t], opts[a]), a)


def k_allgather_coalesced(native: Any) -> Kernel:
    call, opts = native.allgather_coalesced, _both(AllgatherOptions)
    return lambda outs, ins, a: done(call([list(o) for o in outs], list(ins), opts[a]), a)


def k_allgather_base(native: Any) -> Kernel:
    call, opts = native._allgather_base, _both(AllgatherOptions)

    def gather_base(out: torch.Tensor, t: torch.Tensor, a: bool) -> Any:
        out, t = _rows_of(out, t)
        return done(call(out, t, opts[a]), a)

    return gather_base


def k_reduce_scatter(native: Any) -> Kernel:
    call, options = native.reduce_scatter, _with_op(ReduceScatterOptions)
    return lambda out, ins, op, a: done(call([out], [list(ins)], options(op, a)), a)


def k_reduce_scatter_base(native: Any) -> Kernel:
    call, options = native._reduce_scatter_base, _with_op(ReduceScatterOptions)

    def scatter_base(out: torch.Tensor, t: torch.Tensor, op: Any, a: bool) -> Any:
        t, out = _rows_of(t, out)
        return done(call(out, t, options(op, a)), a)

    return scatter_base


def k_alltoall(native: Any) -> Kernel:
    call, opts = native.alltoall, _both(AllToAllOptions)
    return lambda outs, ins, a: done(call(list(outs), list(ins), opts[a]), a)


def k_alltoall_base(native: Any) -> Kernel:
    call, opts = native.alltoall_base, _both(AllToAllOptions)
    return lambda out, t, osz, isz, a: done(call(out, t, osz or [], isz or [], opts[a]), a)


def k_broadcast(native: Any) -> Kernel:
    call, options = native.broadcast, _rooted(BroadcastOptions, rootTensor=0)
    return lambda t, root, a: done(call([t], options(root, a)), a)


def k_reduce(native: Any) -> Kernel:
    call = native.reduce

    def reduce(t: torch.Tensor, root: int, op: Any, a: bool) -> Any:
        return done(call([t], _options(ReduceOptions, a, rootRank=root, rootTensor=0, reduceOp=op)), a)

    return reduce


def k_gather(native: Any) -> Kernel:
    call, options = native.gather, _rooted(GatherOptions)
    # c10d's gather takes the root's output list wrapped in a list, and an empty list elsewhere.
    return lambda t, lst, root, a: done(call([list(lst)] if lst is not None else [], [t], options(root, a)), a)


def k_scatter(native: Any) -> Kernel:
    call, options = native.scatter, _rooted(ScatterOptions)
    return lambda t, lst, root, a: done(call([t], [list(lst)] if lst is not None else [], options(root, a)), a)


def k_barrier(native: Any) -> Kernel:
    call, opts = native.barrier, _both(BarrierOptions)
    return lambda a: done(call(opts[a]), a)


def k_send(native: Any) -> Kernel:
    call = native.send
    return lambda t, peer, tag, a: done(call([t], peer, tag), a)


def k_recv(native: Any) -> Kernel:
    call = native.recv
    return lambda t, peer, tag, a: done(call([t], peer, tag), a)


def k_recv_anysource(native: Any) -> Kernel:
    call = native.recv_anysource
    # Always the work: the caller reads the sender from it (recv without src returns the sender's rank).
    return lambda t, peer, tag, a: call([t], tag)
