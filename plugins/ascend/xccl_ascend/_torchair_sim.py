"""TorchAir in simulation: the vendor ops xccl's graphs lower to, and a compile backend that converts as TorchAir.

On the hardware ``xccl.compile`` hands Ascend graphs to TorchAir, which traces them with AOTAutograd (its own
decompositions plus the plugin's lowering, ``_torchair_lower``), converts every node to GE operators and runs the
GE graph. The simulation does the same up to the conversion, then runs the FX graph on CPU:

* :func:`simulated_torchair`: AOTAutograd as TorchAir configures it (``default_partition``, inference input
  mutations kept, the lowering as decompositions), then, for the forward, backward and inference graph,
  ``_torchair.check_graph`` (the conversion TorchAir would attempt, node by node, and GE's dtype and CANN checks
  of the HCCL operators), then the graph as Python;
* :func:`get_npu_backend`: ``torchair.get_npu_backend()`` as users call it (every Ascend tutorial compiles with
  ``torch.compile(model, backend=torchair.get_npu_backend())``): the same, with TorchAir's decompositions only,
  so none of xccl's lowering; converters registered with :func:`register_fx_node_ge_converter` (TorchAir's public
  registry, ``torchair.register_fx_node_ge_converter``) take part as they would there;
* :func:`sim_graph_ops`: stand-ins for the ops the lowering targets, TorchAir's ``npu_define._send``,
  ``_recv``, ``allgather_in_tensor_uneven``, ``reduce_scatter_tensor_uneven`` and torch_npu's MC2 operators, under
  the namespace ``xccl_ascend_sim`` (never ``npu_define`` or ``npu``, which belong to the vendor). Each has the
  vendor's schema (for the MC2 operators the part of it xccl passes) and computes what the vendor's eager
  implementation computes, over the simulated group: TorchAir's ``_send`` / ``_recv`` find the group by tag and
  ranks and call ``torch.distributed``; the uneven ops and MC2 kernels run torch_npu's (simulated) calls. The
  conversion check knows each by the vendor's name.

Not simulated: GE's graph optimisations and memory planning, CANN's other version rules, and TorchAir's debug and
export paths.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import xccl
from xccl.plugin import NodeProblem, reduce_op_of, report_graph_check

from ._torchair import communication, graph_problems, target_name
from ._torchair_lower import GraphOps

if TYPE_CHECKING:
    from ._sdk_sim import SimSdk

__all__ = ["NS", "SIM_CANN_ENV", "get_npu_backend", "register_fx_node_ge_converter", "sim_cann_version", "sim_graph_ops",
           "simulated_torchair"]

#: The simulation's namespace for the vendor's graph ops.
NS: Final = "xccl_ascend_sim"
#: name -> (the vendor's qualified name, schema). Schemas: Ascend/torchair hcom_send_recv.py, hcom_allgather.py,
#: hcom_reducescatter.py (npu_define ops); the MC2 operators' converters in ge_converter/custom/ (their ``NB:``
#: schema comments), keeping the arguments xccl passes.
_OPS: Final[Mapping[str, tuple[str, str]]] = {
    "_send": ("npu_define._send.default",
              "_send(Tensor input_tensor, int? dst, int[] ranks, str pg_tag, int tag, int? group_dst=None, "
              "int[]? shape=None) -> ()"),
    "_recv": ("npu_define._recv.default",
              "_recv(Tensor out_tensor, int? src, int[] ranks, str pg_tag, int tag, int? group_src=None, "
              "int[]? shape=None) -> Tensor"),
    "allgather_in_tensor_uneven": (
        "npu_define.allgather_in_tensor_uneven.default",
        "allgather_in_tensor_uneven(Tensor input_tensor, SymInt send_count, SymInt[] recv_counts, str tag, "
        "int[] rank_list, int group_size, SymInt[] recv_displacements) -> Tensor"),
    "reduce_scatter_tensor_uneven": (
        "npu_define.reduce_scatter_tensor_uneven.default",
        "reduce_scatter_tensor_uneven(Tensor input_tensor, SymInt[] send_counts, SymInt recv_count, "
        "str reduce_type, str tag, int[] rank_list, int group_size, SymInt[] send_displacements) -> Tensor"),
    "npu_mm_reduce_scatter_base": (
        "npu.npu_mm_reduce_scatter_base.default",
        "npu_mm_reduce_scatter_base(Tensor self, Tensor x2, str hcom, int world_size, *, str reduce_op='sum', "
        "Tensor? bias=None, int comm_turn=0) -> Tensor"),
    "npu_all_gather_base_mm": (
        "npu.npu_all_gather_base_mm.default",
        "npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
        "int gather_index=0, bool gather_output=True, int comm_turn=0) -> (Tensor, Tensor)"),
    "npu_mm_all_reduce_base": (
        "npu.npu_mm_all_reduce_base.default",
        "npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None, "
        "int comm_turn=0) -> Tensor"),
}
#: The compiler's name in what it reports of each graph (``xccl preflight``'s TorchAir verdict).
COMPILER: Final = "TorchAir (simulated)"
#: CANN release to simulate (default: the one Ascend pairs with the simulated torch_npu, ``_releases.Release.cann``).
SIM_CANN_ENV: Final = "XCCL_SIM_CANN_VERSION"
_LOCK: Final = threading.Lock()
_STATE: dict[str, Any] = {}  # "lib": the torch.library (one per process), "sdk": weakref to the active SimSdk
#: Converters registered at run time, by target name (TorchAir keeps them on the op: one per op, the last wins).
_REGISTERED: dict[str, Callable[..., Any]] = {}


def _group(tag: str, ranks: Sequence[int]) -> Any:
    # How TorchAir's eager implementations find the group (hcom_send_recv.py send_npu / recv_npu).
    return c10d._find_or_create_pg_by_ranks_and_tag(tag, list(ranks), len(ranks))


def _sdk() -> SimSdk:
    ref = _STATE.get("sdk")
    sdk = ref() if ref is not None else None
    if sdk is None:  # pragma: no cover - set before any graph can call these ops
        raise RuntimeError("no simulated Ascend runtime in this process: call xccl.init(vendor='ascend', simulate=True)")
    return sdk  # type: ignore[no-any-return]


def _send(t: torch.Tensor, dst: int | None, ranks: Sequence[int], pg_tag: str, tag: int,
          group_dst: int | None = None, shape: Sequence[int] | None = None) -> None:
    dist.send(t.contiguous(), dst, group=_group(pg_tag, ranks), tag=tag, group_dst=group_dst)


def _recv(t: torch.Tensor, src: int | None, ranks: Sequence[int], pg_tag: str, tag: int,
          group_src: int | None = None, shape: Sequence[int] | None = None) -> torch.Tensor:
    out = torch.empty(list(shape) if shape is not None else t.shape, dtype=t.dtype, device=t.device)
    dist.recv(out, src, group=_group(pg_tag, ranks), tag=tag, group_src=group_src)
    return out


def _recv_fake(t: torch.Tensor, src: int | None, ranks: Sequence[int], pg_tag: str, tag: int,
               group_src: int | None = None, shape: Sequence[int] | None = None) -> torch.Tensor:
    return t.new_empty(list(shape) if shape is not None else t.shape)


def _allgather_uneven(t: torch.Tensor, send_count: int, recv_counts: Sequence[int], tag: str,
                      rank_list: Sequence[int], group_size: int, recv_displacements: Sequence[int]) -> torch.Tensor:
    out = t.new_empty([sum(recv_counts), *t.shape[1:]])
    # torch_npu.distributed.all_gather_into_tensor_uneven, as TorchAir's implementation calls it: through xccl,
    # whose native kernel on this plugin is the simulated torch_npu call.
    xccl.all_gather_into_tensor_uneven(out, t, list(recv_counts), group=_group(tag, rank_list))
    return out


def _allgather_uneven_fake(t: torch.Tensor, send_count: int, recv_counts: Sequence[int], tag: str,
                           rank_list: Sequence[int], group_size: int, recv_displacements: Sequence[int]
                           ) -> torch.Tensor:
    return t.new_empty([sum(recv_counts), *t.shape[1:]])


def _reduce_scatter_uneven(t: torch.Tensor, send_counts: Sequence[int], recv_count: int, reduce_type: str, tag: str,
                           rank_list: Sequence[int], group_size: int, send_displacements: Sequence[int]
                           ) -> torch.Tensor:
    out = t.new_empty([recv_count, *t.shape[1:]])
    xccl.reduce_scatter_tensor_uneven(out, t, list(send_counts), op=reduce_op_of(reduce_type),
                                      group=_group(tag, rank_list))
    return out


def _reduce_scatter_uneven_fake(t: torch.Tensor, send_counts: Sequence[int], recv_count: int, reduce_type: str,
                                tag: str, rank_list: Sequence[int], group_size: int,
                                send_displacements: Sequence[int]) -> torch.Tensor:
    return t.new_empty([recv_count, *t.shape[1:]])


def _mm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, *, reduce_op: str = "sum",
                       bias: torch.Tensor | None = None, comm_turn: int = 0) -> torch.Tensor:
    return _sdk().mm_reduce_scatter_base(a, b, hcom, world_size)


def _mm_reduce_scatter_fake(a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, *, reduce_op: str = "sum",
                            bias: torch.Tensor | None = None, comm_turn: int = 0) -> torch.Tensor:
    return a.new_empty((a.shape[0] // world_size, b.shape[1]))


def _all_gather_mm(a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, *, bias: torch.Tensor | None = None,
                   gather_index: int = 0, gather_output: bool = True, comm_turn: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    return _sdk().all_gather_base_mm(a, b, hcom, world_size, gather_output)


def _all_gather_mm_fake(a: torch.Tensor, b: torch.Tensor, hcom: str, world_size: int, *,
                        bias: torch.Tensor | None = None, gather_index: int = 0, gather_output: bool = True,
                        comm_turn: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rows = a.shape[0] * world_size
    return a.new_empty((rows, b.shape[1])), a.new_empty((rows, a.shape[1])) if gather_output else a.new_empty((0,))


def _mm_all_reduce(a: torch.Tensor, b: torch.Tensor, hcom: str, *, reduce_op: str = "sum",
                   bias: torch.Tensor | None = None, comm_turn: int = 0) -> torch.Tensor:
    return _sdk().mm_all_reduce_base(a, b, hcom, bias)


def _mm_all_reduce_fake(a: torch.Tensor, b: torch.Tensor, hcom: str, *, reduce_op: str = "sum",
                        bias: torch.Tensor | None = None, comm_turn: int = 0) -> torch.Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[1]))


_IMPLS: Final[Mapping[str, tuple[Callable[..., Any], Callable[..., Any]]]] = {
    "_send": (_send, lambda *args, **kwargs: None),
    "_recv": (_recv, _recv_fake),
    "allgather_in_tensor_uneven": (_allgather_uneven, _allgather_uneven_fake),
    "reduce_scatter_tensor_uneven": (_reduce_scatter_uneven, _reduce_scatter_uneven_fake),
    "npu_mm_reduce_scatter_base": (_mm_reduce_scatter, _mm_reduce_scatter_fake),
    "npu_all_gather_base_mm": (_all_gather_mm, _all_gather_mm_fake),
    "npu_mm_all_reduce_base": (_mm_all_reduce, _mm_all_reduce_fake),
}


def _define() -> Any:
    lib = torch.library.Library(NS, "DEF")  # kept in _STATE: a library lives as long as its object
    for name, (_, schema) in _OPS.items():
        lib.define(schema)
        impl, fake = _IMPLS[name]
        lib.impl(name, impl, "CPU")
        torch.library.register_fake(f"{NS}::{name}", fake, lib=lib)
    # Communication survives dead-code elimination even where a result is unused, as TorchAir marks its own.
    torch.fx.node.has_side_effect(getattr(torch.ops, NS)._send.default)
    torch.fx.node.has_side_effect(getattr(torch.ops, NS)._recv.default)
    return lib


def sim_graph_ops(sdk: SimSdk) -> GraphOps:
    """The stand-ins, defined on first use (once per process), computing with ``sdk``."""
    with _LOCK:
        if "lib" not in _STATE:
            _STATE["lib"] = _define()
        _STATE["sdk"] = weakref.ref(sdk)
    ns = getattr(torch.ops, NS)
    return GraphOps(
        send=ns._send.default,
        recv=ns._recv.default,
        allgather_uneven=ns.allgather_in_tensor_uneven.default,
        reduce_scatter_uneven=ns.reduce_scatter_tensor_uneven.default,
        mm_reduce_scatter=ns.npu_mm_reduce_scatter_base.default,
        all_gather_mm=ns.npu_all_gather_base_mm.default,
        mm_all_reduce=ns.npu_mm_all_reduce_base.default,
        names=_aliases(),
    )


def sim_cann_version(env: Mapping[str, str] | None = None) -> str:
    """The simulated CANN version: ``XCCL_SIM_CANN_VERSION``, default the CANN paired with the simulated torch_npu
    (8.3.RC1 for 2.8.0, 9.0.0 for 2.13.0; read when asked, so a test may set it)."""
    from ._releases import release

    return (os.environ if env is None else env).get(SIM_CANN_ENV, "").strip() or release(env).cann


def register_fx_node_ge_converter(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """TorchAir's public ``register_fx_node_ge_converter(op)(converter)``, into the simulated registry."""

    def register(converter: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTERED[target_name(op)] = converter
        return converter

    return register


def _aliases() -> dict[str, str]:
    return {f"{NS}.{name}.default": real for name, (real, _) in _OPS.items()}


def get_npu_backend(*, compiler_config: Any = None, custom_decompositions: Mapping[Any, Callable[..., Any]] | None = None,
                    cann: str | None = None) -> Callable[..., Any]:
    """``torchair.get_npu_backend()`` in simulation: TorchAir's backend as a user calls it, without xccl's lowering.

    Args:
        compiler_config: accepted for the signature's sake (the simulation has one mode, max-autotune).
        custom_decompositions: as TorchAir's (the user's own).
        cann: the CANN version the simulated GE checks against (default: the simulated runtime's,
            ``XCCL_SIM_CANN_VERSION``).
    """
    return simulated_torchair(custom_decompositions or {}, _aliases(), cann=cann or sim_cann_version())


def simulated_torchair(
    decompositions: Mapping[Any, Callable[..., Any]],
    aliases: Mapping[str, str],
    *,
    check: bool = True,
    observe: Callable[[str, torch.fx.GraphModule], None] | None = None,
    cann: str | None = None,
) -> Callable[..., Any]:
    """A ``torch.compile`` backend that traces as TorchAir does, checks every graph with TorchAir's conversion
    rules and runs it on CPU.

    Args:
        decompositions: the plugin's lowering (TorchAir's ``custom_decompositions``).
        aliases: the stand-in ops' names -> the vendor's, for the check.
        check: run the conversion check (False: skip it; what the tests compare against).
        observe: called with the phase and each graph that passed, before it runs (a test seam).
        cann: the CANN version GE's checks assume (None: unknown, send/recv not checked).
    """
    # Lazy: Dynamo and AOTAutograd load only when something is compiled.
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import default_partition

    def compiler(phase: str) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            if check:
                problems = graph_problems(gm, phase=phase, aliases=aliases, cann=cann, registered=dict(_REGISTERED))
                # Every node it cannot convert, for `xccl preflight`'s verdict; then the first fails the
                # compilation, as on the hardware.
                report_graph_check(COMPILER, phase, len(gm.graph.nodes), communication(gm, aliases),
                                   [NodeProblem(str(node.format_node()), name, str(exc)) for node, name, exc in problems])
                if problems:
                    raise problems[0][2]
            if observe is not None:
                observe(phase, gm)
            return make_boxed_func(gm.forward)  # CPU runs what GE would

        return compile_graph

    # As TorchAir's _compile_graph_with_aot in max-autotune mode without npu_fx_pass (npu_fx_compiler.py).
    return aot_autograd(  # type: ignore[no-any-return]
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=dict(decompositions),
        partition_fn=default_partition,
        keep_inference_input_mutations=True,
    )
