"""``xccl doctor``'s checks of what the environment tells this rank: visible devices, rank table, rendezvous
(which launcher started it, as :func:`xccl.plugin.job_env` reads it: torchrun, Slurm, LSF, Kubeflow, MPI), and the
*vendor runtime* section: what the selected plugin's SDK does at run time (its watchdog, lazy connection,
communicators, the ``torch.distributed`` functions it patches, what ``Work.wait()`` waits for) and what xccl does
about it, from the plugin's :class:`~xccl.plugin.VendorRuntime` and the environment (no SDK import).

Each check takes the environment as a mapping (a test seam) and returns :class:`~.doctor.Finding` objects.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from ...errors import InitError
from ...plugin import JobEnv, job_env
from .doctor_model import Finding, Status

__all__ = ["LAUNCHER_ENV", "devices", "rank_table", "rendezvous", "vendor_runtime"]

#: The launchers' variables doctor reports (torchrun, Slurm, LSF, Kubeflow, MPI: what ``job_env`` reads).
LAUNCHER_ENV: Final = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
    "LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK",
    "JSM_NAMESPACE_LOCAL_SIZE", "PET_NNODES", "PET_NPROC_PER_NODE",
)

# ----------------------------------------------------------------------------------------------------- devices


def devices(env: Mapping[str, str], registry: Any, chosen: str | None) -> list[Finding]:
    owners: dict[str, list[str]] = {var: [] for var in _CHECKS}
    for info in registry.infos().values():
        var = getattr(info.plugin, "visible_devices_env", None) if info.plugin is not None else None
        if var:
            owners.setdefault(var, []).append(info.name)
    out = []
    for var, plugins in owners.items():
        raw = env.get(var)
        if raw is None:
            out.append(Finding("devices", var, "info", _UNSET.get(var, "unset (every device visible)")))
            continue
        status, summary, fix = _CHECKS.get(var, _generic_visible)(raw)
        # A bad value is fatal only for the vendor that reads it, and only when that vendor is selected.
        if status == "fail" and chosen not in plugins and not (var == "CHIP_MAP" and chosen == "sophgo"):
            status = "warn"
        out.append(Finding("devices", var, status, f"{raw!r}: {summary}", fix))
    return out


_UNSET: Final = {
    "TPU_VISIBLE_DEVICES": "unset",
    "CHIP_MAP": "unset (Sophgo: local rank i uses chip i, or the rank table's map)",
}


def _cuda_visible(raw: str) -> tuple[Status, str, str]:
    items = [s.strip() for s in raw.split(",")] if raw.strip() else []
    if not items or items[0] in ("-1", ""):
        return "fail", "no GPU is visible", "unset it, or list GPU indices (CUDA_VISIBLE_DEVICES=0,1)"
    if any(not (s.isdigit() or s.startswith(("GPU-", "MIG-"))) for s in items):
        return "warn", "CUDA stops at the first entry that is neither an index nor a GPU-/MIG- UUID", ""
    return "ok", f"{len(items)} GPU(s) visible", ""


def _ascend_visible(raw: str) -> tuple[Status, str, str]:
    # torch_npu's parser (npu/__init__.py _parse_visible_devices): stops at the first character that is not a
    # digit or a comma; IDs must be ascending, otherwise it counts 0 devices; an empty value means 0 devices.
    kept = re.match(r"[0-9,]*", raw)
    prefix = kept.group(0) if kept else ""
    ids = [int(s) for s in prefix.split(",") if s]
    fix = "list ascending device IDs separated by commas, nothing else (ASCEND_RT_VISIBLE_DEVICES=0,1,2,3)"
    if not ids:
        return "fail", "torch_npu sees 0 devices (empty)", fix
    if ids != sorted(set(ids)):
        return "fail", f"IDs {ids} are not strictly ascending: torch_npu then sees 0 devices", fix
    if prefix != raw:
        return "warn", f"parsing stops at {raw[len(prefix):]!r}: only {ids} are used", fix
    return "ok", f"{len(ids)} NPU(s) visible, renumbered 0..{len(ids) - 1}", ""


def _tpu_visible(raw: str) -> tuple[Status, str, str]:
    return (
        "warn",
        "Sophgo's runtime does not read it, and DeepSpeed's TPU adaptor fails with it set (TypeError on a map)",
        "unset it; choose Sophgo chips with CHIP_MAP (local rank -> chip) instead",
    )


def _chip_map(raw: str) -> tuple[Status, str, str]:
    fix = "comma-separated distinct chip IDs, one per local rank, in C2C ring order (e.g. CHIP_MAP=0,2,6,7,3,1,5,4)"
    try:
        chips = [int(s) for s in raw.split(",")]
    except ValueError:
        return "fail", "not a comma-separated list of integers", fix
    if len(set(chips)) != len(chips) or any(c < 0 for c in chips):
        return "fail", f"{chips} repeats a chip or has a negative one", fix
    return "ok", f"local rank i uses chip {chips}[i]", ""


def _generic_visible(raw: str) -> tuple[Status, str, str]:
    return "info", "set", ""


#: The visible-devices variables doctor knows the rules of (others, a plugin's, are reported as set).
_CHECKS: Final[dict[str, Callable[[str], tuple[Status, str, str]]]] = {
    "CUDA_VISIBLE_DEVICES": _cuda_visible, "ASCEND_RT_VISIBLE_DEVICES": _ascend_visible,
    "TPU_VISIBLE_DEVICES": _tpu_visible, "CHIP_MAP": _chip_map,
}


# -------------------------------------------------------------------------------------------------- rank table


def rank_table(env: Mapping[str, str]) -> list[Finding]:
    from xccl.errors import RankTableError
    from xccl.plugin import load_rank_table

    from .ranktable import installed_formats

    path = env.get("RANK_TABLE_FILE")
    if not path:
        return [Finding("rank table", "RANK_TABLE_FILE", "info", "unset (rank tables are optional)")]
    formats = installed_formats()
    try:
        fmt, table = load_rank_table(path, formats)
    except RankTableError as exc:
        generators = [f"`xccl rank-table {f.name} ...`" for f in formats if f.can_generate]
        return [Finding(
            "rank table", "RANK_TABLE_FILE", "fail", f"{path} is not a valid rank table: {exc.field}: {exc.problem}",
            "fix the file (`xccl rank-table validate FILE` says what is wrong), "
            + (f"or generate one with {' or '.join(generators)}, " if generators else "")
            + "or unset RANK_TABLE_FILE",
        )]
    kind = fmt.name
    size = table.world_size()
    facts = {"format": kind, "world_size": str(size), "version": str(getattr(table, "version", "?"))}
    world = env.get("WORLD_SIZE")
    if world and world.strip().isdigit() and int(world) != size:
        return [Finding(
            "rank table", "RANK_TABLE_FILE", "fail", f"{path} has {size} ranks but WORLD_SIZE={world}",
            "generate the table for this job's ranks, or fix WORLD_SIZE", facts,
        )]
    return [Finding("rank table", "RANK_TABLE_FILE", "ok", f"{path}: a valid {kind} rank table of {size} ranks",
                    facts=facts)]


# -------------------------------------------------------------------------------------------------- rendezvous


def rendezvous(env: Mapping[str, str]) -> list[Finding]:
    present = {k: env[k] for k in LAUNCHER_ENV if k in env}
    out: list[Finding] = []
    try:
        job: JobEnv | None = job_env(env)
    except InitError as exc:
        job = None
        out.append(Finding("rendezvous", "launcher", "fail", str(exc), "fix or unset the variable", facts=present))
    if job is not None and job.source == "none":
        out.append(Finding("rendezvous", "launcher", "info", "no launcher variables: xccl.init() makes a world of one "
                           "(run under torchrun, srun, jsrun or mpirun for more)"))
    elif job is not None:
        out.append(Finding("rendezvous", "launcher", "ok", f"found {job.describe()}", facts=present))
    out += _ranks(env)
    if job is not None and job.source in ("slurm", "lsf", "mpi") and job.master_addr and job.master_port:
        out.append(Finding("rendezvous", "store", "ok", f"{job.master_addr}:{job.master_port}, by {job.source}'s "
                           "conventions (xccl.init uses it)"))
    else:
        out += _master(env)
    out += _xccl_vars(env)
    return out


def _int(env: Mapping[str, str], name: str) -> int | str | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


def _ranks(env: Mapping[str, str]) -> list[Finding]:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    bad = [f"{n}={v!r}" for n, v in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", _int(env, "LOCAL_RANK")))
           if isinstance(v, str)]
    if bad:
        return [Finding("rendezvous", "ranks", "fail", f"{', '.join(bad)}: not an integer", "fix or unset it")]
    if rank is None and size is None:
        return []
    if not isinstance(rank, int) or not isinstance(size, int):
        return [Finding("rendezvous", "ranks", "fail", f"RANK={rank} WORLD_SIZE={size}: xccl.init needs both",
                        "run under torchrun, or set both")]
    if size < 1 or not 0 <= rank < size:
        return [Finding("rendezvous", "ranks", "fail", f"RANK={rank} is not in [0, WORLD_SIZE={size})",
                        "fix RANK / WORLD_SIZE (the launcher sets them)")]
    return [Finding("rendezvous", "ranks", "ok", f"rank {rank} of {size}")]


def _master(env: Mapping[str, str]) -> list[Finding]:
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    size = _int(env, "WORLD_SIZE")
    if not addr and not port:
        if isinstance(size, int) and size > 1:
            return [Finding("rendezvous", "MASTER_ADDR/PORT", "fail", "unset, but WORLD_SIZE > 1",
                            "export MASTER_ADDR and MASTER_PORT (torchrun does), or pass init_method to xccl.init")]
        return []
    out = []
    if not port.isdigit() or not 0 < int(port) < 65536:
        out.append(Finding("rendezvous", "MASTER_PORT", "fail", f"{port!r} is not a TCP port", "use 1..65535"))
    else:
        out.append(Finding("rendezvous", "MASTER_PORT", "ok", port))
    if not addr:
        out.append(Finding("rendezvous", "MASTER_ADDR", "fail", "unset while MASTER_PORT is set",
                           "export MASTER_ADDR=<rank 0's host>"))
    else:
        resolved = _resolve(addr)
        if resolved is None:
            out.append(Finding("rendezvous", "MASTER_ADDR", "fail", f"{addr!r} does not resolve from this host",
                               "use rank 0's IP address or a name this host resolves"))
        else:
            out.append(Finding("rendezvous", "MASTER_ADDR", "ok", f"{addr} -> {resolved}"))
    return out


def _resolve(host: str, timeout: float = 3.0) -> str | None:
    """The first address ``host`` resolves to, or None (bounded: a dead resolver must not hang doctor)."""
    result: list[str | None] = [None]

    def work() -> None:
        try:
            result[0] = str(socket.getaddrinfo(host, None)[0][4][0])
        except OSError:
            result[0] = None

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0]


def _xccl_vars(env: Mapping[str, str]) -> list[Finding]:
    out = []
    raw = env.get("XCCL_TIMEOUT")
    if raw is not None:
        try:
            ok = float(raw) > 0
        except ValueError:
            ok = False
        out.append(Finding("rendezvous", "XCCL_TIMEOUT", "ok" if ok else "fail",
                           f"{raw!r}" + (" seconds" if ok else " is not a positive number of seconds"),
                           "" if ok else "set seconds, e.g. XCCL_TIMEOUT=600"))
    check = env.get("XCCL_CHECK")
    if check is not None:
        on = check.strip() not in ("", "0", "false")
        out.append(Finding("rendezvous", "XCCL_CHECK", "info",
                           "mismatch detector on (a local record per call; store traffic only for new calls and in the background)" if on else "off"))
    return out


# --------------------------------------------------------------------------------------------- vendor runtime


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
        f"; send/recv add one of {memory.buffers} x {memory.p2p_env}={memory.p2p_mb(env)} MB per pair of ranks that "
        "send to each other")
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

