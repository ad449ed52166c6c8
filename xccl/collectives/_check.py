"""The collective-mismatch detector: ``xccl.init(check=True)`` or ``XCCL_CHECK=1``.

Before each collective, every rank of the group publishes a *fingerprint* of its call and reads everyone else's;
any difference raises :class:`~xccl.CollectiveMismatch` on every rank, naming what each rank called, before any
rank communicates. A mismatch that would otherwise hang until the timeout, or silently mix data of different
shapes, becomes an immediate error, and the group stays usable.

The side channel is the rendezvous store (the c10d ``TCPStore`` every rank already reaches), through a private
clone of the client so that its timeout can be short without touching the store the process groups use::

    set     xccl/chk/<group>/<seq>/<group rank>  = fingerprint     one way (TCPStore does not answer a set)
    get     the same key of every other member (waits)             one round trip
    delete  this rank's key of <seq - 1> (everyone has read it)    one round trip

A fingerprint is fixed-format ASCII, ``x1;seq;op;group;size;tensors;reduce op;root;counts``, parsed field by field
with a size cap: nothing from a peer is ever unpickled or evaluated. The sequence number is ``GroupContext.seq``,
the group's own clock, so a skipped or extra collective shows up as a different call at the same step.

A call on the wrong *group* cannot be seen by comparing one group's keys: the two sides wait in different groups.
So a wait that lasts more than a second looks for the silent peers' keys in the other groups this rank shares
with them, at this rank's own step of those groups. A peer found waiting there is waiting for *this* rank (a
deadlock in call order); this rank then posts its own fingerprint into that group's step as well, so that the
ranks waiting there see the mismatch too, and raises. Every wait is bounded by the group timeout: a peer that
never arrives (hung, dead, or in a group this rank is not in) gives :class:`~xccl.CollectiveTimeout` naming it.

Cost: one one-way send and two store round trips per collective, measured against a 1-element gloo all_reduce
by ``benchmarks/check_overhead.py`` (figures in ``docs/performance.md``). It is a debugging aid, off
by default.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch
import torch.distributed as dist

from ..errors import CollectiveMismatch, CollectiveTimeout, PeerFailure, XcclError
from ..plugin._capabilities import Collective, Level, reduce_op_name
from . import _specs as S
from ._faults import classify
from ._state import STATE

__all__ = ["Call", "disagreement", "verify"]

LOG = logging.getLogger("xccl")
C = Collective

_VERSION: Final = "x1"
_NFIELDS: Final = 9
#: Largest fingerprint accepted from a peer (a list collective over 1024 ranks of 8-d tensors fits).
_MAX_BYTES: Final = 1 << 18
#: Seconds of the first, blocking wait before the detector starts looking for peers waiting in other groups.
FIRST_WAIT: Final = 1.0
_PREFIX: Final = "xccl/chk/"
#: Ops whose tensors legitimately differ between ranks; compared by the rules in :func:`disagreement`.
_ASYMMETRIC: Final = frozenset({C.ALL_GATHER, C.ALL_TO_ALL, C.ALL_TO_ALL_SINGLE, C.ALL_TO_ALL_SINGLE_UNEVEN})
_DTYPE_NAMES: Final[dict[torch.dtype, str]] = {}
_TOKENS: Final[dict[tuple[torch.dtype, torch.Size], str]] = {}


# ---------------------------------------------------------------------------------------------------- fingerprint


@final
@dataclass(frozen=True, slots=True)
class Call:
    """One rank's collective call, as its fingerprint describes it."""

    #: The group's sequence number of the call.
    seq: int
    #: The collective (``Collective`` value).
    op: str
    #: Name of the group the call was made on.
    group: str
    #: Size of that group.
    size: int
    #: (dtype name, shape) of each tensor argument, in the order dispatch passes them.
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    #: Reduce op name, or ``""``.
    reduce_op: str
    #: Root (global rank), or -1.
    root: int
    #: Split sizes or counts, when the op takes them.
    extra: tuple[int, ...]

    @classmethod
    def decode(cls, raw: bytes) -> Call:
        """Parse a fingerprint.

        Raises:
            ValueError: not a fingerprint of this format (another xccl version, or garbage).
        """
        if len(raw) > _MAX_BYTES:
            raise ValueError(f"{len(raw)} bytes, more than {_MAX_BYTES}")
        fields = raw.decode("ascii").split(";")
        if len(fields) != _NFIELDS or fields[0] != _VERSION:
            raise ValueError(f"not an {_VERSION} fingerprint: {raw[:80]!r}")
        _, seq, op, group, size, tensors, redop, root, extra = fields
        return cls(
            int(seq), op, group, int(size), tuple(_parse_tensor(t) for t in tensors.split(" ") if t),
            redop, int(root), tuple(int(x) for x in extra.split(",") if x),
        )

    def describe(self) -> str:
        """``all_reduce(float32[4], op=sum) #5 on group '0'``."""
        args = [f"{d}[{','.join(map(str, s))}]" for d, s in self.tensors]
        if self.reduce_op:
            args.append(f"op={self.reduce_op}")
        if self.root >= 0:
            args.append(f"root={self.root}")
        if self.extra:
            args.append(f"counts={list(self.extra)}")
        return f"{self.op}({', '.join(args)}) #{self.seq} on group {self.group!r}"


