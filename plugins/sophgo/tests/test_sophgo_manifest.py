"""Every torch_tpu symbol the plugin uses is in manifest section B (Sophgo's source, read at fe9b478).

The plugin's source is parsed, not imported (there is no torch_tpu here): every expression rooted at a name
bound to ``torch_tpu`` (``torch_tpu.tpu.set_device``, ``getattr(torch_tpu, "ProcessGroupSCCLOptions")``) must
name an API the manifest lists, so the real path cannot call one that does not exist. A name that escapes the
check (passed around, stored) fails the test, as does a torch_tpu import outside the SDK boundary module.

``data/manifest_B.md`` is a verbatim copy of section B of ``shared/vendor-api/MANIFEST.md``; when the shared file
is next to the repository, the copy is compared with it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import xccl_sophgo
from xccl_sophgo._simulation import NATIVE_OPS

PACKAGE = Path(xccl_sophgo.__file__).parent
COPY = Path(__file__).parent / "data" / "manifest_B.md"
SHARED = Path(__file__).resolve().parents[4] / "shared" / "vendor-api" / "MANIFEST.md"
SDK = "torch_tpu"
#: Module attributes every Python module has; not part of any vendor API.
MODULE_DUNDERS = frozenset({"__file__", "__name__", "__version__", "__path__"})


def manifest() -> str:
    return COPY.read_text(encoding="utf-8")


def documented() -> set[str]:
    """Every ``torch_tpu.a.b`` chain in section B from B1 on (B0 is Google's package), with all its prefixes."""
    sophgo = manifest().split("### B1.", 1)[1]
    chains = set(re.findall(r"\btorch_tpu(?:\.\w+)+", sophgo))
    return {".".join(c.split(".")[:i]) for c in chains for i in range(1, c.count(".") + 2)}


def option_fields() -> set[str]:
    """``ProcessGroupSCCLOptions`` fields, from the manifest's "Fields:" line."""
    line = next(ln for ln in manifest().splitlines() if "Fields:" in ln and "chip_map" in ln)
    return set(re.findall(r"`(\w+)(?::[^`]*)?`", line))


class Uses(ast.NodeVisitor):
    """torch_tpu chains used in one module, and uses of a torch_tpu name the chains do not cover."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        #: Names bound by ``from torch_tpu... import name``: calling one is a use of its chain.
        self.imported: set[str] = set()
        self.imports: list[int] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == SDK:
                        self.aliases[a.asname or SDK] = a.name if a.asname else SDK
                        self.imports.append(node.lineno)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == SDK and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    self.imported.add(a.asname or a.name)
                self.imports.append(node.lineno)
        self.chains: set[str] = set()
        self.covered: set[int] = set()
        self.escapes: list[int] = []
        self.visit(tree)

    def _chain(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.aliases:
            self.covered.add(id(node))
            return self.aliases[node.id]
        if isinstance(node, ast.Attribute):
            inner = self._chain(node.value)
            return None if inner is None else f"{inner}.{node.attr}"
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = self._chain(node)
        if chain is not None:
            self.chains.add(chain)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in self.imported:
            self.covered.add(id(fn))
            self.chains.add(self.aliases[fn.id])
        if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr") and len(node.args) >= 2:
            base, name = self._chain(node.args[0]), node.args[1]
            if base is not None:
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    self.escapes.append(node.lineno)  # a computed attribute name cannot be checked
                else:
                    self.chains.add(f"{base}.{name.value}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases and id(node) not in self.covered:
            self.escapes.append(node.lineno)


def plugin_sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(PACKAGE.glob("*.py"))}


def test_copy_matches_the_shared_manifest() -> None:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is not next to this checkout")
    text = SHARED.read_text(encoding="utf-8")
    start = text.index("## B. Sophgo")
    assert text[start:text.index("\n---\n", start)].rstrip("\n") + "\n" == manifest()


def test_every_torch_tpu_attribute_is_in_the_manifest() -> None:
    known = documented()
    used: dict[str, str] = {}
    for name, tree in plugin_sources().items():
        uses = Uses(tree)
        assert not uses.escapes, f"{name}: torch_tpu used at lines {uses.escapes} outside a literal chain"
        for chain in uses.chains:
            used[chain] = name
    # The check must see the real path's calls, or it proves nothing.
    assert {"torch_tpu.tpu.set_device", "torch_tpu.tpu.current_device", "torch_tpu.tpu.device_count",
            "torch_tpu.ProcessGroupSCCLOptions"} <= set(used)
    missing = {c: f for c, f in used.items() if c not in known and c.rsplit(".", 1)[-1] not in MODULE_DUNDERS}
    assert not missing, f"torch_tpu APIs not in manifest section B: {missing}"


def test_only_the_sdk_module_imports_torch_tpu_and_only_lazily() -> None:
    sources = plugin_sources()
    importers = {name for name, tree in sources.items() if Uses(tree).imports}
    assert importers == {"_torch_tpu.py"}
    # The boundary module itself is imported only inside a function (the runtime's loader), never at import time
    # of the plugin (the probe must not load the SDK).
    for name, tree in sources.items():
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                assert node.module != "_torch_tpu", f"{name} imports the SDK module at module level"


def test_options_fields_written_are_documented() -> None:
    tree = plugin_sources()["_torch_tpu.py"]
    written = {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self")}
    assert written == {"chip_map"}
    assert written <= option_fields() == {"chip_map", "timeout"}


def test_environment_written_is_what_torch_tpu_reads() -> None:
    env_line = manifest().split("Environment variables read:")[1].split("###")[0]
    written = set()
    for tree in plugin_sources().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"
                            and isinstance(t.slice, ast.Constant)):
                        written.add(str(t.slice.value))
    assert written == {"CHIP_MAP"}
    assert all(f"`{v}`" in env_line for v in written)


def test_simulated_refusals_quote_the_manifest() -> None:
    for method, message in NATIVE_OPS.items():
        if message is not None:
            assert f'"{message}"' in manifest(), method
