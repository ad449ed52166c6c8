"""TorchAir's vocabulary (what its graph compiler converts to GE operators) and the simulated conversion check.

On Ascend, ``xccl.compile`` hands the graph to TorchAir (``torchair.get_npu_backend()``). After AOTAutograd,
TorchAir walks the FX graph and converts every ``call_function`` node to GE operators through the converter
registered for its target (``register_fx_node_ge_converter``); a node without one fails to compile. The
simulation compiles on CPU, so without help it would accept graphs the hardware rejects. This module carries
TorchAir's vocabulary as data (``torchair_vocabulary.json``, derived from TorchAir's source at a pinned commit by
``_torchair_derive``) and :func:`check_graph`, which the simulated TorchAir backend (``_torchair_sim``) runs on
every forward, backward and inference graph, node by node, as TorchAir's converter would:

* Python builtins other than the binary operators run as Python (``npu_fx_compiler.py``);
* targets ``parse_node`` handles itself (scope markers, record/wait control edges, ``auto_functionalized_v2``)
  and nodes whose outputs are all empty need no converter (the empty-tensor shortcut);
* a target with a real converter passes, as does one TorchAir's default decompositions rewrite before conversion
  (``_c10d_functional.all_to_all_single``); a converter registered only from some torch version counts from it;
* a converter that only raises (``... ge_converter is not implemented!``) fails with its own message; a target
  with none fails with the error TorchAir's converter generator raises (``Failed to auto-generated converter for
  ...``, or ``No AscendIR ... was found to be registered`` for a custom op);
* the reduce op of a collective passes TorchAir's ``normalize_reduceop_type`` (sum, min, max, product only), and
  the MC2 matmul + collective operators get float16 or bfloat16, as their converters assert;
* a converter registered at run time (``register_fx_node_ge_converter``, as the plugin does for xccl's own ops,
  ``_torchair_lower.converters``) is called, as TorchAir calls it.

Then what GE does with the converted operators, for the HCCL operators xccl's graphs reach:

* the tensor's dtype is one the operator's IR prototype lists (``Vocabulary.dtypes_of``: the prototypes TorchAir
  bundles, ``auto_generated_ge_raw_ops.py``). TorchAir's converters pass the dtype through unchecked (the lists
  are only the raw ops' docstrings), so on the hardware it is GE that refuses the graph when it compiles it; the
  simulation refuses it at the node, with the prototype's list and line;
* send and receive need CANN 8.6.0 (``npu_fx_compiler.py``: TorchAir only logs "not supported in graph, you need
  upgrade cann version", and only for ``npu_define._send`` nodes in the Dynamo graph, which xccl's graphs have only
  after lowering): below it the simulation refuses HcomSend / HcomReceive with TorchAir's text.

A failing node raises :class:`~xccl.UnsupportedCollective` naming the node, the error text and its source
line. Kernel limits and GE's own graph passes are for the hardware to say.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, final

import torch
import torch.distributed as dist

from xccl.plugin import UnsupportedCollective, version_below

__all__ = ["GRAPH_P2P_CANN", "IR_DTYPE", "Vocabulary", "check_graph", "communication", "graph_problems",
           "normalize_reduce_op", "target_name", "vocabulary"]

BACKEND: Final = "ascend"
_RESOURCE: Final = "torchair_vocabulary.json"
_BINARY: Final = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.pow, math.floor,
    operator.mod, math.ceil, operator.neg,
})  # npu_fx_compiler.py ``_is_binary_operator``: these go through converters like any op
#: The reduce-type argument of the collectives TorchAir normalises (index into the node's args).
_REDUCE_ARG: Final = {
    "_c10d_functional.all_reduce.default": 1,
    "_c10d_functional.reduce_scatter_tensor.default": 1,
    "c10d_functional.all_reduce.default": 1,
    "c10d_functional.reduce_scatter_tensor.default": 1,
    "npu_define.reduce_scatter_tensor_uneven.default": 3,
}
#: The MC2 operators whose converters assert float16/bfloat16 operands (``check_dtype``).
_MC2: Final = frozenset({
    "npu.npu_mm_reduce_scatter_base.default", "npu.npu_all_gather_base_mm.default",
    "npu.npu_mm_all_reduce_base.default",
})
_HALF: Final = (torch.float16, torch.bfloat16)
#: The GE operator each converted collective becomes, the IR input (or output) that holds its data, and which
#: argument of the node that is (None: the node's output): TorchAir's converters (c10d_functional.py,
#: hcom_send_recv.py, hcom_allgather.py, hcom_reducescatter.py; all_to_all_single through its decomposition to
#: HcomAllToAllV, or HcomAllToAll for even splits on CANN >= 8.2.RC1, whose lists are the same).
_IR_NODES: Final[Mapping[str, tuple[str, str, int | None]]] = {
    "_c10d_functional.all_reduce.default": ("HcomAllReduce", "input x", 0),
    "_c10d_functional.reduce_scatter_tensor.default": ("HcomReduceScatter", "input x", 0),
    "_c10d_functional.all_gather_into_tensor.default": ("HcomAllGather", "input x", 0),
    "_c10d_functional.broadcast.default": ("_HcomBroadcast", "input x", 0),
    "_c10d_functional.all_to_all_single.default": ("HcomAllToAllV", "input send_data", 0),
    "npu_define._send.default": ("HcomSend", "input x", 0),
    "npu_define._recv.default": ("HcomReceive", "output y", None),
    "npu_define.allgather_in_tensor_uneven.default": ("HcomAllGatherV", "input x", 0),
    "npu_define.reduce_scatter_tensor_uneven.default": ("HcomReduceScatterV", "input x", 0),
}
#: GE's dtype names (IR prototypes) -> torch's.
IR_DTYPE: Final[Mapping[str, torch.dtype]] = {
    "FLOAT": torch.float32, "FLOAT16": torch.float16, "BF16": torch.bfloat16, "BFLOAT16": torch.bfloat16,
    "FLOAT64": torch.float64, "DOUBLE": torch.float64, "INT8": torch.int8, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "UINT8": torch.uint8, "UINT16": torch.uint16,
    "UINT32": torch.uint32, "UINT64": torch.uint64, "BOOL": torch.bool, "FLOAT8_E5M2": torch.float8_e5m2,
    "FLOAT8_E4M3FN": torch.float8_e4m3fn,
}
#: The CANN release graph send/recv need (npu_fx_compiler.py ``_process_send_recv``).
GRAPH_P2P_CANN: Final = "8.6.0"
_P2P: Final = frozenset({"npu_define._send.default", "npu_define._recv.default"})


@final
@dataclass(frozen=True)
class Vocabulary:
    """TorchAir's converters at one commit, as ``_torchair_derive`` found them (see ``torchair_vocabulary.json``)."""

    #: ``repository``, ``commit``, ``commit_date``, ``path``.
    source: Mapping[str, str]
    #: Target name (``str(OpOverload)``, or a callable's dotted name) -> ``path:line`` of its real converter.
    converters: Mapping[str, str]
    #: Converters registered only under a condition (e.g. ``torch.__version__ >= '2.3.1'``).
    conditions: Mapping[str, str]
    #: Targets whose registered converter raises NotImplementedError.
    not_implemented: frozenset[str]
    #: Targets whose registered converter only raises another error: name -> its ``raise`` statement.
    stubs: Mapping[str, str]
    #: Targets TorchAir's default decompositions rewrite before conversion: name -> ``{"into", "at"}``.
    decompositions: Mapping[str, Mapping[str, str]]
    special_targets: frozenset[str]
    dont_empty_tensor_opt_ops: frozenset[str]
    #: TorchAir's ``ConverterErrorMsg`` texts, by constant name.
    errors: Mapping[str, str]
    #: ``normalize_reduceop_type``: accepted RedOpType member -> GE name.
    reduce_ops: Mapping[str, str]
    #: Source lines the check relies on: key -> ``{"at", "shows"}``.
    anchors: Mapping[str, Mapping[str, str]]
    #: IR dtype lists of the GE operators xccl's graphs lower to (TorchAir's bundled IR prototypes).
    ir_dtypes: Mapping[str, Any]
    counts: Mapping[str, int]

    @property
    def commit(self) -> str:
        """The TorchAir commit the vocabulary was derived from."""
        return self.source["commit"]

    def cite(self, key: str) -> str:
        """``Ascend/torchair@<commit> <path:line>`` of anchor ``key``."""
        return f"Ascend/torchair@{self.commit[:12]} {self.anchors[key]['at']}"

    def dtypes_of(self, op: str, io: str) -> frozenset[torch.dtype]:
        """The dtypes GE operator ``op``'s IR prototype lists for ``io`` (e.g. ``"input x"``), as torch dtypes."""
        return frozenset(IR_DTYPE[n] for n in self.ir_dtypes[op]["dtypes"][io] if n in IR_DTYPE)

    def cite_ir(self, op: str) -> str:
        """Where GE operator ``op``'s IR prototype is, as a citation."""
        return f"Ascend/torchair@{self.commit[:12]} {self.ir_dtypes[op]['at']}"

    def cite_converter(self, name: str) -> str:
        """Where ``name``'s converter is registered, as a citation."""
        return f"Ascend/torchair@{self.commit[:12]} {self.converters[name]}"

    def has_converter(self, name: str) -> bool:
        """Whether TorchAir converts ``name`` under the running torch (its registration's condition holds)."""
        if name not in self.converters:
            return False
        condition = self.conditions.get(name, "")
        prefix = "torch.__version__ >= "
        if condition.startswith(prefix):
            # TorchAir compares version strings as strings (c10d_functional.py); so does this.
            return bool(torch.__version__ >= condition[len(prefix):].strip("'\""))
        return True


