"""Every torch_npu / TorchAir attribute the plugin uses is documented in section A of the vendor API manifest.

The plugin's source is parsed (not imported: torch_npu is not installed here) and every attribute chain rooted at
``torch_npu`` or ``torchair``, every method called on the ProcessGroupHCCL backend (``_hccl_backend(group)``),
every attribute set on an object a torch_npu call returned, and every keyword argument passed to a torch_npu
function is looked up in the manifest's code spans. A symbol is documented when its full dotted path appears there,
or when its last name does and its parent is documented; a keyword must appear in a signature of that function.

The copy of section A must stay identical to the shared manifest. A symbol the plugin needs that the manifest lacks
goes into ``data/manifest_addendum_a.md`` instead, with the upstream file, line and commit it was checked against.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "xccl_ascend"
COPY = Path(__file__).resolve().parent / "data" / "manifest_section_a.md"
#: What we verified upstream ourselves and the shared manifest lacks; it is never compared with the shared file.
ADDENDUM = Path(__file__).resolve().parent / "data" / "manifest_addendum_a.md"
SHARED = Path(__file__).resolve().parents[4] / "shared" / "vendor-api" / "MANIFEST.md"
ROOTS = ("torch_npu", "torchair")
HCCL_CLASS = "torch_npu._C._distributed_c10d.ProcessGroupHCCL"


def section_a() -> str:
    text = COPY.read_text(encoding="utf-8")
    return text[text.index("## A. Huawei Ascend"):]


def addendum() -> str:
    return ADDENDUM.read_text(encoding="utf-8")


def code_spans(text: str) -> list[str]:
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return fenced + inline


SPANS = code_spans(section_a()) + code_spans(addendum())
CODE = "\n".join(SPANS)
WORDS = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", CODE))


def documented(symbol: str) -> bool:
    if symbol in ROOTS or symbol in CODE:
        return True
    parent, _, leaf = symbol.rpartition(".")
    return bool(parent) and leaf in WORDS and documented(parent)


def keyword_documented(function: str, keyword: str) -> bool:
    leaf = function.rpartition(".")[2]
    return any(f"{leaf}(" in span and re.search(rf"\b{keyword}\s*[:=]", span) for span in SPANS)


class Uses(ast.NodeVisitor):
    """Collects symbols and (function, keyword) pairs from one module."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.returned: dict[str, str] = {}
        self.symbols: set[str] = set()
        self.keywords: set[tuple[str, str]] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                top = alias.name.split(".")[0]
                self.aliases[alias.asname or top] = alias.name if alias.asname else top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] in ROOTS:
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id) or self.returned.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_hccl_backend":
            return HCCL_CLASS
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self.dotted(node)
        if path:
            self.symbols.add(path)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        path = self.dotted(node.func)
        if path:
            for kw in node.keywords:
                if kw.arg:
                    self.keywords.add((path, kw.arg))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call):
            path = self.dotted(node.value.func)
            if path:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.returned[target.id] = path
        self.generic_visit(node)


def collect() -> Uses:
    uses = Uses()
    for source in sorted(PACKAGE.glob("*.py")):
        uses.visit(ast.parse(source.read_text(encoding="utf-8"), filename=str(source)))
    return uses


USES = collect()


def test_scan_finds_the_sdk_calls() -> None:
    """Guard against a scan that finds nothing and so passes vacuously."""
    expected = {
        "torch_npu.npu.set_device", "torch_npu.npu.device_count", "torch_npu.npu.get_device_name",
        "torch_npu.distributed.all_gather_into_tensor_uneven", "torch_npu.distributed.reduce_scatter_tensor_uneven",
        "torch_npu.distributed.all_to_all_vc", "torch_npu.npu_mm_reduce_scatter_base",
        "torch_npu.npu_all_gather_base_mm", "torch_npu.npu_mm_all_reduce_base",
        f"{HCCL_CLASS}.Options", f"{HCCL_CLASS}.Options.hccl_config", f"{HCCL_CLASS}.get_hccl_comm_name",
        "torchair.get_npu_backend", "torchair.CompilerConfig",
    }
    assert expected <= USES.symbols, expected - USES.symbols
    assert ("torch_npu.npu_all_gather_base_mm", "gather_output") in USES.keywords


@pytest.mark.parametrize("symbol", sorted(USES.symbols))
def test_symbol_is_in_manifest(symbol: str) -> None:
    assert documented(symbol), f"{symbol} is used by xccl_ascend but not documented in manifest section A"


@pytest.mark.parametrize(("function", "keyword"), sorted(USES.keywords), ids=lambda x: str(x))
def test_keyword_is_in_manifest(function: str, keyword: str) -> None:
    assert keyword_documented(function, keyword), f"{function}({keyword}=...) is not in a manifest signature"


def test_undocumented_symbols_are_caught() -> None:
    assert not documented("torch_npu.npu.set_device_by_magic")
    assert not documented(f"{HCCL_CLASS}.get_hccl_comm_handle_v2")
    assert not keyword_documented("torch_npu.npu_mm_reduce_scatter_base", "gather_output")


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared manifest is not beside this checkout")
def test_copy_matches_shared_manifest() -> None:
    shared = SHARED.read_text(encoding="utf-8")
    expected = shared[shared.index("## A. Huawei Ascend"):shared.index("## B. Sophgo")].rstrip() + "\n"
    assert section_a() == expected, "tests/data/manifest_section_a.md is stale: copy section A again"


def addendum_entries() -> list[str]:
    """The addendum's symbol entries (a ``  - `` line and its indented continuation lines), each as one string."""
    entries: list[str] = []
    for line in addendum().splitlines():
        if line.startswith("  - "):
            entries.append(line)
        elif entries and line.startswith("    "):
            entries[-1] += " " + line.strip()
    return entries


def test_addendum_entries_cite_upstream_and_are_not_in_the_manifest() -> None:
    """Each addendum entry names its upstream commit, and none repeats what section A already documents."""
    entries = addendum_entries()
    assert entries, "the addendum lists no symbol"
    section = "\n".join(code_spans(section_a()))
    for entry in entries:
        assert re.search(r"\[Ascend/[\w-]+ [0-9a-f]{8,40}\]", entry), f"no upstream source: {entry}"
        name = re.match(r"  - `\.?([\w.]+)`", entry)
        assert name, f"an entry starts with its symbol in backticks: {entry}"
        assert name.group(1) not in section, f"{name.group(1)} is in section A already: drop it from the addendum"
