"""The capability model: what a backend can do, per collective and per mode, as data.

A :class:`CapabilityTable` is built once per plugin from frozen :class:`Support` entries. Dispatch asks it one
question per call shape, :meth:`CapabilityTable.resolve`, and caches the answer; the CLI and the generated docs
render the very same objects, so what ``xccl caps`` prints is what dispatch does.

Reduce ops are named by lower-case strings (``"sum"``, ``"avg"``, ...) and dtypes by ``torch.dtype``; helpers
below normalise ``torch.distributed.ReduceOp`` values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, final

import torch

from ..errors import UnsupportedCollective
from ..ops._emulations import BY_KEY, Block
from ..ops._vocab import (
    ALL_DTYPES,
    ALL_REDUCE_OPS,
    COMPLEX_DTYPES,
    COMPLEX_REDUCE_OPS,
    REAL_DTYPES,
    Collective,
    Level,
    Mode,
    reduce_op_name,
    reduce_op_of,
)
from ._prefer import AGREED_SIZE, Prefer, edges, problems
from ._versions import version_below

__all__ = [
    "AGREED_SIZE",
    "ALL_DTYPES",
    "ALL_REDUCE_OPS",
    "BOOL_REDUCE_AS",
    "EMULATION_BLOCKS",
    "LOCAL_REDUCE_OPS",
    "LOCAL_REDUCTIONS",
    "COMPLEX_DTYPES",
    "COMPLEX_REDUCE_OPS",
    "REAL_DTYPES",
    "CapabilityTable",
    "Collective",
    "Level",
    "Mode",
    "Prefer",
    "Resolution",
    "Support",
    "reduce_op_name",
    "reduce_op_of",
]


@final
@dataclass(frozen=True, slots=True)
class Support:
    """How one backend runs one collective in one mode: ``dtypes`` and ``reduce_ops`` list what the *native* kernel
    accepts, and outside them the op may still run through an emulation (docs/plugin-guide.md, section 6)."""

    #: native, emulated or unsupported.
    level: Level
    #: Dtypes the native kernel accepts; ``None`` means any.
    dtypes: frozenset[torch.dtype] | None = None
    #: Reduce ops the native kernel accepts; ``None`` means any (or not applicable).
    reduce_ops: frozenset[str] | None = None
    #: Name of the emulation used when ``level`` is emulated (e.g. ``"all_to_all+local_reduce"``).
    via: str = ""
    #: World sizes the kernel accepts; ``None`` means any.
    world_sizes: frozenset[int] | None = None
    #: Oldest torch on which this holds: (major, minor) or (major, minor, patch).
    min_torch: tuple[int, ...] | None = None
    #: A sentence for humans: quirks, sources, why.
    note: str = ""
    #: Dtype cast map used to emulate dtypes the kernel lacks (e.g. ``{torch.bool: torch.uint8}``).
    cast_to: Mapping[torch.dtype, torch.dtype] = field(default_factory=dict)
    #: Per-dtype override of ``reduce_ops`` (gloo: AVG only for floats, bitwise ops only for integers).
    dtype_reduce_ops: Mapping[torch.dtype, frozenset[str]] = field(default_factory=dict)
    #: Compositions that measured faster than the native kernel, by call shape (native entries only; the first
    #: that applies is used): see :class:`~xccl.plugin.Prefer`.
    prefer: tuple[Prefer, ...] = ()
    #: Oldest release of the vendor's SDK on which this holds: (SDK name, version), e.g. ``("CANN", "8.6.0")``.
    #: :meth:`CapabilityTable.resolve` refuses the entry below it when told the installed versions
    #: (``Runtime.sdk_versions()``; compared as :func:`~xccl.plugin.version_below` orders versions); an unknown version passes.
    min_sdk: tuple[str, str] | None = None
    #: Dtypes outside ``dtypes`` that run as a composition of ``EMULATIONS`` instead (dtype -> its ``via``): a
    #: reduction over a dtype the backend moves but cannot reduce, e.g. ``{torch.float64: "all_gather"}``.
    dtype_via: Mapping[torch.dtype, str] = field(default_factory=dict)
    #: Reduce ops outside ``reduce_ops`` that run as a composition instead (reduce op -> its ``via``): what the
    #: kernel gets wrong, e.g. torch 2.8's gloo reduce-scatter, which sums whatever op it is given.
    reduce_op_via: Mapping[str, str] = field(default_factory=dict)

    def reduce_ops_for(self, dtype: torch.dtype | None) -> frozenset[str] | None:
        """The reduce ops the native kernel accepts for ``dtype``."""
        if dtype is not None and dtype in self.dtype_reduce_ops:
            return self.dtype_reduce_ops[dtype]
        return self.reduce_ops


UNSUPPORTED: Final = Support(Level.UNSUPPORTED)

#: What each of xccl's emulations calls, by (op, ``via``): (building block, dtype, reduce op), from its record
#: (``xccl.ops._emulations``): an emulation whose block cannot run the call shape is refused before any rank sends.
EMULATION_BLOCKS: Final[Mapping[tuple[Collective, str], tuple[Block, ...]]] = {k: e.blocks for k, e in BY_KEY.items()}
#: Emulations that reduce on the host (``local_reduce``), and the reduce ops a host reduction has.
LOCAL_REDUCTIONS: Final = frozenset(k for k, e in BY_KEY.items() if e.local_reduction)
LOCAL_REDUCE_OPS: Final = frozenset({"sum", "avg", "premul_sum", "product", "min", "max", "band", "bor", "bxor"})
_BITWISE: Final = frozenset({"band", "bor", "bxor"})


#: Dtypes a local reduction can add (torch 2.13 has no ``add`` for uint16/32/64 or the float8 types).
LOCAL_REDUCE_DTYPES: Final = frozenset(REAL_DTYPES) | {torch.int16}


def _local_reduces(redop: str, dtype: torch.dtype | None) -> bool:
    """Whether a host reduction (``torch.bitwise_and`` & co.) can apply ``redop`` to ``dtype``."""
    if redop not in LOCAL_REDUCE_OPS:
        return False
    if dtype is None:
        return True
    if dtype not in LOCAL_REDUCE_DTYPES:
        return False
    if redop in _BITWISE:
        return not dtype.is_floating_point and not dtype.is_complex
    return redop != "premul_sum" or dtype.is_floating_point


#: Logical semantics of reductions over bool, computed on an integer dtype: sum is "or", product is "and".
BOOL_REDUCE_AS: Final = {"sum": "max", "product": "min", "min": "min", "max": "max", "bor": "max", "band": "min"}


@final
@dataclass(frozen=True, slots=True)
class Resolution:
    """The answer for one call shape: the level, and the emulation to use when it is not native."""

    level: Level
    #: Emulation name; empty when native. A cast, avg via sum and premul_sum via sum compose with ``via``.
    via: str = ""
    #: Why, when unsupported or emulated.
    reason: str = ""
    #: Dtype to cast to first, when the dtype is emulated.
    cast: torch.dtype | None = None
    #: True when ``avg`` runs as ``sum`` then a divide.
    avg_via_sum: bool = False
    #: True when ``premul_sum`` runs as a local scale of the inputs by its factor, then ``sum``.
    premul_via_sum: bool = False
    #: True when complex tensors run as views of their real parts (free; the level is the real dtype's).
    complex_view: bool = False
    #: The preference that made a native op run as the composition ``via`` (the level stays the native one's).
    prefer: Prefer | None = None

    @property
    def layered(self) -> bool:
        """Whether layers wrap the kernel: a dtype cast, avg or premul_sum via sum, a complex view."""
        return self.cast is not None or self.avg_via_sum or self.premul_via_sum or self.complex_view

    @property
    def native_entry(self) -> bool:
        """Whether the op's own native kernel carries this call shape (after any layers). A size preference
        (``prefer``) keeps it native: the composition replaces the kernel only at the sizes it names."""
        return self.via == "" or self.prefer is not None


@final
class CapabilityTable:
    """A backend's capabilities: ``{(Collective, Mode): Support}``, queried at run time (docs/capabilities.md)."""

    __slots__ = ("_entries", "backend", "notes")

    def __init__(
        self,
        backend: str,
        entries: Mapping[tuple[Collective, Mode], Support],
        notes: Iterable[str] = (),
    ) -> None:
        missing = [(op.value, m.value) for op in Collective for m in Mode if (op, m) not in entries]
        if missing:
            raise ValueError(f"capability table of {backend!r} lacks entries for {missing}")
        wrong = [p for (op, _), sup in entries.items() if sup.prefer
                 for p in problems(op, sup.level.value, sup.prefer, (v for o, v in EMULATION_BLOCKS if o is op))]
        wrong += [f"{op.value}: {what} -> {via!r} names no emulation of {op.value}"
                  for (op, _), sup in entries.items()
                  for what, via in [*((f"dtype_via {_dtype_name(d)}", v) for d, v in sup.dtype_via.items()),
                                    *((f"reduce_op_via {r}", v) for r, v in sup.reduce_op_via.items())]
                  if (op, via) not in EMULATION_BLOCKS]
        if wrong:
            raise ValueError(f"capability table of {backend!r}: {'; '.join(wrong)}")
        self.backend: Final = backend
        self._entries: Final = dict(entries)
        self.notes: Final = tuple(notes)

    def entry(self, op: Collective | str, mode: Mode | str = Mode.EAGER) -> Support:
        """The raw :class:`Support` for ``op`` in ``mode``."""
        return self._entries[(Collective(op), Mode(mode))]

    def items(self) -> Iterable[tuple[tuple[Collective, Mode], Support]]:
        """Every entry, in enum order."""
        return ((k, self._entries[k]) for k in ((op, m) for op in Collective for m in Mode))

    def resolve(
        self,
        op: Collective | str,
        *,
        mode: Mode | str = Mode.EAGER,
        dtype: torch.dtype | None = None,
        reduce_op: str | None = None,
        world_size: int | None = None,
        nbytes: int | None = None,
        sdk_versions: Mapping[str, str] | None = None,
    ) -> Resolution:
        """Decide how ``op`` runs for this call shape, without raising.

        Complex dtypes resolve as their real dtype (the tensors are viewed as real ones, as torch.distributed
        does), for the reduce ops defined on complex numbers only. ``nbytes`` is the call's agreed size
        (:data:`AGREED_SIZE`); preferences bounded by size apply only when it is given. ``sdk_versions`` are the
        vendor SDK versions installed (SDK name -> version), checked against the entry's ``min_sdk``.
        """
        op = Collective(op)
        mode = Mode(mode)
        if dtype is not None and dtype.is_complex:
            return self._resolve_complex(op, mode, dtype, reduce_op, world_size, nbytes, sdk_versions)
        sup = self._entries[(op, mode)]
        if sup.level is Level.UNSUPPORTED:
            return Resolution(Level.UNSUPPORTED, reason=sup.note or "the backend has no such operation")
        below = _below_sdk(sup, sdk_versions)
        if below is not None:
            return Resolution(Level.UNSUPPORTED, reason=below)
        if sup.world_sizes is not None and world_size is not None and world_size not in sup.world_sizes:
            sizes = ", ".join(map(str, sorted(sup.world_sizes)))
            return _refused(sup, f"world size {world_size} not in {{{sizes}}}")
        # ``via`` names a composition for emulated entries only: a native entry runs its own kernel (a size
        # preference or a dtype_via below names the composition that replaces it), whatever ``via`` it carries.
        via = sup.via if sup.level is Level.EMULATED else ""
        level, reasons, cast, avg, premul = sup.level, [], None, False, False
        if dtype is not None and sup.dtypes is not None and dtype not in sup.dtypes:
            cast = sup.cast_to.get(dtype)
            if cast is None:
                if dtype in sup.dtype_via:
                    return self._by_dtype(op, sup, dtype, reduce_op, world_size, sdk_versions)
                return _refused(sup, f"dtype {_dtype_name(dtype)} is not supported")
            level = Level.EMULATED
            reasons.append(f"{_dtype_name(dtype)} cast to {_dtype_name(cast)}")
        if dtype == torch.bool and reduce_op in ("avg", "premul_sum"):
            return Resolution(Level.UNSUPPORTED, reason=f"reduce op {reduce_op!r} is meaningless over bool")
        allowed = sup.reduce_ops_for(dtype if cast is None else cast)
        if reduce_op is not None and op.reduces and allowed is not None and reduce_op not in allowed:
            if reduce_op in sup.reduce_op_via:
                via = sup.reduce_op_via[reduce_op]
                blocked = self._blocked(op, via, cast or dtype, reduce_op, world_size, sdk_versions)
                if blocked is not None:
                    return _refused(sup, blocked)
                return Resolution(Level.EMULATED, via=via, cast=cast, reason="; ".join(
                    [*reasons, f"reduce op {reduce_op!r} via {via}: the kernel does not reduce with it ({sup.note})"]))
            if reduce_op == "avg" and "sum" in allowed:
                level, avg = Level.EMULATED, True
                reasons.append("avg as sum then divide")
            elif reduce_op == "premul_sum" and "sum" in allowed and _premul_emulates(mode, dtype):
                level, premul = Level.EMULATED, True
                reasons.append("premul_sum as a local scale by its factor, then sum")
            else:
                ops = ", ".join(sorted(allowed))
                return _refused(sup, f"reduce op {reduce_op!r} is not supported (has: {ops})")
        inner_redop = "sum" if avg or premul else reduce_op
        if cast is not None and dtype == torch.bool and inner_redop is not None:
            inner_redop = BOOL_REDUCE_AS.get(inner_redop, inner_redop)
        if sup.level is Level.EMULATED:
            # The table resolves one op at a time: reduce_scatter via all_reduce claims every reduce op, but runs
            # only those the backend's all_reduce has. Ask the building blocks, as the emulation will call them.
            blocked = self._blocked(op, via, cast or dtype, inner_redop, world_size, sdk_versions)
            if blocked is not None:
                return Resolution(Level.UNSUPPORTED, reason=blocked)
        res = Resolution(level, via=via, reason="; ".join(reasons) or sup.note, cast=cast, avg_via_sum=avg,
                         premul_via_sum=premul)
        for p in sup.prefer:  # the first that applies and whose building blocks can run this call shape
            if p.applies(nbytes, world_size) and not self._blocked(op, p.via, cast or dtype, inner_redop, world_size,
                                                                   sdk_versions):
                why = f"{res.reason}; {p.describe()}" if level is Level.EMULATED else p.describe()
                return replace(res, via=p.via, prefer=p, reason=why)
        return res

    def _by_dtype(
        self, op: Collective, sup: Support, dtype: torch.dtype, reduce_op: str | None, world_size: int | None,
        sdk_versions: Mapping[str, str] | None,
    ) -> Resolution:
        """A dtype the backend moves but cannot reduce, run as the composition ``sup.dtype_via`` names for it."""
        via = sup.dtype_via[dtype]
        blocked = self._blocked(op, via, dtype, reduce_op, world_size, sdk_versions)
        if blocked is not None:
            return _refused(sup, blocked)
        return Resolution(Level.EMULATED, via=via, reason=f"{_dtype_name(dtype)} is moved but not reduced by the "
                          f"backend: reduced exactly, via {via} and a local reduction in rank order")

    def size_bounds(self, op: Collective | str, *, mode: Mode | str = Mode.EAGER,
                    world_size: int | None = None) -> tuple[int, ...]:
        """The agreed sizes at which the choice for ``op`` on ``world_size`` ranks changes (the edges of its
        preferences' size ranges, in bytes, sorted); empty when it is the same at every size."""
        return edges(self.entry(op, mode).prefer, world_size)

    def _blocked(
        self, op: Collective, via: str, dtype: torch.dtype | None, redop: str | None, world_size: int | None,
        sdk_versions: Mapping[str, str] | None = None,
    ) -> str | None:
        """Why the emulation ``via`` of ``op`` cannot run this call shape (a building block cannot), or None.

        Blocks run in eager mode whatever the mode of the call (a graph's emulated op runs eager dispatch).
        """
        if (op, via) in LOCAL_REDUCTIONS and redop is not None and not _local_reduces(redop, dtype):
            # Found out only after the exchange otherwise: refuse it before anything is sent.
            what = "" if dtype is None else f" over {_dtype_name(dtype)}"
            return (f"emulated via {via}, whose local reduction has no {redop!r}{what} (it has "
                    f"{', '.join(sorted(LOCAL_REDUCE_OPS))}; bitwise ops over integers, premul_sum over floats)")
        for block, block_dtype, block_redop in EMULATION_BLOCKS.get((op, via), ()):
            d, r = block_dtype or dtype, redop if block_redop == "=" else block_redop
            sub = self.resolve(block, dtype=d, reduce_op=r, world_size=world_size, sdk_versions=sdk_versions)
            if sub.level is Level.UNSUPPORTED:
                return f"emulated via {via}, which needs {block.value}, and there {sub.reason}"
        return None

    def _resolve_complex(
        self, op: Collective, mode: Mode, dtype: torch.dtype, reduce_op: str | None, world_size: int | None,
        nbytes: int | None, sdk_versions: Mapping[str, str] | None,
    ) -> Resolution:
        if op.reduces and reduce_op is not None and reduce_op not in COMPLEX_REDUCE_OPS:
            return Resolution(Level.UNSUPPORTED, reason=f"reduce op {reduce_op!r} is not defined for complex numbers "
                              f"(they have {', '.join(sorted(COMPLEX_REDUCE_OPS))})")
        res = self.resolve(op, mode=mode, dtype=dtype.to_real(), reduce_op=reduce_op, world_size=world_size,
                           nbytes=nbytes, sdk_versions=sdk_versions)
        if res.level is Level.UNSUPPORTED:
            return res
        why = f"{_dtype_name(dtype)} viewed as {_dtype_name(dtype.to_real())}"
        return replace(res, complex_view=True, reason=f"{why}; {res.reason}" if res.reason else why)

    def level(self, op: Collective | str, **shape: object) -> Level:
        """The :class:`Level` for ``op`` and this call shape (see :meth:`resolve`)."""
        return self.resolve(op, **shape).level  # type: ignore[arg-type]

    def supports(self, op: Collective | str, **shape: object) -> bool:
        """Whether ``op`` runs at all (natively or emulated) for this call shape."""
        return self.level(op, **shape) is not Level.UNSUPPORTED

    def require(self, op: Collective | str, *, allow_emulated: bool = True, **shape: object) -> Resolution:
        """Like :meth:`resolve`, but raise :class:`UnsupportedCollective` when the op cannot run.

        Args:
            op: the collective.
            allow_emulated: when False, an emulated op is refused too (the ``fallback="error"`` policy).
            **shape: ``mode``, ``dtype``, ``reduce_op``, ``world_size``, ``nbytes``, ``sdk_versions`` as in
                :meth:`resolve`.

        Raises:
            UnsupportedCollective: the op is unsupported, or emulated and ``allow_emulated`` is False.
        """
        res = self.resolve(op, **shape)  # type: ignore[arg-type]
        refused = self.refusal(op, res, allow_emulated=allow_emulated)
        if refused is not None:
            raise refused
        return res

    def refusal(self, op: Collective | str, res: Resolution, *, allow_emulated: bool = True
                ) -> UnsupportedCollective | None:
        """The error for a resolution that cannot run (unsupported, or emulated and ``allow_emulated`` is False),
        or None: the one place :meth:`require` and xccl's planner word a refusal."""
        if res.level is Level.UNSUPPORTED:
            return UnsupportedCollective(str(Collective(op)), self.backend, res.reason)
        if res.level is Level.EMULATED and not allow_emulated:
            return UnsupportedCollective(
                str(Collective(op)),
                self.backend,
                f"only emulated ({res.via or res.reason}) and the fallback policy is 'error'; "
                "pass fallback='warn' or 'emulate' to xccl.init to allow emulation",
            )
        return None

    def resolve_sized(
        self, op: Collective | str, *, mode: Mode | str = Mode.EAGER, dtype: torch.dtype | None = None,
        reduce_op: str | None = None, world_size: int | None = None, sdk_versions: Mapping[str, str] | None = None,
    ) -> tuple[Resolution, tuple[int, ...], tuple[Resolution, ...]]:
        """:meth:`resolve` for a call shape at every size at once (what xccl's planner asks, once per call shape):
        the answer at no particular size, the agreed sizes at which it changes (:meth:`size_bounds`) and the answer
        in each range they cut (``[0, b0)``, ... ``[bn, inf)``; empty when the choice never changes with size)."""
        shape = {"mode": mode, "dtype": dtype, "reduce_op": reduce_op, "world_size": world_size,
                 "sdk_versions": sdk_versions}
        res = self.resolve(op, **shape)  # type: ignore[arg-type]
        bounds = () if res.level is Level.UNSUPPORTED else self.size_bounds(op, mode=mode, world_size=world_size)
        if not bounds:
            return res, (), ()
        return res, bounds, tuple(self.resolve(op, nbytes=lo, **shape) for lo in (0, *bounds))  # type: ignore[arg-type]

    def with_entries(self, changes: Mapping[tuple[Collective, Mode], Support]) -> CapabilityTable:
        """A copy with some entries replaced: how a runtime refines its plugin's table with what it found at run
        time (``Runtime.capabilities``), e.g. an API one release of the vendor's SDK has and another lacks."""
        return CapabilityTable(self.backend, {**self._entries, **changes}, self.notes)

    def to_dict(self) -> dict[str, object]:
        """The table as plain JSON-able data (for ``xccl caps --json`` and the docs)."""
        out: dict[str, object] = {}
        for (op, mode), sup in self.items():
            out.setdefault(op.value, {})[mode.value] = {  # type: ignore[index]
                "level": sup.level.value,
                "via": sup.via,
                "dtypes": None if sup.dtypes is None else sorted(_dtype_name(d) for d in sup.dtypes),
                "reduce_ops": None if sup.reduce_ops is None else sorted(sup.reduce_ops),
                "world_sizes": None if sup.world_sizes is None else sorted(sup.world_sizes),
                "min_torch": None if sup.min_torch is None else ".".join(map(str, sup.min_torch)),
                "min_sdk": None if sup.min_sdk is None else " ".join(sup.min_sdk),
                "cast_to": {_dtype_name(k): _dtype_name(v) for k, v in sup.cast_to.items()},
                "dtype_reduce_ops": {_dtype_name(k): sorted(v) for k, v in sup.dtype_reduce_ops.items()},
                "dtype_via": {_dtype_name(k): v for k, v in sup.dtype_via.items()},
                "reduce_op_via": dict(sup.reduce_op_via),
                "note": sup.note,
                "prefer": [p.to_dict() for p in sup.prefer],
            }
        return out

    def __repr__(self) -> str:
        return f"<CapabilityTable {self.backend}>"


