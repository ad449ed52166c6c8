#!/usr/bin/env python3
"""Generate ``docs/fidelity.md``, the fidelity ledger: for every claim a vendor plugin makes, its source and
whether the simulation enforces it.

A plugin of this repository takes part when its package has a ``_fidelity`` module (``xccl_ascend._fidelity``,
``xccl_sophgo._fidelity``) defining:

* ``ENTRY_SOURCES``: ``{(Collective, Mode): (source, ...)}`` for its capability-table entries. A citation in an
  entry's note counts too (a ``repository@commit path:line``, ``Ascend/torchair ...``, ``seed NNN``,
  ``manifest ...`` or an ``https://`` page), so a source can sit next to the claim it supports;
* ``CLAIMS``: the other claims (constraints, options, topology), each with ``topic``, ``claim``, ``sources`` and
  ``simulation``;
* optionally ``SUMMARY`` (a sentence on the sources, shown under the plugin's heading),
  ``entry_simulation(op, mode, support) -> str | None`` to describe how the simulation covers an entry (the
  default says it by level and mode), and ``HARDWARE``: ``((what, command), ...)``, the ordered list of what only
  the hardware can settle, each with the one command that settles it ("First hour on hardware").

Every entry of the plugin's capability table and every claim becomes a row; so does every behaviour the plugin
declares in ``Plugin.vendor_runtime()`` (watchdog, execution timeout, lazy connect, memory per communicator,
patches, vendor faults, completion), each with the sources its declaration carries ("Run time"). A row without a source is listed under
"Claims without a source", and ``--check`` (and ``tests/test_fidelity.py``) fails on it, as on a stale file.

Usage::

    python scripts/gen_fidelity.py            # rewrite docs/fidelity.md
    python scripts/gen_fidelity.py --check    # change nothing; exit 1 if stale or a claim has no source
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from gen_docs import documented, repo_distributions  # noqa: E402 - the sibling script, found through sys.path

from xccl.plugin import Collective, Completion, Fault, Level, Mode, Support, VendorRuntime  # noqa: E402
from xccl.plugin._registry import PluginInfo, plugins  # noqa: E402
from xccl.tools import _render  # noqa: E402

DOC: Final = Path("docs/fidelity.md")
COMMAND: Final = "python scripts/gen_fidelity.py"
#: What counts as a source inside a note.
CITATION: Final = re.compile(
    r"(?:Ascend/(?:pytorch|op-plugin|torchair)|sophgo/torch-tpu)(?:@[0-9a-f]{7,40})?(?: [^;,()\[\]]*[^;,()\[\] ])?"
    r"|torch-tpu [0-9a-f]{7,40}(?: \w+)?"
    r"|seeds? \d{3}(?:/\d{3})*"
    r"|manifest (?:gotcha \d+|[AB]\d?)"
    r"|https://[^\s;,()\[\]]+"
)

_INTRO: Final = """\
# Fidelity ledger

Every claim the vendor plugins make about their stacks, where it comes from, and whether xccl's simulation
enforces it: what a reviewer with the hardware should try first is a claim whose source is weak (an inference, a
document older than the release) or that the simulation does not enforce.

Sources: `repository@commit path:lines` (public upstream repositories, at the commit read), `seed NNN`
(`shared/seeds/`), `manifest ...` (`shared/vendor-api/MANIFEST.md`: section A is torch_npu 2.13.0, section B
Sophgo's torch-tpu), or a vendor documentation page. `[inferred]` marks a reading of code or documents that was
not run on hardware.

Simulation: **checked**: xccl checks it before any call, with the same code on the hardware and in simulation;
**simulated**: the simulated vendor (process group, SDK) refuses or behaves as the vendor does; **not simulated**:
documented only. The capability tables themselves are in [capabilities.md](capabilities.md).
"""


@final
@dataclass(frozen=True, slots=True)
class Row:
    """One line of the ledger."""

    subject: str
    claim: str
    sources: tuple[str, ...]
    simulation: str


def fidelity_module(info: PluginInfo) -> ModuleType | None:
    """The plugin's ``_fidelity`` module, or None when its package has none."""
    package = type(info.plugin).__module__.rpartition(".")[0]
    try:
        return importlib.import_module(f"{package}._fidelity")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}._fidelity":
            raise
        return None


def citations(text: str) -> tuple[str, ...]:
    """The sources cited in ``text`` (an entry's note)."""
    return tuple(dict.fromkeys(m.group(0).strip() for m in CITATION.finditer(text)))


