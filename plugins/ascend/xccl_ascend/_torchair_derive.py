"""Derive ``torchair_vocabulary.json`` from a checkout of TorchAir's source (Ascend/torchair).

Run it when the pinned TorchAir commit changes::

    git -C torchair checkout <commit>
    python -m xccl_ascend._torchair_derive torchair > plugins/ascend/xccl_ascend/torchair_vocabulary.json

What it reads (paths relative to the checkout, everything under ``python/torchair``):

* every ``@register_fx_node_ge_converter(X)`` decorator and ``register_fx_node_ge_converter(X)(fn)`` call, parsed
  with :mod:`ast` (``fx2ge_converter.py`` itself is skipped: it defines the registry and code templates). A
  converter whose body, docstring removed, is a single ``raise NotImplementedError(...)`` is *not implemented*;
  one whose body is a single other ``raise`` is a *stub* (``"... ge_converter is not supported!"`` and the like);
  every other one is a real converter, flagged *partial* when it raises NotImplementedError on some path. This is
  how TorchAir's own ``fx_summary.py`` tells them apart (it looks for ``raise NotImplementedError`` in the source);
* the error texts of ``_utils/error_messages.py`` (the class is plain string constants, executed on its own);
* anchors the conversion check relies on (default decompositions, special-cased targets, the empty-tensor
  shortcut, ``normalize_reduceop_type``, the topology-sorting option), each located by a text search so that a
  moved line is found again and a vanished one fails the derivation instead of going stale;
* the dtype lists of the GE operators xccl's graphs lower to, from the IR prototypes TorchAir bundles
  (``auto_generated_ge_raw_ops.py``, generated from CANN's ``all_ops.h``).

The output is deterministic (sorted keys), so a diff of the JSON shows what a new TorchAir commit changed.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["derive", "main"]

PKG: Final = "python/torchair"
REGISTRY: Final = f"{PKG}/_ge_concrete_graph/fx2ge_converter.py"
_OP: Final = re.compile(r"torch\.ops\.(\w+)\.(\w+)(?:\.(\w+))?")

#: Text anchors: (key, file, a line's text to find, what it shows); the first line containing the text is cited.
ANCHORS: Final[Sequence[tuple[str, str, str, str]]] = (
    ("register_fx_node_ge_converter", REGISTRY, "def register_fx_node_ge_converter(aten_op):",
     "the registry; Converter.__call__ stores the converter as the op's _ge_converter attribute"),
    ("converter_stored_on_op", REGISTRY, "self._aten_op._ge_converter = wrapped_converter",
     "a converter belongs to the exact object registered (an OpOverload, or a packet for packet targets)"),
    ("auto_generate", REGISTRY, "def get_or_auto_gen_converter(target):",
     "no converter: TorchAir tries to generate one, which fails for the cases below"),
    ("not_op_overload", REGISTRY, "raise RuntimeError(ConverterErrorMsg.NOT_OP_OVERLOAD.format(target=target))",
     "a target that is not an OpOverload"),
    ("builtin_op", REGISTRY, "raise RuntimeError(ConverterErrorMsg.BUILTIN_OP.format(target=target))",
     "an aten/prim/prims op or a Python builtin"),
    ("scalar_input", REGISTRY, "raise RuntimeError(ConverterErrorMsg.SCALAR_INPUT.format(target=target, name=arg.name))",
     "a custom op with a Scalar argument"),
    ("ge_ir_not_registered", REGISTRY, "raise RuntimeError(ConverterErrorMsg.GE_IR_NOT_REGISTERED.format(name=ge_name))",
     "a custom op whose CamelCase name is no AscendIR registered in CANN"),
    ("ge_name", REGISTRY, 'ge_name = "".join(word.capitalize() for word in target_name.split("_"))',
     "how the AscendIR name of a custom op is formed"),
    ("special_targets", REGISTRY, "if str(target) in ['air.scope_enter.default', 'air.scope_exit.default']:",
     "targets parse_node handles itself (scope markers, record/wait control edges, auto_functionalized_v2)"),
    ("empty_tensor_shortcut", REGISTRY, "if all_zero_and_nosym and (str(target) not in _DONT_EMPTY_TENSOR_OPT_OPS):",
     "a node whose outputs are all empty is replaced by empty tensors without a converter"),
    ("builtin_passthrough", f"{PKG}/npu_fx_compiler.py",
     "if is_builtin_callable(target) and not _is_binary_operator(target):",
     "Python builtins other than the binary operators run as Python, not through a converter"),
    ("default_decompositions", f"{PKG}/_utils/__init__.py", "def get_npu_default_decompositions():",
     "decompositions TorchAir's AOTAutograd applies before conversion"),
    ("all_to_all_single_decomposition", f"{PKG}/_utils/__init__.py",
     "{torch.ops._c10d_functional.all_to_all_single.default: decomp_c10d_functional_all_to_all_single})",
     "_c10d_functional.all_to_all_single becomes npu_define.all_to_all_single_npu"),
    ("allgather_decomposition", f"{PKG}/_utils/__init__.py",
     "default_decompositions.update({torch.ops.npu_define.allgather.default: allgather_decomposition})",
     "npu_define.allgather becomes allgather_in_tensor (or broadcasts)"),
    ("c10d_functional_version_gate", f"{PKG}/_ge_concrete_graph/ge_converter/c10d_functional/c10d_functional.py",
     "if torch.__version__ >= '2.3.1':", "the _c10d_functional converters exist only on torch >= 2.3.1"),
    ("normalize_reduceop_type", f"{PKG}/_ge_concrete_graph/utils.py", "def normalize_reduceop_type(op):",
     "graph reduce ops: SUM, MIN, MAX, PRODUCT; any other RedOpType raises 'ge unsupported reduce type'"),
    ("topology_sorting_strategy", f"{PKG}/configs/experimental_config.py",
     'self.topology_sorting_strategy = OptionValue("DFS", ["BFS", "DFS", "RDFS", "StableRDFS"])',
     "CompilerConfig().experimental_config.topology_sorting_strategy (GE option ge.topoSortingMode)"),
    ("send_recv_forces_stable_rdfs", f"{PKG}/npu_fx_compiler.py",
     'compiler_config.experimental_config.topology_sorting_strategy = "StableRDFS"',
     "more than one npu_define._send/_recv in a max-autotune graph forces StableRDFS"),
    ("send_recv_cann_version", f"{PKG}/npu_fx_compiler.py",
     'is_supported_version = _is_gte_cann_version("8.6.0", module="CANN")',
     "send/recv in a graph need CANN 8.6.0 (older only logs an error)"),
    ("custom_decompositions", f"{PKG}/npu_fx_compiler.py",
     "def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: Dict = {}):",
     "get_npu_backend merges custom_decompositions into TorchAir's own"),
    ("send_schema", f"{PKG}/_ge_concrete_graph/ge_converter/experimental/hcom_send_recv.py",
     '"_send(Tensor input_tensor, int? dst, int[] ranks, str pg_tag,"', "npu_define._send"),
    ("recv_schema", f"{PKG}/_ge_concrete_graph/ge_converter/experimental/hcom_send_recv.py",
     '"_recv(Tensor out_tensor, int? src, int[] ranks, str pg_tag,"', "npu_define._recv"),
    ("allgather_uneven_schema", f"{PKG}/_ge_concrete_graph/ge_converter/experimental/hcom_allgather.py",
     '"allgather_in_tensor_uneven(Tensor input_tensor, SymInt send_count, SymInt[] recv_counts, \\',
     "npu_define.allgather_in_tensor_uneven"),
    ("allgather_uneven_rows", f"{PKG}/_ge_concrete_graph/ge_converter/experimental/hcom_allgather.py",
     "npu_output = torch.ops.npu_define.allgather_in_tensor_uneven(input, send_count=input.size(0),",
     "TorchAir counts rows (dim 0) and passes no displacements"),
    ("reduce_scatter_uneven_schema", f"{PKG}/_ge_concrete_graph/ge_converter/experimental/hcom_reducescatter.py",
     '"reduce_scatter_tensor_uneven(Tensor input_tensor, SymInt[] send_counts, SymInt recv_count, \\',
     "npu_define.reduce_scatter_tensor_uneven"),
    ("mm_reduce_scatter_schema", f"{PKG}/_ge_concrete_graph/ge_converter/custom/matmul_reduce_scatter.py",
     "'''NB: npu::npu_mm_reduce_scatter_base(Tensor self, Tensor x2, str hcom,", "npu.npu_mm_reduce_scatter_base"),
    ("all_gather_mm_schema", f"{PKG}/_ge_concrete_graph/ge_converter/custom/all_gather_matmul.py",
     "'''NB: npu::npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *,",
     "npu.npu_all_gather_base_mm"),
    ("mm_all_reduce_schema", f"{PKG}/_ge_concrete_graph/ge_converter/custom/matmul_all_reduce.py",
     "'''NB: npu::npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None,",
     "npu.npu_mm_all_reduce_base"),
    ("mc2_dtype_check", f"{PKG}/_ge_concrete_graph/ge_converter/custom/matmul_reduce_scatter.py",
     "raise AssertionError(f\"Input supported dtype is fp16/bf16, but got type {x1.dtype}.\")",
     "TorchAir's MC2 converters refuse anything but float16/bfloat16"),
)

#: Decompositions TorchAir applies before conversion: op -> (what it becomes, anchor key).
DECOMPOSITIONS: Final = {
    "_c10d_functional.all_to_all_single.default": ("npu_define.all_to_all_single_npu.default",
                                                   "all_to_all_single_decomposition"),
    "npu_define.allgather.default": ("npu_define.allgather_in_tensor.default", "allgather_decomposition"),
}
#: Targets ``parse_node`` handles without a converter (fx2ge_converter.py, ``_parse_node_internal``).
SPECIAL_TARGETS: Final = (
    "air.scope_enter.default", "air.scope_exit.default", "air.record.default", "air.wait.default",
    "auto_functionalized_v2",
)
#: GE operators whose IR dtype lists the vocabulary records (what xccl's graphs lower to on Ascend).
IR_OPS: Final = (
    "HcomAllReduce", "HcomAllGather", "HcomReduceScatter", "_HcomBroadcast", "HcomAllToAll", "HcomAllToAllV", "HcomSend",
    "HcomReceive", "HcomAllGatherV", "HcomReduceScatterV", "MatmulReduceScatter", "AllGatherMatmul",
    "MatmulAllReduce", "Identity",
)


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


#: Registered Python callables written under another name in the source.
_CALLABLES: Final = {"sym_sqrt": "torch.sym_sqrt"}  # aten/symbolic_shapes.py: ``from torch import sym_sqrt``


def _op_name(expr: str) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``aten.add.Tensor`` (as ``str(OpOverload)`` prints it); a Python
    callable keeps its dotted name (``operator.add``, ``torch.sym_float``)."""
    m = _OP.fullmatch(expr.strip())
    return ".".join(g for g in m.groups() if g) if m else _CALLABLES.get(expr.strip(), expr.strip())


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Pass)]


