"""Fingerprints: what the mismatch detector records of each collective call, and the rules that say whether the
calls of a group's ranks can be one collective.

A call is described three ways:

* its *key*, a tuple of Python objects (capability key, reduce op, root, each tensor's dtype and shape, split
  sizes) built on every call without formatting a string, to look up its interned :class:`Fp`;
* its :class:`Call` (and that call's fixed-format ASCII text, which is what travels between ranks), built once
  per distinct key;
* its *canonical digest*, a 64-bit hash of what every rank's call must share: for most ops the whole call, for
  the ops whose tensors legitimately differ between ranks (all_gather's own tensor, all_to_all's sizes) only the
  common part. The rolling hash of a group's sequence is built from these digests, so ranks whose calls agree
  have equal hashes.

Nothing a peer sends is unpickled or evaluated: texts are parsed field by field with a size cap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ...ops import _specs as S
from ...plugin._capabilities import Collective, Level, reduce_op_name

__all__ = ["PLANS", "Call", "Fp", "Plan", "canonical", "decode", "disagreement", "encode", "plan_of"]

C = Collective
_VERSION: Final = "x1"
_NFIELDS: Final = 9
#: Largest fingerprint accepted from a peer (a list collective over 1024 ranks of 8-d tensors fits).
MAX_BYTES: Final = 1 << 18
_RED_OP_TYPE: Final = dist.ReduceOp.RedOpType
_ASYMMETRIC_A2A: Final = frozenset({C.ALL_TO_ALL_SINGLE.value, C.ALL_TO_ALL_SINGLE_UNEVEN.value})
_DTYPE_NAMES: Final[dict[torch.dtype, str]] = {}


@final
@dataclass(frozen=True, slots=True)
class Call:
    """One rank's collective call, as its fingerprint describes it."""

    #: The group's sequence number of the call (-1 in an interned fingerprint, which serves every step).
    seq: int
    #: The collective (``Collective`` value).
    op: str
    #: Name of the group the call was made on.
    group: str
    #: Size of that group.
    size: int
    #: (dtype name, shape) of each tensor argument, in the order the op's spec names them.
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    #: Reduce op name, or ``""``.
    reduce_op: str
    #: Root (group rank), or -1.
    root: int
    #: Split sizes or counts, when the op takes them.
    extra: tuple[int, ...]

    def at(self, seq: int) -> Call:
        """The same call at step ``seq``."""
        return replace(self, seq=seq)

    def describe(self) -> str:
        """``all_reduce(float32[4], op=sum) #5 on group '0'``."""
        args = [_fmt(t) for t in self.tensors]
        if self.reduce_op:
            args.append(f"op={self.reduce_op}")
        if self.root >= 0:
            args.append(f"root={self.root}")
        if self.extra:
            args.append(f"counts={list(self.extra)}")
        return f"{self.op}({', '.join(args)}) #{self.seq} on group {self.group!r}"


def encode(call: Call) -> str:
    """The fingerprint text of ``call`` (the inverse of :func:`decode`)."""
    ts = " ".join(f"{d}:{'x'.join(map(str, s))}" for d, s in call.tensors)
    # ';' separates fields: a group name holding one (torch's names never do) must not shift them.
    name = call.group.replace(";", "_")
    return (f"{_VERSION};{call.seq};{call.op};{name};{call.size};{ts};{call.reduce_op};{call.root};"
            f"{','.join(map(str, call.extra))}")


def decode(raw: str | bytes) -> Call:
    """Parse a fingerprint text.

    Raises:
        ValueError: not a fingerprint of this format (another xccl version, or garbage).
    """
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{len(raw)} bytes, more than {MAX_BYTES}")
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    if not text.isascii():
        raise ValueError("not ASCII")
    fields = text.split(";")
    if len(fields) != _NFIELDS or fields[0] != _VERSION:
        raise ValueError(f"not an {_VERSION} fingerprint: {text[:80]!r}")
    _, seq, op, group, size, tensors, redop, root, extra = fields
    return Call(
        int(seq), op, group, int(size), tuple(_parse_tensor(t) for t in tensors.split(" ") if t),
        redop, int(root), tuple(int(x) for x in extra.split(",") if x),
    )


def _parse_tensor(text: str) -> tuple[str, tuple[int, ...]]:
    dtype, sep, dims = text.partition(":")
    if not sep or not dtype.isidentifier():
        raise ValueError(f"bad tensor field {text!r}")
    return dtype, tuple(int(d) for d in dims.split("x") if d)


def _fmt(t: tuple[str, tuple[int, ...]]) -> str:
    return f"{t[0]}[{','.join(map(str, t[1]))}]"


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


# ------------------------------------------------------------------------------------------------------ interned


def aliases(table: Any) -> dict[str, str]:
    """Even and uneven all_to_all_single are one call where the backend runs both natively (one kernel)."""
    even, uneven = C.ALL_TO_ALL_SINGLE, C.ALL_TO_ALL_SINGLE_UNEVEN
    if table.entry(even).level is Level.NATIVE and table.entry(uneven).level is Level.NATIVE:
        return {uneven.value: even.value}
    return {}


