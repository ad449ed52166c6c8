"""The planner: how one call shape runs, decided once, from one question to the capability table.

Every entry point plans here: eager dispatch (``xccl.<op>`` and the c10d process group under torch.distributed,
FSDP2 and DDP), the graph forms at trace time and the fused ops. :func:`plan_call` asks the group's table one
question (:meth:`~xccl.plugin.CapabilityTable.resolve_sized`) and applies the fallback policy to the answer:

* unsupported, or emulated under ``fallback="error"``: the typed error (:class:`~xccl.UnsupportedCollective`),
  raised before any rank communicates;
* otherwise a :class:`Plan`. One rule tells what carries the call: the resolution's ``via`` names the composition
  (an emulated entry's, a dtype the backend moves but cannot reduce, a size preference), and an empty ``via``
  means the op's own native kernel, wrapped in the resolution's layers (a cast, avg or premul_sum via sum, a
  complex view).

A native kernel from the plugin may still refuse a call its documented constraints exclude
(:class:`~xccl.ConstraintViolation`, raised before communicating, as the plugin contract requires). What happens
then is decided here too, by :func:`guarded`, for collectives and fused ops alike: ``"error"`` re-raises it,
``"warn"`` warns once per op, plugin and constraint (:class:`~xccl.ConstraintFallbackWarning`) and runs the
fallback, ``"emulate"`` runs the fallback silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, final

import torch

from ..errors import ConstraintFallbackWarning, ConstraintViolation, EmulationWarning
from ..ops._warn import warn_at_user
from ..plugin._capabilities import CapabilityTable, Collective, Level, Mode, Resolution
from ._state import GROUPS, GroupState

__all__ = ["Plan", "guarded", "plan_call", "warn_once"]

LOG = logging.getLogger("xccl")
Kernel = Callable[..., Any]


@final
@dataclass(frozen=True, slots=True)
class Plan:
    """How one call shape (op, mode, dtype, reduce op, world size) runs on a group: the planner's answer."""

    op: Collective
    #: The table's answer at no particular size: level, composition (``via``), layers, why.
    resolution: Resolution
    #: Agreed sizes (bytes) at which the choice changes (the entry's size preferences), sorted; empty: never.
    bounds: tuple[int, ...] = ()
    #: The answer in each range ``bounds`` cuts (``[0, b0)``, ... ``[bn, inf)``); empty when ``bounds`` is.
    by_size: tuple[Resolution, ...] = ()

    @property
    def level(self) -> Level:
        """Native or emulated (a plan is never unsupported: that is an error)."""
        return self.resolution.level

    @property
    def native(self) -> bool:
        """Whether the op's own native kernel carries the call (see :attr:`Resolution.native_entry`)."""
        return self.resolution.native_entry


def plan_call(
    table: CapabilityTable,
    op: Collective,
    fallback: str,
    *,
    mode: Mode = Mode.EAGER,
    dtype: torch.dtype | None = None,
    reduce_op: str | None = None,
    world_size: int | None = None,
    sdk_versions: Mapping[str, str] | None = None,
) -> Plan:
    """Plan ``op`` for one call shape: one table question, then the fallback policy.

    Args:
        table: the group's capability table.
        op: the collective (or fused op).
        fallback: the group's policy, ``"warn"``, ``"emulate"`` or ``"error"``.
        mode: eager, or graph (at trace time).
        dtype, reduce_op, world_size, sdk_versions: the call shape, as :meth:`CapabilityTable.resolve` takes it.

    Raises:
        UnsupportedCollective: the table says unsupported, or emulated and the policy is ``"error"``.
    """
    res, bounds, by_size = table.resolve_sized(op, mode=mode, dtype=dtype, reduce_op=reduce_op,
                                               world_size=world_size, sdk_versions=sdk_versions)
    refused = table.refusal(op, res, allow_emulated=fallback != "error")
    if refused is not None:
        raise refused
    return Plan(op, res, bounds, by_size)


def guarded(st: GroupState, op: Collective, native: Kernel, fallback: Callable[[], Kernel], what: str) -> Kernel:
    """``native``, and where it raises :class:`~xccl.ConstraintViolation`, the fallback policy.

    The constraint is checked before communicating, on facts every rank shares (the contract), so every rank
    refuses alike and takes the same way out.

    Args:
        st: the group.
        op: the op, for the warning.
        native: the plugin's kernel.
        fallback: builds the kernel to run instead (called at the first refusal; it takes the same arguments).
        what: names that kernel in the warning (``"the portable pipelined version"``).
    """
    built: list[Kernel] = []

    def kernel(*args: Any) -> Any:
        try:
            return native(*args)
        except ConstraintViolation as exc:
            if st.fallback == "error":
                raise
            if st.fallback == "warn":
                warn_once(
                    (op.value, st.backend, exc.constraint),
                    f"xccl: the native {op.value} kernel of {st.backend} cannot take this call (constraint "
                    f"{exc.constraint!r}: {exc.detail}); running {what}. Pass fallback='emulate' to xccl.init to "
                    "silence this, or fallback='error' to raise instead.",
                    ConstraintFallbackWarning,
                )
            LOG.debug("%s: native kernel refused (%s); %s", op.value, exc.constraint, what)
        if not built:
            built.append(fallback())
        return built[0](*args)

    return kernel


def warn_once(key: tuple[str, ...], message: str, category: type[Warning] = EmulationWarning) -> None:
    """Warn ``message`` once per ``key`` (op and backend, say) in this world, naming the user's line."""
    if key in GROUPS.warned:
        return
    GROUPS.warned.add(key)
    warn_at_user(message, category)
