"""``xccl new-plugin``'s generator: a vendor plugin distribution, named for the vendor, that passes the kit.

The files are the templates under ``xccl/tools/scaffold/`` (package data), with ``{{token}}`` placeholders filled
from :class:`Names`. Two choices of the vendor's shape are sections: lines between ``{{#flag}}`` and ``{{/flag}}``
(each tag on a line of its own) are kept when the flag is set, between ``{{^flag}}`` and ``{{/flag}}`` when it is
not (:attr:`Names.bridge_picks_device`, :attr:`Names.rank_table`); a file of one option alone (the rank-table
format and its tests) is written only with it. ``examples/plugin-template`` is this generator's output for the name ``template``
(``tests/test_new_plugin.py`` keeps the two equal), so the template users read and the scaffold they run are one.
"""

from __future__ import annotations

import keyword
import re
import shlex
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["Names", "names", "render", "write"]

#: torch.distributed backend names torch or its tests own: a plugin's backend must be another.
_RESERVED: Final = frozenset({"undefined", "gloo", "nccl", "ucc", "mpi", "xccl", "fake", "threaded"})
_NAME: Final = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
_IDENT: Final = re.compile(r"[a-z][a-z0-9_]*")
#: Templates written only when their option is chosen: template path -> the :class:`Names` flag.
_ONLY_WITH: Final = {"pkg/_ranktable.py": "rank_table", "tests/test_ranktable.py": "rank_table"}
#: A section: ``{{#flag}}`` (kept when set) or ``{{^flag}}`` (kept when not), to ``{{/flag}}``, tags on lines of
#: their own. Sections do not nest.
_SECTION: Final = re.compile(r"^[ \t]*\{\{([#^])(\w+)\}\}[ \t]*\n(.*?)^[ \t]*\{\{/\2\}\}[ \t]*\n", re.M | re.S)


@final
@dataclass(frozen=True, slots=True)
class Names:
    """Every spelling of the plugin the templates use."""

    #: The entry-point name: ``xccl.init(vendor=...)``, ``XCCL_SIMULATE=...``.
    name: str
    #: ``name`` as a Python identifier (``my-vendor`` -> ``my_vendor``).
    ident: str
    #: The package (``xccl_acme``) and the distribution (``xccl-acme``).
    pkg: str
    dist: str
    #: The class-name stem (``Acme``: ``AcmePlugin``, ``AcmeRuntime``).
    Class: str  # the token's spelling in the templates
    #: The vendor, for humans.
    vendor: str
    device_type: str
    backend: str
    #: The SDK's import name and its distribution.
    sdk: str
    sdk_dist: str
    #: The prefix of the plugin's environment variables (``ACME``) and its visible-devices variable.
    ENV: str  # the token's spelling in the templates
    visible_env: str
    #: The command that generates these files, recorded in them.
    command: str
    #: The SDK's bridge chooses the device and the process sees that one (Habana's ``habana_frameworks.torch``):
    #: ``setup_device`` takes the current device instead of making device ``local_rank`` current.
    bridge_picks_device: bool = False
    #: Write a stub rank-table format (``_ranktable.py``, its tests); without it ``rank_table_formats()`` is empty.
    rank_table: bool = False


