"""``xccl doctor``'s *vendor runtime* section: what the selected plugin's SDK does at run time, and what xccl does
about it, from the plugin's :class:`~xccl.plugin.VendorRuntime` and the environment (no SDK import):

* **watchdog**: the mode in force (xccl sets CleanUpOnly unless the user set one), the vendor's execution
  timeout that bounds a collective, and the timeout the process groups get (``xccl.collectives._watchdog``);
* **connect**: a lazily connected communicator's timeout, and which groups xccl connects eagerly;
* **communicators**: what each group holds and the device memory it takes; in a process where xccl is
  initialised, every group's communicators (``xccl.runtime.communicators``);
* **patches**: the functions of ``torch.distributed`` the SDK replaces, and what to call instead;
* **completion**: what ``Work.wait()`` waits for, when it is not the collective itself.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from .doctor_model import Finding, Status

__all__ = ["vendor_runtime"]

_SECTION = "vendor runtime"


def vendor_runtime(env: Mapping[str, str], registry: Any, chosen: str | None) -> list[Finding]:
    """The section for the plugin ``xccl.init`` would select (nothing when none can be selected)."""
    if chosen is None:
        return []
    from xccl.plugin._vendor_runtime import PLAIN

    plugin = registry.get(chosen)
    declared = plugin.vendor_runtime()
    if declared == PLAIN:
        return []  # plain torch.distributed: nothing the vendor does around the calls
    out: list[Finding] = []
    if declared.watchdog is not None:
        out.append(_watchdog(declared, env))
    if declared.lazy_connect is not None:
        out.append(_connect(declared, env))
    out += _communicators(plugin, declared, env)
    if declared.patches:
        out.append(_patches(declared))
    if declared.completion.value != "blocking":
        out.append(Finding(_SECTION, "completion", "info",
                           f"Work.wait() {declared.completion.value}: it does not wait for the collective itself",
                           facts={"source": declared.completion_source} if declared.completion_source else {}))
    return out


def _watchdog(declared: Any, env: Mapping[str, str]) -> Finding:
    from xccl.collectives._watchdog import CHOSEN_MODE, group_timeout

    wd = declared.watchdog
    name = wd.mode_source(env)
    try:
        mode = wd.mode(env) if name is not None else CHOSEN_MODE
    except ValueError as exc:
        return Finding(_SECTION, "watchdog", "fail", f"{exc}: xccl.init raises InitError",
                       f"set {wd.mode_env} to 2 (clean up only), or unset it and let xccl choose")
    source = f"{name}={env[name].strip()}, set by you" if name else f"set by xccl.init (the vendor's default is {wd.default_mode.value})"
    raw = env.get("XCCL_TIMEOUT", "").strip()
    try:
        asked = _dt.timedelta(seconds=float(raw)) if raw else _dt.timedelta(seconds=wd.torch_default)
    except ValueError:
        asked = _dt.timedelta(seconds=wd.torch_default)
    decided = group_timeout(wd, asked, env)
    exec_s = wd.exec_timeout(env)
    group_s = decided.timeout.total_seconds()
    bound = group_s if exec_s == 0 else min(group_s, exec_s)
    status: Status = "warn" if mode.tears_down else "ok"
    summary = (f"mode {mode.value} ({mode.name}; {source}); a hung collective fails after {bound:g} s "
               f"({wd.exec_timeout_env}={'never' if exec_s == 0 else f'{exec_s:g} s'}); the process groups get "
               f"{group_s:g} s")
    fix = (f"mode {mode.value} takes the whole process down when the watchdog fires, and nothing reaches Python: unset "
           f"{name} to let xccl choose 2 (clean up only)") if mode.tears_down else ""
    facts = {"given": raw or "none (the vendor's default)", "source": _first(wd.source)}
    if decided.note:
        facts["note"] = decided.note
    return Finding(_SECTION, "watchdog", status, summary, fix, facts)


def _connect(declared: Any, env: Mapping[str, str]) -> Finding:
    lazy = declared.lazy_connect
    seconds = lazy.timeout(env)
    return Finding(
        _SECTION, "connect", "info",
        f"a communicator connects at its group's first collective, within {lazy.timeout_env}={seconds:g} s; xccl.init "
        "connects the world's at once (every rank is there); call xccl.runtime.connect(group) on every rank after "
        "creating another group to connect it while the ranks are together",
        facts={"source": _first(lazy.source)},
    )


def _communicators(plugin: Any, declared: Any, env: Mapping[str, str]) -> list[Finding]:
    from xccl.plugin._capabilities import Collective

    memory = declared.comm_memory
    table = plugin.capabilities()
    side = any(table.entry(op).via == "host_gloo" for op in (Collective.SEND, Collective.RECV))
    lazy = " once connected" if declared.lazy_connect is not None else ""
    each = "1 communicator" if memory is None else f"1 communicator of {memory.buffers} x {memory.env}={memory.mb(env)} MB"
    p2p = "" if memory is None or not memory.p2p_env else (
        f"; send/recv add one of {memory.p2p_env}={memory.p2p_mb(env)} MB per pair of ranks that send to each other")
    summary = (f"every process group (world, sub-groups, DeviceMesh's) holds {each}{lazy}{p2p}; "
               f"xccl's host-side gloo group per group: {'yes (send/recv staged through host memory)' if side else 'none'}")
    out = [Finding(_SECTION, "communicators", "info", summary,
                   facts={"source": _first(memory.source)} if memory is not None else {})]
    out += _live(memory, env)
    return out


def _first(sources: str) -> str:
    """The first of a declaration's sources (``repository@commit path:lines``), for a short line."""
    return sources.split(" (")[0].split(", ")[0]