def default_simulation(op: Collective, mode: Mode, sup: Support) -> str:
    """How the simulation covers a table entry, by level and mode."""
    if sup.level is Level.UNSUPPORTED:
        return "checked: refused by the table before any call" + (" (at compile time)" if mode is Mode.GRAPH else "")
    if mode is Mode.GRAPH:
        return "simulated: compiled through xccl's graph path on the simulated backend"
    if sup.level is Level.EMULATED:
        return f"checked: xccl composes it ({sup.via}), the same code in simulation"
    return "simulated: the simulated vendor group runs it with the vendor's method, dtype and per-call checks"


def _claim(op: Collective, sup: Support) -> str:
    parts = [_render.cell(sup)]
    if sup.level is not Level.UNSUPPORTED:
        fused = _render._open_fused(op, sup)
        parts.append(f"dtypes: {_render._PER_CALL if fused and sup.dtypes is None else _render._dtypes(sup.dtypes)}")
        if op.reduces:
            ops = _render._PER_CALL if fused and sup.reduce_ops is None else _render._reduce_ops(op, sup)
            parts.append(f"reduce ops: {ops}")
        if sup.cast_to:
            parts.append(f"casts: {_render._casts(sup)}")
    if sup.min_torch is not None:
        parts.append(f"torch >= {'.'.join(map(str, sup.min_torch))}")
    if sup.min_sdk is not None:
        parts.append(f"{sup.min_sdk[0]} >= {sup.min_sdk[1]}")
    if sup.world_sizes is not None:
        parts.append(f"world sizes {', '.join(map(str, sorted(sup.world_sizes)))}")
    return "; ".join(parts)


def _src(text: str) -> tuple[str, ...]:
    return citations(text) or ((text,) if text else ())


def _filled(template: str, **values: float) -> str:
    """A declared message with its placeholders filled with the defaults (the template as is if it cannot be)."""
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return template


_WAITS: Final = {
    Completion.BLOCKING: "as gloo",
    Completion.STREAM: "simulated for a lost peer (xccl.plugin._sim_stream): gloo's error does not reach the host; "
    "the simulated stream holds the collective and all behind it until the execution timeout; otherwise the "
    "simulated wait() waits for the collective on the host, where the hardware's makes the caller's stream wait "
    "and returns",
    Completion.AT_ONCE: "simulated by the plugin's simulated group (wait() returns at once); a lost peer holds the "
    "simulated stream, and whatever needs its values, forever (xccl.plugin._sim_stream)",
}


