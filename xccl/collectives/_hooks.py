"""The call pipeline's seam: the hooks of a group, and the pipeline built from them.

Every call that runs a kernel on a group (``xccl.<op>``, ``torch.distributed.<op>`` on xccl's group and what is
built on it, the fused ops, the parts of a mixed group, the graph ops at run time) goes through one pipeline::

    run(st, spec, kernel_args, async_op)                    _dispatch
      plan:  kernel = st.plans[shape] or st.kernel_for(...)   once per call shape (op, dtype, reduce op)
      hooks: st.issue(spec, kernel_args, kernel, async_op)    the group's hooks, outermost first, then the kernel

A *hook* observes a group's calls. It gives a *stage*, a function that wraps the next one inward: it sees the
call (its spec, kernel arguments, the kernel and ``async_op``), may act before and after, and calls on (or, like
the mismatch detector, issues the call its own way). The stages are composed once, when the group's hooks are set,
so a call pays one Python call per hook and nothing for a hook a group does not have; with no hook the call is the
bare kernel. An emulation's building blocks run through a second chain, ``st.issue_inner``, which a hook may wrap
too (the flight recorder notes them as the emulated call's parts).

The observers every group gets are :data:`OBSERVERS`, outermost first: **the one place to add an observer**. Each
is a factory that gives the group's hook, or None where it does not apply:

* the flight recorder (``_flight``), outermost: the fewer frames between it and the user's call, the cheaper its
  walk to the user's frame;
* what dispatcher-level tools are shown (CommDebugMode, the profiler: ``_observe``);
* typed faults (``_faults``): backend errors become xccl's typed errors, in the call and in every wait on the
  handle it returns, including waits from C++;
* the mismatch detector (``_check``), on groups with ``check`` on;
* the health watch (``_health``: ``_watch``), innermost, on the groups whose waits block the host: it issues the call and
  waits for it, and names a lost rank past a short deadline without waiting for the backend.

:func:`add_hook` adds one to a group that exists (a test, a tool).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from . import _faults, _flight, _observe
from ._health import _watch
from ._state import GroupState, _bare

__all__ = ["OBSERVERS", "Hook", "Stage", "add_hook", "chains", "install", "remove_hook", "set_hooks"]

#: One stage of the pipeline: ``stage(spec, kernel_args, kernel, async_op)`` -> what the call returns (a work, or
#: None once complete; a fused op's result).
Stage = Callable[[Any, Sequence[Any], Callable[..., Any], bool], Any]


class Hook(Protocol):
    """An observer of a group's calls.

    ``stage(inner)`` returns the stage that wraps ``inner`` for the group's calls. Optional: ``inner_stage(inner)``
    wraps the building blocks of emulations (default: they pass untouched), and ``close()`` is called when the group
    goes (destroyed, or xccl shut down).
    """

    def stage(self, inner: Stage) -> Stage: ...


def _detector(st: GroupState) -> Any:
    if not st.check:
        return None
    from ._check import hook  # the detector is off by default, and importing it costs start-up

    return hook(st)


#: The observers every group gets, outermost first: each ``factory(group_state) -> hook or None``.
OBSERVERS: list[Callable[[GroupState], Any]] = [_flight.hook, _observe.hook, _faults.hook, _detector, _watch.hook]


def install(st: GroupState) -> None:
    """Give ``st`` the hooks of :data:`OBSERVERS` that apply to it."""
    set_hooks(st, [h for h in (factory(st) for factory in OBSERVERS) if h is not None])


def chains(hooks: Sequence[Any]) -> tuple[Stage, Stage]:
    """The two chains ``hooks`` (outermost first) make: for calls, and for emulations' building blocks."""
    issue: Stage = _bare
    inner: Stage = _bare
    for hook in reversed(hooks):
        issue = hook.stage(issue)
        wrap = getattr(hook, "inner_stage", None)
        if wrap is not None:
            inner = wrap(inner)
    return issue, inner


def set_hooks(st: GroupState, hooks: Sequence[Any]) -> None:
    """Set ``st``'s hooks (outermost first) and build its two chains from them."""
    st.hooks = tuple(hooks)
    st.issue, st.issue_inner = chains(hooks)


def add_hook(st: GroupState, hook: Any, *, outermost: bool = False) -> None:
    """Add ``hook`` to ``st`` (innermost, next to the kernel, unless ``outermost``)."""
    hooks = [hook, *st.hooks] if outermost else [*st.hooks, hook]
    set_hooks(st, hooks)


def remove_hook(st: GroupState, hook: Any) -> None:
    """Take ``hook`` off ``st``."""
    set_hooks(st, [h for h in st.hooks if h is not hook])