def _raised(node: ast.stmt) -> str | None:
    if not isinstance(node, ast.Raise) or node.exc is None:
        return None
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else type(exc).__name__


def _classify(fn: ast.FunctionDef, source: str) -> tuple[str, str]:
    """(``converter`` | ``partial`` | ``not_implemented`` | ``stub``, the stub's raise statement)."""
    body = _body(fn)
    if len(body) == 1 and _raised(body[0]) is not None:
        kind = "not_implemented" if _raised(body[0]) == "NotImplementedError" else "stub"
        return kind, ast.get_source_segment(source, body[0]) or ""
    partial = any(_raised(n) == "NotImplementedError" for n in ast.walk(fn) if isinstance(n, ast.stmt))
    return ("partial" if partial else "converter"), ""


def _is_register(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "register_fx_node_ge_converter") or (
        isinstance(func, ast.Attribute) and func.attr == "register_fx_node_ge_converter")


def _conditions(tree: ast.Module, source: str) -> dict[ast.AST, str]:
    """Each node -> the ``if`` tests enclosing it (registrations that depend on torch's version and the like)."""
    out: dict[ast.AST, str] = {}

    def walk(node: ast.AST, tests: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = tests
            if isinstance(node, ast.If) and child in node.body:
                inner = (*tests, ast.get_source_segment(source, node.test) or "")
            if inner:
                out[child] = " and ".join(inner)
            walk(child, inner)

    walk(tree, ())
    return out


def registrations(root: Path) -> Iterator[dict[str, Any]]:
    """Every converter registration under ``python/torchair``, in file order."""
    for path in sorted((root / PKG).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == REGISTRY:
            continue
        source = path.read_text(encoding="utf-8")
        if "register_fx_node_ge_converter" not in source:
            continue
        tree = ast.parse(source)
        conds = _conditions(tree, source)
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for deco in node.decorator_list:
                    if _is_register(deco) and isinstance(deco, ast.Call):
                        yield _entry(deco, node, rel, source, conds.get(node, ""))
            elif isinstance(node, ast.Call) and _is_register(node.func) and isinstance(node.func, ast.Call) \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in functions:
                yield _entry(node.func, functions[node.args[0].id], rel, source, conds.get(node, ""))


def _entry(call: ast.Call, fn: ast.FunctionDef, rel: str, source: str, condition: str) -> dict[str, Any]:
    kind, raised = _classify(fn, source)
    return {"op": _op_name(ast.get_source_segment(source, call.args[0]) or ""), "at": f"{rel}:{call.lineno}",
            "kind": kind, "raise": raised, "condition": condition}


def _find(root: Path, rel: str, text: str) -> int:
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if text in line]
    if not hits:
        raise SystemExit(f"anchor {text!r} is not in {rel} any more; update ANCHORS in {__name__}")
    return hits[0]  # the first occurrence: where parse_node checks it before dispatching


def _error_texts(root: Path) -> dict[str, str]:
    """The string constants of TorchAir's ``ConverterErrorMsg`` (a class of plain strings)."""
    namespace: dict[str, Any] = {}
    exec(compile((root / PKG / "_utils/error_messages.py").read_text(encoding="utf-8"), "error_messages", "exec"),
         namespace)
    cls = namespace["ConverterErrorMsg"]
    return {k: v for k, v in vars(cls).items() if k.isupper() and not k.startswith("_") and isinstance(v, str)}


def _ir_dtypes(root: Path) -> dict[str, dict[str, Any]]:
    rel = f"{PKG}/_ge_concrete_graph/auto_generated_ge_raw_ops.py"
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    out: dict[str, dict[str, Any]] = {}
    for op in IR_OPS:
        starts = [i for i, line in enumerate(lines) if re.match(rf"def {op}\(", line)]
        if not starts:
            continue
        start = starts[0]
        io: dict[str, list[str]] = {}
        for line in lines[start : start + 40]:
            m = re.search(r"\.(?:DYNAMIC_|OPTIONAL_)?(INPUT|OUTPUT)\((\w+), TensorType\(\{([^}]*)\}", line)
            if m:
                io[f"{m.group(1).lower()} {m.group(2)}"] = [t.strip().removeprefix("DT_") for t in m.group(3).split(",")]
            if line.startswith('"""') and io:
                break
        out[op] = {"at": f"{rel}:{start + 1}", "dtypes": io}
    return out


def derive(root: Path, commit: str = "", date: str = "") -> dict[str, Any]:
    """The vocabulary of the TorchAir checkout at ``root``."""
    commit = commit or _git(root, "rev-parse", "HEAD")
    date = date or _git(root, "show", "-s", "--format=%cI", commit or "HEAD")
    regs = list(registrations(root))
    converters: dict[str, str] = {}
    partial: list[str] = []
    conditions: dict[str, str] = {}
    not_implemented: dict[str, str] = {}
    stubs: dict[str, str] = {}
    for r in regs:
        if r["kind"] in ("converter", "partial"):
            converters.setdefault(r["op"], r["at"])
            if r["kind"] == "partial":
                partial.append(r["op"])
            if r["condition"]:
                conditions[r["op"]] = r["condition"]
        elif r["kind"] == "not_implemented":
            not_implemented.setdefault(r["op"], r["at"])
        else:
            stubs.setdefault(r["op"], r["raise"])
    anchors = {key: {"at": f"{rel}:{_find(root, rel, text)}", "shows": shows} for key, rel, text, shows in ANCHORS}
    return {
        "source": {"repository": "https://github.com/Ascend/torchair", "commit": commit, "commit_date": date,
                   "path": PKG},
        "derivation": (
            "python -m xccl_ascend._torchair_derive <checkout>: an ast scan of every register_fx_node_ge_converter registration "
            f"under {PKG} ({REGISTRY} excluded). Real converters are kept; a body that is a single raise "
            "NotImplementedError is not_implemented, a single other raise is a stub (both fail when called). Anchors "
            "are located by text search."
        ),
        "counts": {"registrations": len(regs), "converters": len(converters), "partial": len(set(partial)),
                   "not_implemented": len(not_implemented), "stubs": len(stubs)},
        "anchors": anchors,
        "converters": dict(sorted(converters.items())),
        "partial": sorted(set(partial)),
        "conditions": dict(sorted(conditions.items())),
        "not_implemented": sorted(not_implemented),
        "stubs": dict(sorted(stubs.items())),
        "decompositions": {op: {"into": into, "at": anchors[key]["at"]} for op, (into, key) in DECOMPOSITIONS.items()},
        "special_targets": list(SPECIAL_TARGETS),
        "dont_empty_tensor_opt_ops": _dont_empty(root),
        "errors": _error_texts(root),
        "reduce_ops": {"SUM": "sum", "MIN": "min", "MAX": "max", "PRODUCT": "prod"},
        "ir_dtypes": _ir_dtypes(root),
    }


def _dont_empty(root: Path) -> list[str]:
    source = (root / REGISTRY).read_text(encoding="utf-8")
    m = re.search(r"_DONT_EMPTY_TENSOR_OPT_OPS = \{([^}]*)\}", source)
    if m is None:
        raise SystemExit(f"_DONT_EMPTY_TENSOR_OPT_OPS not found in {REGISTRY}")
    return sorted(re.findall(r"'([^']+)'", m.group(1)))


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Command line: derive the vocabulary of a checkout and print it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("checkout", type=Path, help="a checkout of https://github.com/Ascend/torchair")
    parser.add_argument("--commit", default="", help="the commit (default: git rev-parse HEAD in the checkout)")
    parser.add_argument("--date", default="", help="its commit date (default: from git)")
    args = parser.parse_args(argv)
    vocab = derive(args.checkout, args.commit, args.date)
    json.dump(vocab, out or sys.stdout, indent=1, sort_keys=False, ensure_ascii=False)
    (out or sys.stdout).write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
