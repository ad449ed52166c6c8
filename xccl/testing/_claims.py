"""What a capability table claims, call shape by call shape, and what to write when a claim is wrong.

The kit runs every (dtype, reduce op) a table claims for every op, not a fixed sample: the dtypes an entry lists
(and those it casts), every reduce op, with the level the table resolves for each. Shapes the table refuses are
tried too, as refusals. A claim that fails is reported with the entry field to change (:func:`claim_fix`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import torch

from xccl.plugin._capabilities import ALL_REDUCE_OPS, REAL_DTYPES, CapabilityTable, Collective, Level, Mode, Support

from ._reference import BITWISE

__all__ = ["ALWAYS", "FLOATS", "FUSED", "async_shapes", "claim_problems", "claim_fix", "shapes", "tried_dtypes"]

C = Collective
#: Dtypes every op is tried with, claimed or not (unclaimed ones as refusals).
ALWAYS: Final = (torch.float32, torch.bfloat16, torch.int64)
FLOATS: Final = (torch.float32, torch.bfloat16)
FUSED: Final = frozenset({C.MM_REDUCE_SCATTER, C.ALL_GATHER_MM, C.MM_ALL_REDUCE})
#: Ops that move no data of their own: one dtype says all.
_NO_DATA: Final = frozenset({C.BARRIER})


def tried_dtypes(entry: Support, op: Collective) -> list[torch.dtype]:
    """The dtypes the kit calls ``op`` with: :data:`ALWAYS`, then every dtype the entry claims (natively or through
    ``cast_to``); an entry that accepts any dtype is tried with every real dtype."""
    if op in _NO_DATA:
        return [torch.float32]
    if op in FUSED:
        claimed = [d for d in entry.dtypes or () if d.is_floating_point and d not in FLOATS]
        return [*FLOATS, *sorted(claimed, key=str)[:1]]
    claimed = list(REAL_DTYPES) if entry.dtypes is None else sorted({*entry.dtypes, *entry.cast_to}, key=str)
    return list(dict.fromkeys([*ALWAYS, *claimed]))


def shapes(table: CapabilityTable, op: Collective, world_size: int, mode: Mode = Mode.EAGER
           ) -> list[tuple[torch.dtype, str, Level]]:
    """Every (dtype, reduce op) the kit tries for ``op``, with the level the table promises for it.

    Fused ops take a shape-independent decision (native kernel, else the portable version), so they are
    expected to run unless the entry itself is unsupported.
    """
    entry = table.entry(op, mode)
    if op is C.MM_REDUCE_SCATTER:
        redops = ["sum"]
    elif op.reduces and op not in FUSED:
        redops = list(ALL_REDUCE_OPS)
    else:
        redops = [""]
    out = []
    for dt in tried_dtypes(entry, op):
        for ro in redops:
            level = entry.level if op in FUSED else table.resolve(
                op, mode=mode, dtype=dt, reduce_op=ro or None, world_size=world_size).level
            out.append((dt, ro, level))
    return out


def async_shapes(table: CapabilityTable, op: Collective, world_size: int,
                 tried: Iterable[tuple[torch.dtype, str, Level]]) -> set[tuple[torch.dtype, str]]:
    """The shapes also called with ``async_op=True``: the first of each way the table runs ``op`` (native, each
    emulation, each cast, avg as sum), since the asynchronous path differs by how a call runs, not by dtype."""
    seen: dict[tuple[object, ...], tuple[torch.dtype, str]] = {}
    for dt, ro, level in tried:
        if level is Level.UNSUPPORTED:
            continue
        res = table.resolve(op, dtype=dt, reduce_op=ro or None, world_size=world_size)
        seen.setdefault((res.level, res.via, res.cast, res.avg_via_sum), (dt, ro))
    return set(seen.values())


def claim_problems(op: Collective, mode: Mode, sup: Support) -> list[str]:
    """Claims an entry makes that xccl never runs, because the operation means nothing there: each would pass
    unnoticed (the table refuses the call before the kernel is reached) while telling users it runs."""
    out = []
    for dtype, ops in sup.dtype_reduce_ops.items():
        name = f"torch.{str(dtype).removeprefix('torch.')}"
        meaningless = ops & ({"avg", "premul_sum"} if dtype == torch.bool else
                             BITWISE if dtype.is_floating_point else set())
        if meaningless:
            listed = ", ".join(map(repr, sorted(meaningless)))
            out.append(f"claims {listed} over {name}, which means nothing there (xccl refuses such a call before "
                       f"any kernel runs, so the claim is never tested): remove {listed} from "
                       f"Support.dtype_reduce_ops[{name}]")
    return out


def claim_fix(table: CapabilityTable, op: Collective, mode: Mode, dtype: torch.dtype, redop: str) -> str:
    """What to change when the call of ``op`` over ``dtype`` with ``redop`` failed although the table claims it."""
    sup = table.entry(op, mode)
    name = f"torch.{str(dtype).removeprefix('torch.')}"
    where = f"the {op.value} entry ({mode.value})"
    res = table.resolve(op, mode=mode, dtype=dtype, reduce_op=redop or None)
    if res.level is Level.EMULATED and sup.level is Level.EMULATED:
        return (f"{where} is emulated via {sup.via!r}: check the claims of the ops it is built from for {name}, "
                "or mark the shape unsupported")
    if res.cast is not None:
        return f"{where} casts {name} to {res.cast} (cast_to): the cast target's claim failed; fix it or drop the cast"
    allowed = sup.reduce_ops_for(dtype)
    fix = "Fix the kernel (or the simulation profile, if the hardware does run it), or stop claiming it: "
    if redop and dtype in sup.dtype_reduce_ops and redop in sup.dtype_reduce_ops[dtype]:
        return fix + f"remove {redop!r} from Support.dtype_reduce_ops[{name}] of {where}"
    if redop and res.avg_via_sum:
        return fix + (f"{where} claims 'sum' over {name}, which avg is built from: narrow its reduce ops for "
                      f"{name} with Support.dtype_reduce_ops")
    if redop and allowed is not None and redop in allowed:
        return fix + (f"{where} claims {redop!r} for every dtype it lists (Support.reduce_ops): narrow it for "
                      f"{name} with Support.dtype_reduce_ops={{{name}: ...}}")
    if redop and allowed is None:
        return fix + f"{where} claims every reduce op (reduce_ops=None): list those that run in Support.reduce_ops"
    if sup.dtypes is None:
        return fix + f"{where} claims every dtype (dtypes=None): list those that run in Support.dtypes"
    return fix + (f"remove {name} from Support.dtypes of {where}; if the SDK moves {name} but cannot compute it, "
                  f"let xccl emulate it instead (Support.cast_to={{{name}: <a dtype it computes>}})")
