"""Graph mode: xccl's collectives inside ``torch.compile`` graphs (docs/graph.md).

The graph forms of the public collectives (``_forms``), xccl's own graph ops (``_ops``), differentiable functional
collectives (``functional``) and the ``xccl`` compile backend (``_backend``). Patching code that calls
``torch.distributed`` or DeepSpeed directly lives with the public signatures it binds to (``xccl.api._patch``).

The names below load on first use (PEP 562): the compile backend imports Inductor, which eager-only programs
never need.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

#: Public name -> the submodule defining it.
_LAZY: Final = {
    "XcclBackend": "_backend",
    "apply_converters": "_backend",
    "compile": "_backend",
    "fusion_default": "_backend",
    "post_grad_passes": "_backend",
    "register_backend": "_backend",
    "register_post_grad_pass": "_backend",
    "unregister_post_grad_pass": "_backend",
    "GraphWork": "_forms",
    "OPS": "_ops",
    "graph_ops": "_ops",
    "functional": "",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xccl.graph' has no attribute {name!r}")
    value = importlib.import_module(f"{__name__}.{module or name}")
    return value if not module else getattr(value, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
