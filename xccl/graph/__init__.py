"""Graph mode: xccl's collectives inside ``torch.compile`` graphs.

``xccl.<op>`` checks ``torch.compiler.is_compiling()`` first and, while Dynamo traces, hands over to the graph
form here (``_collectives``): standard collectives as ``torch.ops._c10d_functional`` ops, the rest as xccl's own
``torch.ops.xccl`` ops (``_ops``), chained in program order. Around that: differentiable functional collectives
(``functional``), patching of code that calls ``torch.distributed`` or DeepSpeed directly (``_patch``), and the
``xccl`` compile backend with its converter and post-grad-pass hooks (``_backend``).
"""

from . import functional
from ._backend import (
    XcclBackend,
    apply_converters,
    compile,
    post_grad_passes,
    register_backend,
    register_post_grad_pass,
    unregister_post_grad_pass,
)
from ._forms import (
    GraphWork,
    all_gather,
    all_gather_into_tensor,
    all_gather_into_tensor_uneven,
    all_reduce,
    all_to_all,
    all_to_all_single,
    all_to_all_v,
    barrier,
    broadcast,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    reduce_scatter_tensor_uneven,
    scatter,
    send,
)
from ._ops import OPS
from ._patch import Patch, patch_collectives

__all__ = [
    "OPS",
    "GraphWork",
    "Patch",
    "XcclBackend",
    "apply_converters",
    "compile",
    "functional",
    "patch_collectives",
    "post_grad_passes",
    "register_backend",
    "register_post_grad_pass",
    "unregister_post_grad_pass",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_into_tensor_uneven",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v",
    "barrier",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_uneven",
    "scatter",
    "send",
]