def runtime_rows(runtime: VendorRuntime) -> list[Row]:
    """A row per behaviour the plugin declares in ``vendor_runtime()``, with the sources of its declaration."""
    out = []
    if runtime.completion is not Completion.BLOCKING or runtime.completion_source:
        out.append(Row("completion", f"Work.wait(): {runtime.completion.value}", _src(runtime.completion_source),
                       _WAITS[runtime.completion]))
    wd = runtime.watchdog
    if wd is not None:
        src = _src(wd.source)
        alias = f" (or {', '.join(wd.mode_env_aliases)})" if wd.mode_env_aliases else ""
        out += [
            Row("watchdog: mode", f"{wd.mode_env}{alias} selects 0 no handling, 1 tear down, 2 clean up only, 3 skip "
                f"clean up; default {wd.default_mode.value}; read once per process; 1 and 3 rethrow on the "
                "watchdog's thread, taking the process down", src,
                "simulated: the mode read once per process; in 1 and 3 a watchdog that fires aborts the process "
                "with the vendor's message. xccl sets 2 unless the user set the variable"),
            Row("watchdog: timeout floor", f"in mode(s) {', '.join(str(m.value) for m in sorted(wd.floor_modes, key=lambda m: m.value))}: "
                f"a group timeout at or below {wd.exec_timeout_env} warns "
                f"({_filled(wd.warning, timeout_ms=300_000, exec_ms=round(wd.exec_timeout_default * 1000)) or 'no warning'}); torch's "
                f"{wd.torch_default:g} s default becomes {wd.exec_timeout_env} + {wd.default_margin:g} s", src,
                "simulated: the same rule and warning at group creation. xccl gives no group a timeout at or below "
                f"{wd.exec_timeout_env}, and the vendor's default when none was given, in every mode"),
            Row("execution timeout", f"{wd.exec_timeout_env} (default {wd.exec_timeout_default:g} s) ends a collective "
                f"that does not complete: {_filled(wd.exec_error, exec_s=wd.exec_timeout_default) or 'no message'}", src,
                "simulated: the simulated group's gloo times out after it, and a collective stuck on a lost peer "
                "is failed after it (xccl.plugin._sim_stream), with the vendor's text, from the collective's wait() "
                f"(the hardware: at the next stream synchronisation); xccl raises CollectiveTimeout naming "
                f"{wd.exec_timeout_env}"),
        ]
    if runtime.teardown_syncs:
        out.append(Row("teardown", "destroying a group synchronises its streams first: with a collective stuck on a "
                       "lost peer it waits until the device fails it, then can raise", _src(runtime.teardown_syncs),
                       "simulated: the simulated group's shutdown waits on the simulated stream (its error after the "
                       "execution timeout); xccl's shrink stops and restarts the device first (Runtime.stop_device)"))
    if runtime.stuck_forever:
        out.append(Row("lost peer", "a collective stuck on a lost peer never returns: "
                       + runtime.stuck_forever.split(" (")[0], _src(runtime.stuck_forever),
                       "simulated: it holds the simulated stream for ever (xccl.plugin._sim_stream); at the health "
                       "watch's or the sentinel's verdict (with or without a call of xccl's waiting), a process that "
                       "does not shut xccl down within XCCL_LOSS_EXIT_AFTER seconds "
                       "ends itself with exit code 75 (xccl.collectives._health._ending)"))
    lazy = runtime.lazy_connect
    if lazy is not None:
        out.append(Row("lazy connect", f"a communicator connects at its group's first collective, within "
                       f"{lazy.timeout_env} (default {lazy.timeout_default:g} s), else: "
                       f"{_filled(lazy.error, timeout_s=lazy.timeout_default) or 'no message'}",
                       _src(lazy.source),
                       "simulated: every member must reach the group's first collective within the timeout. xccl "
                       "connects the world at xccl.init and names the late ranks in CollectiveTimeout"))
    mem = runtime.comm_memory
    if mem is not None:
        p2p = (f"; a point-to-point communicator takes {mem.buffers} x {mem.p2p_env} ({mem.buffers * mem.p2p_default_mb} "
               "MB by default)") if mem.p2p_env else ""
        out.append(Row("memory per communicator", f"{mem.buffers} x {mem.env} ({mem.buffers * mem.default_mb} MB by "
                       f"default) per communicator{p2p}",
                       _src(mem.source), "not simulated: reported by xccl doctor and xccl.runtime.communicators()"))
    for patch in runtime.patches:
        if not patch.condition:
            out.append(Row(f"patch: `{patch.target}`", f"replaced when the SDK is imported: {patch.effect}",
                           _src(patch.source), "simulated: the simulated SDK applies a stand-in when the runtime "
                           "loads it and removes it at shutdown"))
            continue
        out.append(Row(f"patch: `{patch.target}`", f"replaced {patch.condition}: {patch.effect}", _src(patch.source),
                       "declared (conditional): the plugin's simulation says which of these it reproduces"))
    produced = (wd.exec_error if wd is not None else "") + (lazy.error if lazy is not None else "")
    for fault in runtime.faults:
        typed = "PeerFailure" if fault.kind is Fault.PEER_LOST else "CollectiveTimeout"
        how = ("simulated: the simulated failure carries the vendor's text" if fault.fragment in produced else
               f"simulated: {fault.simulated_by} raises the vendor's text" if fault.simulated_by else
               "not simulated: no simulated failure produces it")
        out.append(Row(f"fault: {fault.fragment}", fault.meaning, _src(fault.source),
                       f"{how}; checked: xccl raises {typed} for a message that contains it"))
    return out


def rows(info: PluginInfo, module: ModuleType) -> tuple[list[Row], list[Row]]:
    """The plugin's table rows and claim rows."""
    table = info.plugin.capabilities()  # type: ignore[union-attr]
    sources: dict[Any, tuple[str, ...]] = dict(getattr(module, "ENTRY_SOURCES", {}))
    describe: Callable[..., str | None] = getattr(module, "entry_simulation", lambda *_: None)
    entries = []
    for (op, mode), sup in table.items():
        found = tuple(dict.fromkeys((*sources.get((op, mode), ()), *citations(sup.note))))
        sim = describe(op, mode, sup) or default_simulation(op, mode, sup)
        entries.append(Row(f"`{op.value}` {mode.value}", _claim(op, sup), found, sim))
    claims = [Row(c.topic, c.claim, tuple(c.sources), c.simulation) for c in getattr(module, "CLAIMS", ())]
    return entries, claims + runtime_rows(info.plugin.vendor_runtime())  # type: ignore[union-attr]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: Sequence[str], body: Iterable[Row]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in body:
        src = "<br>".join(_md(s) for s in r.sources) or "**none**"
        lines.append(f"| {_md(r.subject)} | {_md(r.claim)} | {src} | {_md(r.simulation)} |")
    return lines