def names(
    name: str,
    *,
    vendor: str | None = None,
    device_type: str | None = None,
    backend: str | None = None,
    sdk: str | None = None,
    sdk_dist: str | None = None,
    visible_devices_env: str | None = None,
    bridge_picks_device: bool = False,
    rank_table: bool = False,
) -> Names:
    """The spellings for ``name``; what is not given derives from it (``acme``: device type ``acme``, backend
    ``acmecl``, SDK ``torch_acme`` from the distribution ``torch-acme``, ``ACME_VISIBLE_DEVICES``). A dotted SDK
    (``habana_frameworks.torch``) comes from the distribution of its top-level package by default.
    ``bridge_picks_device`` and ``rank_table`` choose the vendor's shape (:class:`Names`); both off by default.

    Raises:
        ValueError: a name that cannot be an entry point, a backend or a module, with what to pass instead.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"plugin name {name!r}: use lower-case letters and digits, words joined by - or _ (e.g. acme)")
    ident = name.replace("-", "_")
    given = {"vendor": vendor, "device_type": device_type, "backend": backend, "sdk": sdk, "sdk_dist": sdk_dist,
             "visible_devices_env": visible_devices_env}
    device_type = device_type or ident
    backend = backend or f"{ident}cl"
    sdk = sdk or f"torch_{ident}"
    env = ident.upper()
    for what, value in (("--device-type", device_type), ("--backend", backend)):
        if not _IDENT.fullmatch(value) or keyword.iskeyword(value):
            raise ValueError(f"{what} {value!r}: must be a lower-case Python identifier (e.g. {ident})")
    # An SDK's import name may be a dotted module path (Habana's habana_frameworks.torch).
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in sdk.split(".")):
        raise ValueError(f"--sdk {sdk!r}: must be a Python module path (e.g. torch_{ident} or vendor_sdk.torch)")
    if backend in _RESERVED:
        raise ValueError(f"--backend {backend!r} is torch's own; name the vendor's library (e.g. {ident}cl)")
    visible = visible_devices_env or f"{env}_VISIBLE_DEVICES"
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", visible):
        raise ValueError(f"--visible-devices-env {visible!r}: an environment variable name in capitals")
    options = [a for k, v in given.items() if v is not None for a in (f"--{k.replace('_', '-')}", v)]
    options += [flag for flag, on in (("--bridge-picks-device", bridge_picks_device), ("--rank-table", rank_table))
                if on]
    return Names(
        name=name, ident=ident, pkg=f"xccl_{ident}", dist=f"xccl-{name.replace('_', '-')}",
        Class="".join(p.capitalize() for p in re.split(r"[-_]", name)), vendor=vendor or name.capitalize(),
        device_type=device_type, backend=backend, sdk=sdk,
        sdk_dist=sdk_dist or sdk.partition(".")[0].replace("_", "-"), ENV=env,
        visible_env=visible, command=shlex.join(["xccl", "new-plugin", name, *options]),
        bridge_picks_device=bridge_picks_device, rank_table=rank_table,
    )


def render(n: Names) -> dict[str, str]:
    """Every file of the distribution: relative path -> text."""
    values = {f.name: getattr(n, f.name) for f in fields(n)}
    tokens = {k: v for k, v in values.items() if isinstance(v, str)}
    flags = {k: v for k, v in values.items() if isinstance(v, bool)}
    root = resources.files("xccl.tools") / "scaffold"
    return {_target(rel, n): _fill(_sections(text, flags, rel), tokens, rel)
            for rel, text in sorted(_templates(root, "").items()) if flags.get(_ONLY_WITH.get(rel, ""), True)}


def write(n: Names, dest: Path) -> list[Path]:
    """Write the distribution into ``dest`` (created; it must not exist or be empty); returns the files.

    Raises:
        FileExistsError: ``dest`` has files already (nothing is overwritten).
    """
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty; choose another directory with -o/--output")
    written = []
    for rel, text in render(n).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _templates(node: Traversable, prefix: str) -> dict[str, str]:
    found = {}
    for child in node.iterdir():
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            found.update(_templates(child, rel + "/"))
        elif child.name.endswith(".tmpl"):
            found[rel.removesuffix(".tmpl")] = child.read_text(encoding="utf-8")
    return found


def _target(rel: str, n: Names) -> str:
    if rel == "gitignore":
        return ".gitignore"
    if rel.startswith("pkg/"):
        return f"{n.pkg}/{rel.removeprefix('pkg/')}"
    if rel.startswith("tests/test_"):
        return f"tests/test_{n.ident}_{rel.removeprefix('tests/test_')}"
    return rel


def _sections(text: str, flags: dict[str, bool], rel: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(2) not in flags:
            raise KeyError(f"scaffold template {rel}: unknown section {m.group(2)!r}")
        return m.group(3) if flags[m.group(2)] == (m.group(1) == "#") else ""

    out = _SECTION.sub(one, text)
    if stray := re.search(r"\{\{[#^/]\w+\}\}", out):
        raise KeyError(f"scaffold template {rel}: {stray.group(0)} is not a whole section (tags on lines of their own)")
    return out


def _fill(text: str, tokens: dict[str, str], rel: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in tokens:
            raise KeyError(f"scaffold template {rel}: unknown token {m.group(0)}")
        return tokens[m.group(1)]

    return re.sub(r"\{\{(\w+)\}\}", one, text)