@functools.cache
def vocabulary() -> Vocabulary:
    """The vocabulary shipped with the plugin, loaded on first use (it is ~150 kB of JSON)."""
    raw = json.loads(resources.files(__package__).joinpath(_RESOURCE).read_text(encoding="utf-8"))
    return Vocabulary(
        source=raw["source"],
        converters=raw["converters"],
        conditions=raw["conditions"],
        not_implemented=frozenset(raw["not_implemented"]),
        stubs=raw["stubs"],
        decompositions=raw["decompositions"],
        special_targets=frozenset(raw["special_targets"]),
        dont_empty_tensor_opt_ops=frozenset(raw["dont_empty_tensor_opt_ops"]),
        errors=raw["errors"],
        reduce_ops=raw["reduce_ops"],
        anchors=raw["anchors"],
        ir_dtypes=raw["ir_dtypes"],
        counts=raw["counts"],
    )


def target_name(target: Any) -> str:
    """The name TorchAir's registry knows ``target`` by: ``aten.add.Tensor`` for an op overload (``str``),
    ``higher_order.<name>`` for a higher-order operator, ``operator.add`` / ``math.floor`` / ``torch.sym_float``
    for a Python callable."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        name = target.name()
        return name if name == "auto_functionalized_v2" else f"higher_order.{name}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module == "math":
        return f"math.{name}"
    if getattr(torch, name, None) is target:
        return f"torch.{name}"
    return f"{module}.{name}" if module else name


def normalize_reduce_op(op: str) -> str:
    """TorchAir's ``normalize_reduceop_type``: the GE name of reduce op ``op``.

    Raises:
        ValueError: with TorchAir's text, for a RedOpType member GE lacks (``ge unsupported reduce type AVG``)
            or a string that names none (``Invalid reduce operation PROD``).
    """
    norm = op.upper()
    if norm not in dist.ReduceOp.RedOpType.__members__:
        raise ValueError(f"Invalid reduce operation {norm}")
    ge = vocabulary().reduce_ops.get(norm)
    if ge is None:
        raise ValueError(f"ge unsupported reduce type {norm}")
    return ge


def _is_builtin(target: Any) -> bool:
    from torch._dynamo.trace_rules import is_builtin_callable  # lazy: Dynamo; the same test TorchAir makes

    return bool(is_builtin_callable(target))


def _flat(value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        return [value]
    return [x for v in value for x in _flat(v)]


def _all_empty(node: torch.fx.Node) -> bool:
    """Whether every output of ``node`` is a zero-element tensor of static shape: TorchAir then makes the outputs
    itself, without a converter (``flatten_meta_outputs``, ``is_zero_element_tensor``, ``get_used_syms_in_meta``)."""
    return all(
        isinstance(v, torch.Tensor) and 0 in v.size() and not any(isinstance(s, torch.SymInt) for s in v.shape)
        for v in _flat(node.meta.get("val"))
    )


def _ge_name(name: str) -> str:
    """The AscendIR name TorchAir looks up for a custom op (``_get_converter_context``)."""
    target = name.split(".")[1]
    if target.split("_")[-1] == "functional":
        target = "_".join(target.split("_")[:-1])
    return "".join(word.capitalize() for word in target.split("_"))


def conversion_problem(target: Any, name: str) -> tuple[str, str] | None:
    """Why TorchAir cannot convert a call of ``target`` (known to its registry as ``name``): (TorchAir's error,
    the source it comes from), or None when it can."""
    v = vocabulary()
    if v.has_converter(name) or name in v.decompositions or name in v.special_targets:
        return None
    if name in v.converters:  # registered only from a later torch
        return (f"{name}'s converter is registered only when {v.conditions[name]} (torch {torch.__version__})",
                v.cite_converter(name))
    if name in v.not_implemented:
        return f"NotImplementedError: torch.ops.{name} ge_converter is not implemented!", v.cite("auto_generate")
    if name in v.stubs:
        return v.stubs[name].removeprefix("raise "), v.cite("auto_generate")
    if not isinstance(target, torch._ops.OpOverload):
        return v.errors["NOT_OP_OVERLOAD"].format(target=name), v.cite("not_op_overload")
    if any(s in str(target) for s in ("prim", "prims", "aten")) or _is_builtin(target):
        return v.errors["BUILTIN_OP"].format(target=name), v.cite("builtin_op")
    for arg in target._schema.arguments:
        if isinstance(arg.type, torch._C.NumberType):
            return v.errors["SCALAR_INPUT"].format(target=name, name=arg.name), v.cite("scalar_input")
    ge = _ge_name(name)
    return (v.errors["GE_IR_NOT_REGISTERED"].format(name=ge)
            + f" (TorchAir generates a converter only for a custom op whose CamelCase name, here {ge!r}, is an "
            "AscendIR CANN registers; the simulation assumes it is not)", v.cite("ge_ir_not_registered"))


def _semantic_problem(node: torch.fx.Node, name: str) -> tuple[str, str] | None:
    """What the converter of a convertible node would still refuse: an unsupported reduce op, a non-half MC2 call."""
    v = vocabulary()
    index = _REDUCE_ARG.get(name)
    if index is not None and len(node.args) > index and isinstance(node.args[index], str):
        try:
            normalize_reduce_op(node.args[index])
        except ValueError as exc:
            return f"ValueError: {exc}", v.cite("normalize_reduceop_type")
    if name in _MC2:
        a = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if isinstance(a, torch.Tensor) and a.dtype not in _HALF:
            return (f"AssertionError: Input supported dtype is fp16/bf16, but got type {a.dtype}.",
                    v.cite("mc2_dtype_check"))
    return None


def _ge_problem(node: torch.fx.Node, name: str, cann: str | None) -> tuple[str, str] | None:
    """What GE would refuse in the HCCL operator a converted collective becomes: a dtype its IR prototype does not
    list, or send/receive below CANN 8.6.0."""
    ir = _IR_NODES.get(name)
    if ir is None:
        return None
    op, io, index = ir
    v = vocabulary()
    if name in _P2P and cann is not None and version_below(cann, GRAPH_P2P_CANN):
        return ("torch.distributed.send and torch.distributed.recv are not supported in graph, you need upgrade cann "
                f"version. (CANN {cann} is installed; TorchAir only logs this, GE then cannot run {op})",
                v.cite("send_recv_cann_version"))
    holder = node.args[index] if index is not None else node
    value = holder.meta.get("val") if isinstance(holder, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    allowed = v.dtypes_of(op, io)
    if value.dtype in allowed:
        return None
    ge: dict[torch.dtype, str] = {}
    for n, d in IR_DTYPE.items():
        ge.setdefault(d, n)  # GE's own name first (DT_BF16, not the DT_BFLOAT16 alias)
    listed = ", ".join(f"DT_{n}" for n in v.ir_dtypes[op]["dtypes"][io])
    return (f"GE refuses {op}: its IR prototype lists no DT_{ge.get(value.dtype, value.dtype)} for {io} (it has "
            f"{listed}); TorchAir's converter passes the dtype through unchecked, and GE refuses the graph when it "
            "compiles it", v.cite_ir(op))


def graph_problems(gm: torch.fx.GraphModule, *, phase: str, aliases: Mapping[str, str] | None = None,
                   cann: str | None = None, registered: Mapping[str, Callable[..., Any]] | None = None
                   ) -> list[tuple[torch.fx.Node, str, BaseException]]:
    """Every node of ``gm`` TorchAir's conversion (or GE's compilation) would fail on, in graph order: the node,
    its target's name and the error :func:`check_graph` raises for it (a registered converter's own error
    included). Arguments as :func:`check_graph`'s."""
    aliases = aliases or {}
    registered = registered or {}
    found: list[tuple[torch.fx.Node, str, BaseException]] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            problem: tuple[str, str] | None = (vocabulary().errors["NOT_OP_OVERLOAD"].format(target=node.target),
                                               vocabulary().cite("not_op_overload"))
            name = str(node.target)
        elif _is_builtin(node.target) and node.target not in _BINARY:
            continue
        else:
            name = target_name(node.target)
            name = aliases.get(name, name)
            if _all_empty(node) and name not in vocabulary().dont_empty_tensor_opt_ops:
                continue
            if name in registered:
                try:
                    registered[name](*node.args, **node.kwargs)
                except Exception as exc:  # TorchAir fails the compilation with it, as is
                    found.append((node, name, exc))
                continue
            problem = (conversion_problem(node.target, name) or _semantic_problem(node, name)
                       or _ge_problem(node, name, cann))
        if problem is not None:
            text, where = problem
            found.append((node, name, UnsupportedCollective(
                name, BACKEND,
                f"TorchAir cannot convert node {node.name!r} of the {phase} graph ({node.format_node()}): {text} "
                f"[simulated TorchAir conversion check; {where}]",
            )))
    return found