def _below_sdk(sup: Support, installed: Mapping[str, str] | None) -> str | None:
    """Why ``sup`` does not hold with the ``installed`` SDK versions (below its ``min_sdk``), or None."""
    if sup.min_sdk is None or not installed:
        return None
    name, floor = sup.min_sdk
    have = installed.get(name)
    if have is None or not version_below(have, floor):
        return None
    return f"needs {name} >= {floor}, and {name} {have} is installed"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _refused(sup: Support, reason: str) -> Resolution:
    """Unsupported for ``reason``, with the entry's note: the table's own hint (what to do instead, and why)."""
    return Resolution(Level.UNSUPPORTED, reason=f"{reason} (the table's note: {sup.note})" if sup.note else reason)


def _premul_emulates(mode: Mode, dtype: torch.dtype | None) -> bool:
    """Whether a missing premul_sum runs as a local scale then sum: over floats (premul_sum's domain, as in NCCL),
    in eager mode (a graph's functional collectives take a reduce op's name, which cannot carry the factor)."""
    return mode is Mode.EAGER and (dtype is None or dtype.is_floating_point)


def table_from(
    backend: str,
    eager: Mapping[Collective, Support],
    graph: Mapping[Collective, Support] | None = None,
    *,
    default: Support = UNSUPPORTED,
    notes: Iterable[str] = (),
) -> CapabilityTable:
    """Build a table from per-mode mappings; ops left out get ``default``.

    Args:
        backend: the plugin name shown in errors.
        eager: eager-mode entries.
        graph: graph-mode entries; ``None`` means "graph mode unsupported for every op".
        default: the entry used for ops a mapping omits.
        notes: table-wide remarks rendered under the table.
    """
    graph = graph or {}
    entries = {(op, mode): eager.get(op, default) if mode is Mode.EAGER else graph.get(op, UNSUPPORTED)
               for op in Collective for mode in (Mode.EAGER, Mode.GRAPH)}
    return CapabilityTable(backend, entries, notes)