def _parse_tensor(text: str) -> tuple[str, tuple[int, ...]]:
    dtype, sep, dims = text.partition(":")
    if not sep or not dtype.isidentifier():
        raise ValueError(f"bad tensor field {text!r}")
    return dtype, tuple(int(d) for d in dims.split("x") if d)


def _token(t: torch.Tensor) -> str:
    """``float32:4x3``: one tensor's part of a fingerprint (cached: a training loop repeats a few shapes)."""
    key = (t.dtype, t.shape)
    token = _TOKENS.get(key)
    if token is None:
        if len(_TOKENS) > 4096:
            _TOKENS.clear()
        token = _TOKENS[key] = f"{_dtype_name(t.dtype)}:{'x'.join(map(str, t.shape))}"
    return token


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def encode(
    seq: int,
    op: Collective,
    group: str,
    size: int,
    tensors: Sequence[torch.Tensor],
    reduce_op: Any,
    root: int | None,
    extra: Sequence[int],
) -> bytes:
    """The fingerprint of a call (the inverse of :meth:`Call.decode`)."""
    ts = " ".join([_token(t) for t in tensors])
    redop = "" if reduce_op is None else reduce_op_name(reduce_op)
    counts = ",".join(map(str, extra))
    # ';' separates fields: a group name holding one (torch's names never do) must not shift them.
    name = group.replace(";", "_")
    return f"{_VERSION};{seq};{op.value};{name};{size};{ts};{redop};{-1 if root is None else root};{counts}".encode()


# ----------------------------------------------------------------------------------------------------- comparison


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fmt(t: tuple[str, tuple[int, ...]]) -> str:
    return f"{t[0]}[{','.join(map(str, t[1]))}]"


def disagreement(calls: Sequence[Call], same_op: dict[str, str] | None = None) -> str | None:
    """Why these calls (one per group rank, in group-rank order) cannot be one collective, or None if they can.

    Args:
        calls: the calls, indexed by group rank.
        same_op: op names treated as one (even and uneven ``all_to_all_single`` where the backend runs both
            with the same kernel).
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
    dtypes = {d for c in calls for d, _ in c.tensors}
    op = alias.get(first.op, first.op)
    if op == C.ALL_GATHER.value:
        return _all_gather(calls)
    if op == C.ALL_TO_ALL.value:
        return _all_to_all(calls)
    if op in (C.ALL_TO_ALL_SINGLE.value, C.ALL_TO_ALL_SINGLE_UNEVEN.value):
        if len(dtypes) > 1:
            return f"the ranks passed different dtypes ({', '.join(sorted(dtypes))})"
        if len({s[1:] for c in calls for _, s in c.tensors}) > 1:
            return "the tensors' shapes differ beyond dim 0"
        sent = sum(_numel(c.tensors[1][1]) for c in calls)
        got = sum(_numel(c.tensors[0][1]) for c in calls)
        if sent != got:
            return f"the inputs hold {sent} elements in all, the outputs {got}"
        return None
    if len({len(c.tensors) for c in calls}) > 1:
        return "the ranks passed different numbers of tensors"
    for i in range(len(first.tensors)):
        seen = {c.tensors[i] for c in calls}
        if len(seen) > 1:
            what = "dtype" if len({t[0] for t in seen}) > 1 else "shape"
            return f"tensor {i} has a different {what} on different ranks ({', '.join(sorted(map(_fmt, seen)))})"
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


# --------------------------------------------------------------------------------------------------- the channel


@final
class _Channel:
    """This process's client of the rendezvous store, with a short wait timeout of its own."""

    __slots__ = ("sliced", "store", "world")

    def __init__(self, world: Any) -> None:
        self.world = world
        default = dist.distributed_c10d._get_default_store()
        try:
            # A clone is a second connection with its own timeout; the process groups' store keeps theirs.
            self.store: Any = default.clone()  # type: ignore[attr-defined]  # PrefixStore/TCPStore have it
            self.store.set_timeout(_dt.timedelta(seconds=FIRST_WAIT))
            self.sliced = True
        except (AttributeError, RuntimeError):  # a store that cannot clone (FileStore): wait on its own timeout
            self.store = default
            self.sliced = False
        # Where this rank lives, so that a peer on the same host can tell a dead rank from a slow one.
        if world is not None:
            self.store.set(f"{_PREFIX}pid/{world.rank}", f"{socket.gethostname()}|{os.getpid()}")


