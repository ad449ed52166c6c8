"""The ``xccl`` compile backend: the plugin's graph converters, then Inductor (with xccl's post-grad passes) or
the vendor's own graph compiler (``Runtime.compile_backend()``, TorchAir's ``get_npu_backend()`` on Ascend).

A **converter** (``Runtime.graph_converters()``) maps an op's qualified name (``"xccl::send"``,
``"_c10d_functional::all_reduce"``, ...) to a callable taking the op's arguments in schema order and returning
what the op returns (same number of tensors, shapes and dtypes), made of ops AOTAutograd can trace; keys that name
no existing op raise :class:`~xccl.InvalidArgument` when the backend is built. See docs/graph.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch

from ..collectives._state import PROCESS
from ..errors import InvalidArgument
from ..fused._pass import FusedMatmulPass
from ._state import GRAPH

__all__ = [
    "XcclBackend",
    "apply_converters",
    "compile",
    "post_grad_passes",
    "register_backend",
    "register_post_grad_pass",
    "unregister_post_grad_pass",
]

LOG = logging.getLogger("xccl")

GraphPass = Callable[[torch.fx.Graph], None]
_LOCK: Final = threading.Lock()


# ----------------------------------------------------------------------------------------------- post-grad passes


def register_post_grad_pass(name: str, fn: GraphPass, uuid: str) -> None:
    """Add (or replace) a pass the ``xccl`` backend runs over Inductor's post-grad graph.

    Passes run in name order, after Inductor's own post-grad passes (as ``post_grad_custom_post_pass``), on the
    ``torch.fx.Graph`` of the forward and of the backward, and must modify it in place. Inductor's FX graph cache
    keys on ``uuid``: change it whenever the pass's behaviour changes, or a cached graph compiled without the
    change is reused. Passes belong to the world: ``xccl.shutdown`` forgets them, so register them after
    ``xccl.init``.

    Args:
        name: a unique name; registering the same name again replaces the pass.
        fn: ``fn(graph) -> None``.
        uuid: a string identifying this version of the pass (e.g. a hash of its source, or a version tag).
    """
    if not callable(fn):
        raise InvalidArgument("register_post_grad_pass", f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(uuid, str) or not uuid:
        raise InvalidArgument("register_post_grad_pass", "uuid must be a non-empty string")
    with _LOCK:
        GRAPH.passes[name] = (fn, uuid)


def unregister_post_grad_pass(name: str) -> None:
    """Remove the pass called ``name`` (no error when there is none)."""
    with _LOCK:
        GRAPH.passes.pop(name, None)


def post_grad_passes() -> dict[str, str]:
    """The registered passes: name -> uuid."""
    return {name: uuid for name, (_, uuid) in sorted(GRAPH.passes.items())}


def _custom_pass(previous: Any, fuse: bool = False) -> Any:
    """A ``CustomGraphPass`` running ``previous`` (the user's own, if any), then the fusion pass when ``fuse``,
    then a snapshot of the registered passes."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    passes = tuple(sorted((n, fn, u) for n, (fn, u) in GRAPH.passes.items()))
    if fuse:
        fusion = FusedMatmulPass()
        # "0" sorts before any registered name: the fusion pass runs first, the user's passes see fused ops.
        passes = (("0:" + FUSION_PASS, fusion, fusion.uuid().hex()), *passes)
    if not passes:
        return previous

    class _XcclPostGradPasses(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            if previous is not None:
                previous(graph)
            for _, fn, _ in passes:
                fn(graph)

        def uuid(self) -> Any:
            key = "|".join(f"{n}:{u}" for n, _, u in passes)
            if previous is not None:
                key += f"|previous:{previous.uuid()}"
            return hashlib.sha256(key.encode()).hexdigest()

    return _XcclPostGradPasses()


# ------------------------------------------------------------------------------------------------- converters


def _qualname(target: Any) -> str | None:
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name)
    if isinstance(target, torch._ops.OpOverload):
        return str(target._schema.name)
    return None


def _check_converters(converters: Mapping[str, Callable[..., Any]]) -> None:
    for key, fn in converters.items():
        ns, _, name = key.partition("::")
        if not ns or not name or not hasattr(getattr(torch.ops, ns), name):
            raise InvalidArgument("graph_converters", f"{key!r} names no torch op; keys are 'namespace::name'")
        if not callable(fn):
            raise InvalidArgument("graph_converters", f"the converter for {key!r} is not callable")


def apply_converters(gm: torch.fx.GraphModule, converters: Mapping[str, Callable[..., Any]]) -> int:
    """Re-target every call of a converted op in ``gm`` to its converter; returns how many calls changed."""
    if not converters:
        return 0
    _check_converters(converters)
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        fn = converters.get(_qualname(node.target) or "")
        if fn is not None:
            node.target = fn
            changed += 1
    if changed:
        gm.recompile()
    return changed


# ---------------------------------------------------------------------------------------------------- backend


#: The name of the fusion pass among the backend's post-grad passes.
FUSION_PASS: Final = "xccl.fused_matmul_collectives"


def fusion_default() -> bool:
    """Whether ``xccl.compile`` installs the fusion pass when not told: yes, unless ``XCCL_FUSE=0``."""
    return os.environ.get("XCCL_FUSE", "1").strip().lower() not in ("0", "false", "no", "off")


class XcclBackend:
    """A ``torch.compile`` backend: the plugin's converters, then the vendor's compiler or Inductor.

    Args:
        inner: where to hand the converted graph: a ``torch.compile`` backend name or callable. Default: the
            plugin's ``Runtime.compile_backend()``, else Inductor.
        options: Inductor config patches (as ``torch.compile(options=...)``); used only with Inductor.
        converters: converters to apply instead of the plugin's (a test seam and an override).
        fuse: install the fusion pass (matmul + collective into xccl's fused ops, ``xccl.fused``) among Inductor's
            post-grad passes; default :func:`fusion_default`. Where the fused op cannot beat the sequence (the
            cost model keeps the plain sequence, or the plugin's kernel refuses the shape) it runs the sequence,
            so fusing is never a loss beyond noise; ``fuse=False`` or ``XCCL_FUSE=0`` turns it off.
    """

    def __init__(
        self,
        *,
        inner: str | Callable[..., Any] | None = None,
        options: Mapping[str, Any] | None = None,
        converters: Mapping[str, Callable[..., Any]] | None = None,
        fuse: bool | None = None,
    ) -> None:
        self.inner = inner
        self.options = dict(options or {})
        self.converters = converters
        self.fuse = fusion_default() if fuse is None else fuse
        if converters is not None:
            _check_converters(converters)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # xccl's ops are defined by the first graph form that needs them; a plugin's compiler (its lowering of
        # torch.ops.xccl.*) may name all of them, whichever this graph holds.
        from . import _ops  # noqa: F401 - defines torch.ops.xccl.*

        runtime = PROCESS.runtime
        converters = self.converters
        if converters is None:
            converters = dict(runtime.graph_converters()) if runtime is not None else {}
        changed = apply_converters(gm, converters)
        if changed:
            LOG.debug("xccl backend: %d graph op calls converted", changed)
        inner = self.inner if self.inner is not None else (runtime.compile_backend() if runtime is not None else None)
        if inner is not None:
            if isinstance(inner, str):
                from torch._dynamo.backends.registry import lookup_backend

                inner = lookup_backend(inner)
            return inner(gm, example_inputs)
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        patches = dict(self.options)
        previous = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
        custom = _custom_pass(previous, self.fuse)
        if custom is not None:
            patches["post_grad_custom_post_pass"] = custom
        return compile_fx(gm, example_inputs, config_patches=patches)


def xccl_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """The backend registered as ``"xccl"``: :class:`XcclBackend` with its defaults."""
    return XcclBackend()(gm, example_inputs)


def register_backend() -> None:
    """Register ``"xccl"`` as a ``torch.compile`` backend name (idempotent).

    The ``torch_dynamo_backends`` entry point does this without importing xccl first; this covers installs
    without it.
    """
    from torch._dynamo.backends import registry

    registry._lazy_import()
    if "xccl" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=xccl_backend, name="xccl")


def compile(
    model: Any = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    options: Mapping[str, Any] | None = None,
    inner: str | Callable[..., Any] | None = None,
    fuse: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``torch.compile`` with the ``xccl`` backend: the plugin's converters, then its compiler or Inductor.

    Args:
        model: a module or function; omitted, returns a decorator.
        fullgraph: raise on any graph break instead of splitting the graph (as ``torch.compile``).
        dynamic: as ``torch.compile``.
        options: Inductor config patches (ignored when a vendor compiler takes over).
        inner: the backend to hand off to instead of the plugin's choice (e.g. ``"aot_eager"``).
        fuse: rewrite matmul + collective pairs into xccl's fused ops (default on; ``XCCL_FUSE=0`` turns the
            default off); see :class:`XcclBackend`.
        **kwargs: passed to ``torch.compile`` (``mode`` is not: pass Inductor options instead).

    Example::

        step = xccl.compile(train_step, fullgraph=True)
    """
    register_backend()
    backend = XcclBackend(inner=inner, options=options, fuse=fuse)
    if model is None:
        return lambda m: torch.compile(m, backend=backend, fullgraph=fullgraph, dynamic=dynamic, **kwargs)
    return torch.compile(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic, **kwargs)
