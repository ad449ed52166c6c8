"""c10d kernels for plugins: one call of the vendor's own c10d method per collective.

What dispatch runs where a plugin's table says native and the plugin brings no kernel of its own, and what a
plugin's kernel can call after a check of its own (:func:`c10d_kernel`): the plugin SDK's view of the specs' facts
(``xccl.ops._specs``, built from ``xccl.ops._c10d``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from ..ops._c10d import done
from ..ops._specs import SPECS
from ..ops._vocab import Collective

__all__ = ["C10D_METHODS", "c10d_kernel", "done"]

Kernel = Callable[..., Any]

#: c10d's collective methods of ``ProcessGroup`` / ``Backend``, by the C++ virtual's name, with the other names
#: Python code and the C++ trampoline call them by: derived from the specs (``Spec.c10d``). xccl's process group and
#: the simulated vendor group both implement every name.
C10D_METHODS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    m.name: m.aliases for spec in dict.fromkeys(SPECS.values()) for m in spec.c10d
})


def c10d_kernel(op: Collective, native: Any) -> Kernel | None:
    """The kernel of ``op`` that calls c10d's method on ``native`` (the vendor's process group or backend), or
    None when c10d has no method for it (the uneven and fused ops: those come from the plugin).

    Example (a plugin kernel that checks a vendor constraint first)::

        def all_gather(ctx, outs, tensor, async_op):
            if len({t.shape for t in outs}) > 1:
                raise ConstraintViolation("all_gather", ctx.plugin, "equal sizes", "...")
            return c10d_kernel(Collective.ALL_GATHER, ctx.native)(outs, tensor, async_op)
    """
    spec = SPECS.get(op)
    builder = None if spec is None else spec.kernels.get(op)
    return None if builder is None else builder(native)