def _channel() -> _Channel:
    chan = STATE.channel
    if chan is None or chan.world is not STATE.world:
        chan = STATE.channel = _Channel(STATE.world)
    return chan  # type: ignore[no-any-return]


def _key(group: str, seq: int, rank: int) -> str:
    return f"{_PREFIX}{group}/{seq}/{rank}"


# ----------------------------------------------------------------------------------------------------- verifying


def fingerprint_of(spec: S.Spec, kargs: Sequence[Any]) -> tuple[Collective, tuple[torch.Tensor, ...], Any, Any,
                                                                   tuple[int, ...]]:
    """What the detector compares of a call: its capability key, the reduce op and root (group rank), and the
    arguments the spec's ``fingerprint`` names, in its order (the comparison rules depend on it): their tensors,
    and their split sizes or counts (those that are the same on every rank)."""
    tensors: list[torch.Tensor] = []
    extra: list[int] = []
    for name in spec.fingerprint:
        value = kargs[spec.index(name)]
        kind = spec.args[spec.index(name)].kind
        if kind is S.Kind.SPLITS:
            extra += value or []
        elif kind is S.Kind.MATRIX:
            extra += [c for row in value for c in row]
        else:
            tensors += [value] if isinstance(value, torch.Tensor) else list(value)
    reduce_op = root = None
    for arg, value in zip(spec.args, kargs, strict=False):
        if arg.kind is S.Kind.REDUCE_OP:
            reduce_op = value
        elif arg.kind is S.Kind.ROOT:
            root = value
    return spec.key_of(kargs), tuple(tensors), reduce_op, root, tuple(extra)


def verify(st: Any, spec: S.Spec, kargs: Sequence[Any]) -> None:
    """Check a call against the other members' (called by dispatch before the kernel); see :func:`check`."""
    op, tensors, reduce_op, root, extra = fingerprint_of(spec, kargs)
    check(st, op, tensors, reduce_op, root, extra)


def check(
    ctx: Any,
    op: Collective,
    tensors: tuple[torch.Tensor, ...],
    reduce_op: Any = None,
    root: int | None = None,
    extra: tuple[int, ...] = (),
) -> None:
    """Compare this call with every other member's call of the same step; called by dispatch before the kernel.

    Raises:
        CollectiveMismatch: the members' calls differ (raised on every member).
        CollectiveTimeout: some member did not reach this step within the group timeout.
        PeerFailure: the store is unreachable (rank 0, which hosts it, died).
    """
    seq = ctx.seq
    ctx.seq = seq + 1
    if ctx.size == 1:
        return
    started = time.monotonic()
    mine = encode(seq, op, ctx.name, ctx.size, tensors, reduce_op, root, extra)
    chan = _channel()
    base = f"{_PREFIX}{ctx.name}/{seq}/"
    peers = [r for r in range(ctx.size) if r != ctx.rank]
    keys = [f"{base}{r}" for r in peers]
    try:
        chan.store.set(f"{base}{ctx.rank}", mine)
        values = _wait(chan, ctx, op, seq, mine, peers, keys, started)
        if seq:
            chan.store.delete_key(f"{_PREFIX}{ctx.name}/{seq - 1}/{ctx.rank}")
    except XcclError:
        raise
    except RuntimeError as exc:
        raise _store_fault(exc, ctx, op, started) from exc
    if op not in _ASYMMETRIC and all(v == mine for v in values):
        return
    _compare(ctx, op, mine, dict(zip(peers, values, strict=True)))