def canonical(call: Call, alias: dict[str, str]) -> str:
    """What every rank's call of one collective shares: the whole call, but for the ops whose tensors differ."""
    op = alias.get(call.op, call.op)
    tensors: Any = call.tensors
    if op == C.ALL_GATHER.value:
        tensors = call.tensors[1:]  # (own tensor, *outputs): the output list is every rank's
    elif op == C.ALL_TO_ALL.value:
        tensors = (len(call.tensors), sorted({d for d, _ in call.tensors}))  # sizes pair up across ranks
    elif op in _ASYMMETRIC_A2A:
        tensors = tuple((d, s[1:]) for d, s in call.tensors)  # dim 0 follows the split sizes
    return f"{op}|{call.group}|{call.size}|{tensors}|{call.reduce_op}|{call.root}|{call.extra}"


def digest(text: str) -> int:
    """A stable 64-bit hash (Python's ``hash`` of a string differs between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@final
@dataclass(frozen=True, slots=True)
class Fp:
    """One distinct call of a group, interned: rank-local, shared by every step that makes this call."""

    call: Call
    #: The call's fingerprint text at step -1 (what travels to peers, with the step beside it).
    text: str
    #: Digest of the canonical form: what the rolling hash is made of.
    digest: int


def intern(call: Call, alias: dict[str, str]) -> Fp:
    """The :class:`Fp` of ``call`` (built once per distinct call and group)."""
    return Fp(call, encode(call), digest(canonical(call, alias)))


# ------------------------------------------------------------------------------------------------------ call keys


@final
@dataclass(frozen=True, slots=True)
class Plan:
    """How to fingerprint the calls of one spec, worked out once per spec."""

    spec: S.Spec
    #: True for send/recv: no group-wide step, never recorded.
    p2p: bool
    #: (kernel argument index, holds a list) of each tensor argument the spec's ``fingerprint`` names, in order.
    tensors: tuple[tuple[int, bool], ...]
    #: (index, is a matrix) of each split-size or count argument the fingerprint names.
    extras: tuple[tuple[int, bool], ...]
    reduce_op: int | None
    root: int | None
    #: The call's key: a tuple of objects, built per call without formatting anything.
    key: Callable[[Sequence[Any]], tuple[Any, ...]]


#: id(spec) -> its plan (specs are module constants; the plan keeps its spec, so an id is never reused).
PLANS: Final[dict[int, Plan]] = {}


def plan_of(spec: S.Spec) -> Plan:
    """The (cached) :class:`Plan` of ``spec``."""
    plan = PLANS.get(id(spec))
    if plan is None or plan.spec is not spec:
        plan = PLANS[id(spec)] = _make_plan(spec)
    return plan


def _make_plan(spec: S.Spec) -> Plan:
    tensors: list[tuple[int, bool]] = []
    extras: list[tuple[int, bool]] = []
    for name in spec.fingerprint:
        i = spec.index(name)
        kind = spec.args[i].kind
        if kind is S.Kind.SPLITS or kind is S.Kind.MATRIX:
            extras.append((i, kind is S.Kind.MATRIX))
        else:
            tensors.append((i, kind is not S.Kind.TENSOR))
    redop = spec.reduce_op_index
    root = next((i for i, a in enumerate(spec.args) if a.kind is S.Kind.ROOT), None)
    p2p = spec.key in (C.SEND, C.RECV)
    return Plan(spec, p2p, tuple(tensors), tuple(extras), redop, root,
                _key_function(spec, tuple(tensors), tuple(extras), redop, root))


def _key_function(spec: S.Spec, tensors: tuple[tuple[int, bool], ...], extras: tuple[tuple[int, bool], ...],
                  redop: int | None, root: int | None) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    key_of, variant, fixed = spec.key_of, spec.variant is not None, spec.key
    if not variant and not extras and root is None and redop is not None and tensors == ((0, False),):
        # all_reduce, the hot one: (tensor, op).
        def single(k: Sequence[Any]) -> tuple[Any, ...]:
            t, op = k[0], k[1]
            return (t.dtype, t.shape, op if type(op) is _RED_OP_TYPE else reduce_op_name(op))

        return single

    def general(k: Sequence[Any]) -> tuple[Any, ...]:
        key: list[Any] = [key_of(k) if variant else fixed]
        if redop is not None:
            op = k[redop]
            key.append(op if type(op) is _RED_OP_TYPE else reduce_op_name(op))
        if root is not None:
            key.append(k[root])
        for i, many in tensors:
            v = k[i]
            if many:
                for t in v:
                    key += (t.dtype, t.shape)
            else:
                key += (v.dtype, v.shape)
        for i, matrix in extras:
            v = k[i]
            key.append(None if v is None else tuple(c for row in v for c in row) if matrix else tuple(v))
        return tuple(key)

    return general


def call_of(plan: Plan, group: str, size: int, kargs: Sequence[Any]) -> Call:
    """The :class:`Call` (at step -1) of a call with these kernel arguments (on a key miss only)."""
    tensors: list[torch.Tensor] = []
    for i, many in plan.tensors:
        v = kargs[i]
        tensors += list(v) if many else [v]
    extra: list[int] = []
    for i, matrix in plan.extras:
        v = kargs[i]
        if v is not None:
            extra += [c for row in v for c in row] if matrix else list(v)
    redop = "" if plan.reduce_op is None else reduce_op_name(kargs[plan.reduce_op])
    root = -1 if plan.root is None else int(kargs[plan.root])
    return Call(-1, plan.spec.key_of(kargs).value, group, size,
                tuple((_dtype_name(t.dtype), tuple(t.shape)) for t in tensors), redop, root, tuple(extra))


# ----------------------------------------------------------------------------------------------------- comparison


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def disagreement(calls: Sequence[Call], same_op: dict[str, str] | None = None, size: int | None = None) -> str | None:
    """Why these calls (in group-rank order) cannot be one collective, or None if they can.

    Args:
        calls: the calls; every member's, indexed by group rank, for the rules of the asymmetric ops.
        same_op: op names treated as one (even and uneven ``all_to_all_single`` where the backend runs both
            with the same kernel).
        size: the group size, when ``calls`` may hold only some members' calls (then the rules that need every
            member compare the common part only).
    """
    alias = same_op or {}
    first = calls[0]
    for attr, label in (("group", "group"), ("op", "collective"), ("size", "group size"), ("seq", "step")):
        values = [alias.get(v, v) if attr == "op" else v for v in (getattr(c, attr) for c in calls)]
        if len(set(values)) > 1:
            return f"the ranks called different {label}s" if attr != "seq" else "the ranks are at different steps"
    for attr, label in (("reduce_op", "reduce op"), ("root", "root"), ("extra", "split sizes / counts")):
        if len({getattr(c, attr) for c in calls}) > 1:
            return f"the ranks passed different {label}s"
    complete = len(calls) == (first.size if size is None else size)
    op = alias.get(first.op, first.op)
    if op in (C.ALL_GATHER.value, C.ALL_TO_ALL.value) or op in _ASYMMETRIC_A2A:
        if not complete:
            forms = {canonical(c, alias) for c in calls}
            return None if len(forms) == 1 else "the ranks passed tensors that do not pair up"
        if op == C.ALL_GATHER.value:
            return _all_gather(calls)
        if op == C.ALL_TO_ALL.value:
            return _all_to_all(calls)
        return _all_to_all_single(calls)
    if len({len(c.tensors) for c in calls}) > 1:
        return "the ranks passed different numbers of tensors"
    for i in range(len(first.tensors)):
        seen = {c.tensors[i] for c in calls}
        if len(seen) > 1:
            what = "dtype" if len({t[0] for t in seen}) > 1 else "shape"
            return f"tensor {i} has a different {what} on different ranks ({', '.join(sorted(map(_fmt, seen)))})"
    return None


def _all_to_all_single(calls: Sequence[Call]) -> str | None:
    """(output, input): one dtype, one shape beyond dim 0, and the inputs hold as much as the outputs."""
    dtypes = {d for c in calls for d, _ in c.tensors}
    if len(dtypes) > 1:
        return f"the ranks passed different dtypes ({', '.join(sorted(dtypes))})"
    if len({s[1:] for c in calls for _, s in c.tensors}) > 1:
        return "the tensors' shapes differ beyond dim 0"
    sent = sum(_numel(c.tensors[1][1]) for c in calls)
    got = sum(_numel(c.tensors[0][1]) for c in calls)
    if sent != got:
        return f"the inputs hold {sent} elements in all, the outputs {got}"
    return None


def _all_gather(calls: Sequence[Call]) -> str | None:
    """(tensor, *outputs): every rank's output list is the same, and rank i's tensor matches output i."""
    n = len(calls)
    if {len(c.tensors) for c in calls} != {n + 1}:
        return "the ranks passed output lists of different lengths"
    outs = {c.tensors[1:] for c in calls}
    if len(outs) > 1:
        return "the ranks passed different output lists"
    (out,) = outs
    for i, c in enumerate(calls):
        if c.tensors[0] != out[i]:
            return f"rank {i}'s tensor is {_fmt(c.tensors[0])}, but the output lists expect {_fmt(out[i])}"
    return None


def _all_to_all(calls: Sequence[Call]) -> str | None:
    """(*outputs, *inputs): what rank i sends to rank j has the size that rank j expects from rank i."""
    n = len(calls)
    if {len(c.tensors) for c in calls} != {2 * n}:
        return "the ranks passed lists of different lengths"
    if len({d for c in calls for d, _ in c.tensors}) > 1:
        return "the ranks passed different dtypes"
    for i, ci in enumerate(calls):
        for j, cj in enumerate(calls):
            sent, expected = ci.tensors[n + j][1], cj.tensors[i][1]
            if _numel(sent) != _numel(expected):
                return f"rank {i} sends {_numel(sent)} elements to rank {j}, which expects {_numel(expected)}"
    return None
