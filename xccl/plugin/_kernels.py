"""What a plugin's kernels receive, and the signature each kind of kernel must have.

xccl calls a kernel of ``Runtime.kernels()`` as ``kernel(ctx, *kernel_args, async_op)`` (the fused ops take no
``async_op``) with a :class:`KernelContext` and the op's arguments after validation: tensors checked, roots and
peers as *group* ranks, split sizes as lists of ints, reduce ops as ``torch.distributed.ReduceOp``
(docs/plugin-guide.md, section 8). :data:`KERNEL_SIGNATURES` lists, per op, the parameters a kernel must accept;
:func:`kernel_problems` checks a callable against it (``xccl.init`` does, through ``_verify``, before any process
group exists).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ..ops._specs import KERNEL_SIGNATURES as _SIGNATURES
from ..ops._vocab import Collective

__all__ = ["KERNEL_SIGNATURES", "KernelContext", "kernel_problems", "kernels_problems"]


@final
@dataclass(frozen=True, slots=True)
class KernelContext:
    """What a plugin's kernel knows about the group it runs on."""

    #: The process group as torch.distributed knows it: pass it to vendor SDK functions that take a group (they
    #: reach the vendor backend through ``group._get_backend(device)``). Do not call ``torch.distributed``
    #: collectives on it from a kernel: on xccl's process group they dispatch back into xccl.
    group: Any
    #: The vendor's own process group (or c10d ``Backend``): its c10d methods (``allreduce([t], opts)``,
    #: ``_allgather_base(out, in, opts)``, ...) run the vendor's kernels directly.
    native: Any
    #: This process's rank within the group.
    rank: int
    #: Number of members.
    size: int
    #: Global ranks of the members, in group-rank order.
    ranks: tuple[int, ...]
    #: The plugin's name (for error messages, e.g. ``ConstraintViolation(op, ctx.plugin, ...)``).
    plugin: str
    #: The group's communicator name (``Runtime.comm_name``), cached by xccl: on HCCL the first call creates the
    #: communicator, so every rank of the group must reach it (the fused kernels do, together).
    comm_name: Callable[[], str]


#: The kernel arguments of each op, after ``ctx`` (and before ``async_op`` where the op has one): the names of the
#: op's kernel arguments in its spec (``Spec.signature``).
KERNEL_SIGNATURES: Final[Mapping[Collective, tuple[str, ...]]] = _SIGNATURES


def kernel_problems(op: Collective, kernel: object) -> list[str]:
    """Why ``kernel`` cannot be called as the kernel of ``op`` (empty: it can).

    The check is positional, like the call: the kernel must take ``ctx`` and then as many positional arguments as
    :data:`KERNEL_SIGNATURES` lists for ``op`` (their names are free), with no further required parameter.
    """
    if not callable(kernel):
        return [f"the {op.value} kernel is a {type(kernel).__name__}, not a callable"]
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return []  # a builtin without a signature: nothing to check
    want = 1 + len(KERNEL_SIGNATURES[op])
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    expected = f"(ctx, {', '.join(KERNEL_SIGNATURES[op])})"
    problems = []
    if len(positional) < want and not variadic:
        problems.append(f"the {op.value} kernel takes {len(positional)} positional arguments; xccl calls it with "
                        f"{want}: {expected}")
    if len(required) > want:
        problems.append(f"the {op.value} kernel requires {len(required)} arguments; xccl passes {want}: {expected}")
    if kw_only:
        problems.append(f"the {op.value} kernel requires keyword-only arguments {kw_only} that xccl never passes")
    return problems


def kernels_problems(kernels: Mapping[Collective, Callable[..., Any]], owner: str = "") -> list[str]:
    """:func:`kernel_problems` over every kernel a runtime returns, each with what to write (``owner``: what
    prefixes ``kernels()`` in the messages, e.g. ``"AcmeRuntime."``)."""
    out = []
    for op, kernel in kernels.items():
        if not isinstance(op, Collective):
            out.append(f"{owner}kernels() has a key {op!r} that is not an xccl.Collective: write Collective.ALL_REDUCE")
            continue
        args = ", ".join(("ctx", *KERNEL_SIGNATURES[op]))
        out += [f"{owner}kernels()[Collective.{op.name}]: {problem}; write `def {op.value}({args}, /)` "
                "(xccl.plugin.KERNEL_SIGNATURES)" for problem in kernel_problems(op, kernel)]
    return out
