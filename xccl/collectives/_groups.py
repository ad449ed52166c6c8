"""Which state each process group has: found, made for a group xccl has not seen, forgotten when torch destroys it.

xccl's own process groups know their kind (``make_state``: one vendor's group, or a mixed group spanning islands);
any other group (made with plain ``torch.distributed`` on the vendor's backend) is its own vendor's group. A state is
made with its hooks installed (``_hooks``), under the world's policies unless given others.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch.distributed as dist

from ..errors import InitError, InvalidArgument
from ..ops._validate import group_problem
from ..plugin._contract import Runtime
from ._hooks import install
from ._state import GROUPS, PROCESS, Fallback, GroupState
from ._vendor import VendorGroup

__all__ = ["close_all", "forget", "register", "state_of"]


def state_of(group: Any = None) -> GroupState:
    """The :class:`GroupState` of ``group`` (``None``: the world). Groups made outside xccl are adopted.

    Raises:
        InitError: xccl is not initialised.
        InvalidArgument: ``group`` is not a process group of this rank.
    """
    if group is None:
        st = GROUPS.default
        if st is None:
            raise InitError("xccl is not initialised: call xccl.init() first")
        return st
    st = GROUPS.groups.get(group)
    return st if st is not None else _adopt(group)


def register(group: Any, runtime: Runtime, fallback: Fallback | None = None, check: bool | None = None, *,
             ranks: tuple[int, ...] | None = None, name: str | None = None, state: GroupState | None = None
             ) -> GroupState:
    """Track ``group`` (xccl's state of it: ``state``, else a vendor group's), its hooks installed.

    Also a test seam: a group with a runtime and policies of its own instead of the world's (one rank pool serves
    several fallback policies, or a test vendor's kernels over a real group). ``ranks`` and ``name`` are given for a
    group torch does not know (a mixed group's island group, ``_mixed``).
    """
    if state is None:
        fallback = PROCESS.fallback if fallback is None else fallback
        check = PROCESS.check if check is None else check
        # xccl's process groups know their kind (``make_state``: one vendor's, or a mixed group's); any other group
        # is its own vendor's native group.
        make = getattr(group, "make_state", None)
        state = (make(runtime, fallback, check) if make is not None and ranks is None else
                 VendorGroup(group, getattr(group, "native", group), getattr(group, "side", None), runtime, fallback,
                             check, ranks, name))
    install(state)
    GROUPS.groups[group] = state
    return state


def forget(group: Any) -> None:
    """Drop what xccl keeps for ``group`` once torch destroys it: its state and its scratch buffers."""
    default = GROUPS.default
    st = GROUPS.groups.pop(group, None) if default is None or default.group is not group else default
    if st is not None:
        st.close()


def close_all() -> None:
    """Close every group's state (its scratch buffers) and forget them all: before the groups themselves are
    destroyed, so that the backends go down there, in order (``xccl.shutdown``, a shrink of the world)."""
    for st in dict.fromkeys([GROUPS.default, *GROUPS.groups.values()]):
        if st is not None:
            st.close()
    GROUPS.groups.clear()
    GROUPS.default = None
    _unpin(dist.GroupMember.WORLD)


def _unpin(world: Any) -> None:
    # torch.distributed.nn.functional (torch 2.13, line 32 on) takes ``group=group.WORLD`` as a default, evaluated at
    # import: imported after init (torch._dynamo imports it, so the first optimizer made does) it pins the world, and
    # destroy_process_group cannot free it. Its gloo threads then live on to interpreter finalization, where their
    # teardown can abort the process ("terminate called without an active exception", `xccl demo` in CI), and after
    # a new init those functions would call the dead group. None means the same thing while the world lives: it.
    # Type checks by ``type()``, not isinstance: torch.distributed.reduce_op warns on any attribute read.
    if world is None:
        return
    modules = [m for name, m in list(sys.modules.items()) if name.startswith("torch.distributed")]
    for obj in (obj for m in modules for obj in list(vars(m).values())):
        kind = type(obj)
        for fn in [obj] if kind is types.FunctionType else [*vars(obj).values()] if issubclass(kind, type) else []:
            fn = fn.__func__ if type(fn) in (staticmethod, classmethod) else fn
            defaults = fn.__defaults__ or () if type(fn) is types.FunctionType else ()
            if any(v is world for v in defaults):
                fn.__defaults__ = tuple(None if v is world else v for v in defaults)


def _adopt(group: Any) -> GroupState:
    # The runtime is enough: a framework may create xccl's groups (xccl.process_group_backend) before xccl.init.
    runtime = PROCESS.runtime
    if runtime is None:
        raise InitError("xccl is not initialised: call xccl.init() first")
    problem = group_problem(group)
    if problem is not None:
        raise InvalidArgument("group", problem)
    # xccl's process group carries the vendor's group and the host-side gloo group; any other group is its own native.
    return register(group, runtime)