def section(info: PluginInfo, module: ModuleType) -> str:
    """One plugin's part of the ledger, markers included."""
    entries, claims = rows(info, module)
    lines = [f"<!-- fidelity:begin {info.name} -->", f"## {info.name}", ""]
    summary = getattr(module, "SUMMARY", "")
    if summary:
        lines += [summary, ""]
    lines += ["### Capability table", "", *_table(("entry", "claim", "source", "simulation"), entries), ""]
    lines += ["### Other claims and the run time", "", *_table(("topic", "claim", "source", "simulation"), claims), ""]
    hardware = getattr(module, "HARDWARE", ())
    if hardware:
        lines += ["### First hour on hardware", "",
                  "What the simulation cannot settle, in the order to try it, each with the command that settles it:",
                  ""]
        lines += [f"{i}. {_md(what)}: `{command}`" for i, (what, command) in enumerate(hardware, 1)]
        lines.append("")
    lines.append(f"<!-- fidelity:end {info.name} -->")
    return "\n".join(lines) + "\n"


def participants(infos: Iterable[PluginInfo]) -> list[tuple[PluginInfo, ModuleType]]:
    """The plugins with a ``_fidelity`` module, by name."""
    found = [(i, m) for i in infos if (m := fidelity_module(i)) is not None]
    return sorted(found, key=lambda p: p[0].name)


def unsourced(parts: Sequence[tuple[PluginInfo, ModuleType]]) -> list[str]:
    """``"plugin: subject"`` for every row without a source."""
    out = []
    for info, module in parts:
        entries, claims = rows(info, module)
        out += [f"{info.name}: {r.subject}" for r in (*entries, *claims) if not r.sources]
    return out


def render_document(parts: Sequence[tuple[PluginInfo, ModuleType]]) -> str:
    """The whole of ``docs/fidelity.md``."""
    names = " ".join(i.name for i, _ in parts)
    missing = unsourced(parts)
    tail = ["## Claims without a source", ""]
    tail += [f"- {_md(m)}" for m in missing] if missing else ["None."]
    return "\n".join([
        f"<!-- Generated by `{COMMAND}` from the plugins' data; do not edit by hand.\n     Plugins: {names} -->\n",
        _INTRO,
        *(section(i, m) for i, m in parts),
        *tail,
        "",
    ])


def stale(text: str, parts: Sequence[tuple[PluginInfo, ModuleType]]) -> list[str]:
    """What in ``text`` disagrees with a fresh rendering (empty: up to date).

    When the file covers plugins that are not installed here, each installed plugin's section is compared alone.
    """
    match = re.search(r"^\s*Plugins: (.*?) -->$", text, re.M)
    if not text.startswith("<!-- Generated by") or match is None:
        return ["it lacks the generated header"]
    recorded, present = match.group(1).split(), [i.name for i, _ in parts]
    problems = [f"plugin {p!r} is installed but not in it" for p in present if p not in recorded]
    if problems or recorded == present:
        return problems + ([] if text == render_document(parts) else ["it differs from a fresh rendering"])
    for info, module in parts:
        found = re.search(rf"<!-- fidelity:begin {re.escape(info.name)} -->\n.*?<!-- fidelity:end "
                          rf"{re.escape(info.name)} -->\n", text, re.S)
        if found is None or found.group(0) != section(info, module):
            problems.append(f"section {info.name!r} differs from the plugin's data")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate, or with ``--check`` report what is stale or unsourced (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale or unsourced")
    args = parser.parse_args(argv)
    parts = participants(documented(plugins(), repo_distributions()))
    doc = ROOT / DOC
    problems = [f"{DOC}: {p}" for p in stale(doc.read_text() if doc.is_file() else "", parts)] if args.check else []
    if not args.check:
        doc.write_text(render_document(parts))
        print(f"wrote {DOC} ({', '.join(i.name for i, _ in parts)})")
    problems += [f"no source: {m}" for m in unsourced(parts)]
    for p in problems:
        print(f"{p}; run `{COMMAND}`" if p.startswith(str(DOC)) else p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