def check_graph(gm: torch.fx.GraphModule, *, phase: str, aliases: Mapping[str, str] | None = None,
                cann: str | None = None, registered: Mapping[str, Callable[..., Any]] | None = None) -> None:
    """Fail, as TorchAir's conversion (and GE's compilation) would, on the first node of ``gm`` it cannot convert.

    Args:
        gm: a graph after AOTAutograd (what TorchAir's compiler receives).
        phase: ``"forward"``, ``"backward"`` or ``"inference"``, for the message.
        aliases: target names that stand for TorchAir's (the simulation's stand-ins for ``npu_define`` and
            ``npu`` ops, by their real names).
        cann: the CANN version installed (None: unknown, not checked).
        registered: converters registered at run time, by target name: called with the node's arguments, as
            TorchAir calls a converter (one that raises fails the compilation with its error).

    Raises:
        UnsupportedCollective: naming the node, the error text and where it comes from (or a registered
            converter's own error).
    """
    problems = graph_problems(gm, phase=phase, aliases=aliases, cann=cann, registered=registered)
    if problems:
        raise problems[0][2]


def communication(gm: torch.fx.GraphModule, aliases: Mapping[str, str] | None = None) -> list[str]:
    """The communication ops of ``gm`` in graph order, by TorchAir's names (the HCCL and MC2 operators, the
    functional collectives and xccl's own ops; ``wait_tensor`` is a wait, not communication)."""
    aliases = aliases or {}
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = target_name(node.target)
        name = aliases.get(name, name)
        if (name in _IR_NODES or name in _MC2 or name.startswith(("xccl.", "_c10d_functional.", "c10d_functional."))
                ) and ".wait_tensor." not in name:
            out.append(name)
    return out