def _wait(
    chan: _Channel, ctx: Any, op: Collective, seq: int, mine: bytes, peers: list[int], keys: list[str], started: float
) -> list[bytes]:
    """Every peer's fingerprint: a blocking wait, then slices between which the detector looks for deadlocks."""
    try:
        return list(chan.store.multi_get(keys))
    except RuntimeError as exc:
        if not _wait_timed_out(exc) or not chan.sliced:
            raise
    world = STATE.world
    deadline = started + (world.timeout.total_seconds() if world is not None else 300.0)
    step = FIRST_WAIT
    seen: set[int] = set()
    try:
        while True:
            present = [chan.store.check([k]) for k in keys]
            seen.update(q for q, here in zip(peers, present, strict=True) if here)
            silent = [q for q, here in zip(peers, present, strict=True) if not here]
            if not silent:
                return list(chan.store.multi_get(keys))
            _look_for_dead(chan, ctx, op, seq, silent, started)
            _look_for_deadlock(chan, ctx, mine, silent)
            left = deadline - time.monotonic()
            if left <= 0:
                # Undo this step, so that the clocks realign if the caller recovers and the silent ranks never
                # made this call. The key goes: a peer that re-posts at this step must not read a stale call.
                chan.store.delete_key(f"{_PREFIX}{ctx.name}/{seq}/{ctx.rank}")
                ctx.seq = seq
                # Peers seen earlier whose key is gone gave up too (their timeout came first): not silent.
                raise _silent(ctx, op, seq, [q for q in silent if q not in seen] or silent, started)
            step = min(step * 2, 8.0, left)
            chan.store.set_timeout(_dt.timedelta(seconds=step))
            try:
                return list(chan.store.multi_get(keys))
            except RuntimeError as exc:
                if not _wait_timed_out(exc):
                    raise
    finally:
        chan.store.set_timeout(_dt.timedelta(seconds=FIRST_WAIT))


def _wait_timed_out(exc: RuntimeError) -> bool:
    return isinstance(exc, dist.DistStoreError) and "timeout" in str(exc).lower()


def _look_for_dead(chan: _Channel, ctx: Any, op: Collective, seq: int, silent: list[int], started: float) -> None:
    """Raise PeerFailure if a silent peer runs on this host and its process is gone.

    The store cannot tell a dead rank from a slow one; the kernel can, for ranks on the same host (the usual
    single-node job). Ranks on other hosts are left to the timeout.
    """
    host = socket.gethostname()
    for q in silent:
        peer = ctx.ranks[q]
        key = f"{_PREFIX}pid/{peer}"
        if not chan.store.check([key]):
            continue
        where, _, pid = chan.store.get(key).decode("ascii", "replace").partition("|")
        if where == host and pid.isdigit() and not _alive(int(pid)):
            raise PeerFailure(
                f"rank {peer} (pid {pid} on this host) is dead: it exited while this rank waited for it at step "
                f"#{seq} of the group. Its own log says why; the group cannot be used any more",
                rank=ctx.ranks[ctx.rank], op=op.value, group=ctx.name, elapsed=time.monotonic() - started,
            )


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel directly
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _look_for_deadlock(chan: _Channel, ctx: Any, mine: bytes, silent: list[int]) -> None:
    """Raise CollectiveMismatch if a silent peer waits for this rank in another group (a call-order mismatch)."""
    me = Call.decode(mine)
    for q in silent:
        peer = ctx.ranks[q]
        for other in list(STATE.groups.values()):
            if other is ctx or other.size == 1 or peer not in other.ranks:
                continue
            key = _key(other.name, other.seq, other.ranks.index(peer))
            if not chan.store.check([key]):
                continue
            theirs = _decode_or_none(chan.store.get(key))
            # The peer is at this rank's next step of `other`: it waits there for this rank, which waits here for
            # it. Post this call into that step too, so that every member waiting there raises as well.
            chan.store.set(_key(other.name, other.seq, other.rank), mine)
            other.seq += 1
            calls = {ctx.ranks[ctx.rank]: me.describe(), peer: theirs.describe() if theirs else "an unreadable call"}
            raise CollectiveMismatch(
                f"rank {ctx.ranks[ctx.rank]} waits in group {ctx.name!r} for rank {peer}, which waits in group "
                f"{other.name!r} for it: the ranks issue collectives on different groups, or in a different order. "
                + _ADVICE,
                group=ctx.name,
                calls=calls,
            )


