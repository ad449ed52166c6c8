"""``xccl doctor``'s checks of what the environment tells this rank: visible devices, rank table, rendezvous
(which launcher started it, as :func:`xccl.plugin.job_env` reads it: torchrun, Slurm, LSF, Kubeflow, MPI).

Each check takes the environment as a mapping (a test seam) and returns :class:`~.doctor_model.Finding` objects.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from ...errors import InitError
from ...plugin import JobEnv, job_env
from .doctor_model import Finding, Status

__all__ = ["LAUNCHER_ENV", "devices", "rank_table", "rendezvous"]

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
    owners: dict[str, list[str]] = {
        "CUDA_VISIBLE_DEVICES": [], "ASCEND_RT_VISIBLE_DEVICES": [], "TPU_VISIBLE_DEVICES": [], "CHIP_MAP": [],
    }
    for info in registry.infos().values():
        var = getattr(info.plugin, "visible_devices_env", None) if info.plugin is not None else None
        if var:
            owners.setdefault(var, []).append(info.name)
    checks: dict[str, Callable[[str], tuple[Status, str, str]]] = {
        "CUDA_VISIBLE_DEVICES": _cuda_visible,
        "ASCEND_RT_VISIBLE_DEVICES": _ascend_visible,
        "TPU_VISIBLE_DEVICES": _tpu_visible,
        "CHIP_MAP": _chip_map,
    }
    out = []
    for var, plugins in owners.items():
        raw = env.get(var)
        if raw is None:
            out.append(Finding("devices", var, "info", _UNSET.get(var, "unset (every device visible)")))
            continue
        status, summary, fix = checks.get(var, _generic_visible)(raw)
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