def _live(memory: Any, env: Mapping[str, str]) -> list[Finding]:
    """The communicators of this process and the runtime's refinements of the table, when xccl is initialised
    here (doctor called from a job)."""
    from xccl.collectives._state import PROCESS
    from xccl.runtime._communicators import communicators

    runtime = PROCESS.runtime
    if PROCESS.world is None or runtime is None:
        return []
    static, live = runtime.plugin.capabilities(), runtime.capabilities()
    out = [Finding(_SECTION, f"{op.value} ({mode.value})", "info",
                   f"{sup.level.value} here, {static.entry(op, mode).level.value} in the plugin's table: {sup.note}")
           for (op, mode), sup in live.items() if sup != static.entry(op, mode)]
    held = communicators()
    total = sum(c.memory_mb or 0 for c in held if c.connected is not False)
    for c in held:
        state = {True: "connected", False: "not connected yet", None: "connected at creation"}[c.connected]
        size = "" if c.memory_mb is None else f", {c.memory_mb} MB"
        out.append(Finding(_SECTION, f"group {c.group}", "info",
                           f"{c.kind} communicator ({c.backend}) over ranks {list(c.ranks)}: {state}{size}"))
    out.append(Finding(_SECTION, "device memory", "info",
                       f"{len(held)} communicator(s), {total} MB of device memory for the connected ones"
                       + ("" if memory is None else f" ({memory.buffers} x {memory.env}={memory.mb(env)} MB each)")))
    return out


def _patches(declared: Any) -> Finding:
    def names(patches: Any) -> str:
        return ", ".join(p.target.removeprefix("torch.distributed.") for p in patches)

    on_import = declared.patches_on_import
    said = [f"the vendor's SDK replaces torch.distributed's {names(on_import)} when it is imported"] if on_import else []
    conditions = dict.fromkeys(p.condition for p in declared.patches if p.condition)
    said += [f"{names(p for p in declared.patches if p.condition == c)}: replaced {c}" for c in conditions]
    bypass = [p for p in on_import if "directly" in p.effect]
    if bypass:
        # The same function may be replaced under two paths (torch.distributed.gather and its distributed_c10d twin).
        leaves = list(dict.fromkeys(p.target.rpartition(".")[2] for p in bypass))
        said.append(f"{names(bypass)} then call the vendor's backend directly, past xccl's dispatch (no validation, "
                    f"mismatch detector or typed faults): call {' and '.join(f'xccl.{leaf}' for leaf in leaves)} "
                    "instead")
    return Finding(_SECTION, "patches", "info", "; ".join(said),
                   facts={p.target: p.effect for p in declared.patches})