_ADVICE: Final = (
    "Every rank of a group must issue the same collectives in the same order, with the same shapes, dtypes, "
    "reduce op and root; look for a rank-dependent branch around these calls"
)


def _decode_or_none(raw: bytes) -> Call | None:
    try:
        return Call.decode(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _compare(ctx: Any, op: Collective, mine: bytes, theirs: dict[int, bytes]) -> None:
    raw = {ctx.rank: mine, **theirs}
    calls: list[Call | None] = [_decode_or_none(raw[r]) for r in range(ctx.size)]
    names = {ctx.ranks[r]: c.describe() if c else f"an unreadable fingerprint {raw[r][:60]!r}" for r, c in enumerate(calls)}
    unreadable = [ctx.ranks[r] for r, c in enumerate(calls) if c is None]
    if unreadable:
        raise CollectiveMismatch(
            f"ranks {unreadable} sent fingerprints this xccl cannot read: run the same xccl version on every rank",
            group=ctx.name,
            calls=names,
        )
    known = [c for c in calls if c is not None]
    _follow_foreign(ctx, mine, known)
    reason = disagreement(known, _aliases(ctx))
    if reason is not None:
        raise CollectiveMismatch(f"{reason}. {_ADVICE}", group=ctx.name, calls=names)


def _follow_foreign(ctx: Any, mine: bytes, calls: list[Call]) -> None:
    """A peer that posted a call of another group here is waiting there; if this rank is due there, post there too."""
    by_name: dict[str, Any] = {str(c.name): c for c in STATE.groups.values()}
    for call in calls:
        other = by_name.get(call.group)
        if call.group != ctx.name and other is not None and other.seq == call.seq:
            _channel().store.set(_key(other.name, other.seq, other.rank), mine)
            other.seq += 1


def _aliases(ctx: Any) -> dict[str, str]:
    """Even and uneven all_to_all_single are one call where the backend runs both natively (one kernel)."""
    even, uneven = C.ALL_TO_ALL_SINGLE, C.ALL_TO_ALL_SINGLE_UNEVEN
    if ctx.table.entry(even).level is Level.NATIVE and ctx.table.entry(uneven).level is Level.NATIVE:
        return {uneven.value: even.value}
    return {}


def _silent(ctx: Any, op: Collective, seq: int, silent: list[int], started: float) -> CollectiveTimeout:
    ranks = [ctx.ranks[q] for q in silent]
    return CollectiveTimeout(
        f"ranks {ranks} did not reach step #{seq} of this group (the mismatch detector waited for their "
        "fingerprints): they are hung, slow, dead, or busy in a collective of a group this rank is not in. "
        "Look at their logs and stacks (py-spy dump --pid ...)",
        rank=ctx.ranks[ctx.rank],
        op=op.value,
        group=ctx.name,
        elapsed=time.monotonic() - started,
    )


def _store_fault(exc: RuntimeError, ctx: Any, op: Collective, started: float) -> XcclError:
    """A store error during the check: the store (hosted by rank 0) is gone, or it timed out."""
    kind = classify(str(exc))
    where: dict[str, Any] = {
        "rank": ctx.ranks[ctx.rank], "op": op.value, "group": ctx.name, "elapsed": time.monotonic() - started,
    }
    if kind is CollectiveTimeout:
        return CollectiveTimeout(f"the mismatch detector's store did not answer ({exc})", **where)
    return PeerFailure(
        f"the mismatch detector lost the rendezvous store ({str(exc).splitlines()[0] if str(exc) else exc!r}); "
        "it is hosted by rank 0 (MASTER_ADDR), which probably died: look at its log",
        **where,
    )
