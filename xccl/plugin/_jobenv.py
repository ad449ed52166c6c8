"""Which launcher started this process, and what it says about the job: :func:`job_env` and :class:`JobEnv`.

One reader of the launchers' variables for all of xccl: ``xccl.init`` takes its ranks and rendezvous address from
here, ``xccl doctor`` says which launcher it found, and plugins that need the job's shape (Sophgo's chip map) call
:func:`job_env` instead of reading variables themselves.

The launchers, the variables read and the two deliberate differences from Lightning's cluster environments
(``lightning_fabric/plugins/environments/{torchelastic,slurm,lsf,kubeflow,mpi}.py``, lightning-fabric 2.6.6), whose
order this keeps, are tabled in docs/multinode.md. Every value is checked: a bad one is an :class:`~xccl.InitError`
naming the variable.
"""

from __future__ import annotations

import os
import re
import socket
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

from ..errors import InitError

__all__ = ["JobEnv", "first_node", "job_env", "tasks_per_node"]

#: Lightning's Slurm rule: the port is 15000 + the job id's last four digits, else this (``slurm.py main_port``).
_SLURM_DEFAULT_PORT: Final = 12910
#: Job names with which Lightning does not treat an allocation as an srun launch (``_is_slurm_interactive_mode``).
_SLURM_INTERACTIVE: Final = ("bash", "interactive")
#: Lightning's LSF detection (``LSFEnvironment.detect``): all of these set.
_LSF_REQUIRED: Final = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")
#: Each launcher's rank, world size, local rank and ranks per node, and what they are (for errors).
_TORCHRUN: Final = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_SLURM: Final = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
_LSF: Final = ("JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE")
_WHATS: Final = ("this process's global rank", "the number of ranks", "this process's rank on its node",
                 "ranks on this node")


@final
@dataclass(frozen=True, slots=True)
class JobEnv:
    """What the launcher of this process says about the job. A field is None where the launcher does not say.

    Example::

        job = xccl.plugin.job_env()
        print(job.source, job.rank, job.world_size)      # e.g. "slurm", 3, 8
    """

    #: Which launcher: ``"torchrun"``, ``"environment"`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set by another
    #: launcher or by hand), ``"kubeflow"``, ``"slurm"``, ``"lsf"``, ``"mpi"``, or ``"none"`` (a plain process).
    source: str
    #: This process's global rank.
    rank: int | None
    #: The number of ranks.
    world_size: int | None
    #: This process's rank on its node.
    local_rank: int | None
    #: The number of ranks on this node.
    local_world_size: int | None
    #: This node's index.
    node_rank: int | None
    #: Where rank 0's rendezvous store runs, by the launcher's convention (e.g. Slurm's first node).
    master_addr: str | None
    #: Its port.
    master_port: int | None
    #: One line for people: the launcher and the variables the values came from.
    detail: str = ""

    def describe(self) -> str:
        """``slurm: rank 3 of 8 (local 1 of 4, node 1), store node001:16234; SLURM_PROCID, ...``."""
        def n(v: int | None) -> str:
            return "?" if v is None else str(v)

        where = f", store {self.master_addr}:{self.master_port}" if self.master_addr and self.master_port else ""
        tail = f"; {self.detail}" if self.detail else ""
        return (f"{self.source}: rank {n(self.rank)} of {n(self.world_size)} (local {n(self.local_rank)} of "
                f"{n(self.local_world_size)}, node {n(self.node_rank)}){where}{tail}")


def job_env(env: Mapping[str, str] | None = None) -> JobEnv:
    """The launcher of this process and what it says about the job (the rules: docs/multinode.md).

    Args:
        env: the environment to read (default ``os.environ``); a test seam.

    Raises:
        InitError: a variable is malformed (not an integer, a bad node list, an unreadable host file) or the values
            contradict each other; the message names the variable.
    """
    env = os.environ if env is None else env
    if _has(env, "TORCHELASTIC_RUN_ID"):
        return _generic(env, "torchrun", "torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT")
    if _has(env, "RANK") or _has(env, "WORLD_SIZE"):
        if not _has(env, "LOCAL_RANK") and (_has(env, "PET_NNODES") or _has(env, "KUBERNETES_SERVICE_HOST")):
            return _kubeflow(env)
        return _generic(env, "environment", "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set without torchrun")
    if _has(env, "SLURM_NTASKS") and env.get("SLURM_JOB_NAME") not in _SLURM_INTERACTIVE:
        return _slurm(env)
    if all(_has(env, v) for v in _LSF_REQUIRED):
        return _lsf(env)
    if _has(env, "OMPI_COMM_WORLD_SIZE"):
        return _mpi(env, "Open MPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                      "OMPI_COMM_WORLD_LOCAL_SIZE"))
    if _has(env, "PMI_SIZE"):
        return _mpi(env, "MPICH/Intel MPI (Hydra)", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))
    if _has(env, "LOCAL_RANK"):
        return _generic(env, "environment", "LOCAL_RANK set without RANK/WORLD_SIZE")
    return JobEnv("none", None, None, None, None, None, None, None, "no launcher variables")


# ----------------------------------------------------------------------------------------------------- readers


def _has(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def _int(env: Mapping[str, str], name: str, what: str) -> int | None:
    """``name`` as a non-negative int, None when unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InitError(f"environment variable {name}={raw!r} is not an integer ({what}); fix or unset it") from None
    if value < 0:
        raise InitError(f"environment variable {name}={raw!r} is negative ({what}); fix or unset it")
    return value


def _port(raw: str, name: str) -> int:
    raw = raw.strip()
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise InitError(f"{name}={raw!r} is not a TCP port number (1..65535)")
    return int(raw)


def _master(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """``MASTER_ADDR`` / ``MASTER_PORT`` where set (each checked)."""
    addr = env.get("MASTER_ADDR", "").strip() or None
    port = _port(env["MASTER_PORT"], "MASTER_PORT") if _has(env, "MASTER_PORT") else None
    return addr, port


def _ints(env: Mapping[str, str], names: Sequence[str]) -> list[int | None]:
    """The rank, world size, local rank and ranks per node from the launcher's variables ``names``."""
    return [_int(env, name, what) for name, what in zip(names, _WHATS, strict=True)]


def _checked(job: JobEnv, names: Sequence[str]) -> JobEnv:
    """``job`` once its values agree with each other (``names``, as :func:`_ints` read them, named in the error)."""
    rank_var, size_var, local_var, local_size_var = names
    if job.world_size is not None and job.world_size < 1:
        raise InitError(f"world size must be >= 1, got {size_var}={job.world_size} ({job.source})")
    if job.rank is not None and job.world_size is not None and not job.rank < job.world_size:
        raise InitError(f"rank {job.rank} is outside [0, {job.world_size}) ({rank_var}={job.rank}, "
                        f"{size_var}={job.world_size}; {job.source})")
    if job.local_world_size is not None:
        if job.local_world_size < 1:
            raise InitError(f"{local_size_var}={job.local_world_size}: ranks per node must be >= 1 ({job.source})")
        if job.local_rank is not None and not job.local_rank < job.local_world_size:
            raise InitError(f"local rank {job.local_rank} is outside [0, {job.local_world_size}) ({local_var}="
                            f"{job.local_rank}, {local_size_var}={job.local_world_size}; {job.source})")
        if job.world_size is not None and job.local_world_size > job.world_size:
            raise InitError(f"{local_size_var}={job.local_world_size} exceeds {size_var}={job.world_size} "
                            f"({job.source})")
    return job


def _generic(env: Mapping[str, str], source: str, detail: str) -> JobEnv:
    """torchrun's variables (set by torchrun, or by another launcher that sets the same)."""
    addr, port = _master(env)
    node = _int(env, "GROUP_RANK", "this node's rank")
    if node is None:
        node = _int(env, "NODE_RANK", "this node's rank")  # Lightning's launcher sets NODE_RANK
    rank, size, local, local_size = _ints(env, _TORCHRUN)
    return _checked(JobEnv(source, rank, size, local, local_size, node, addr, port, detail), _TORCHRUN)


def _kubeflow(env: Mapping[str, str]) -> JobEnv:
    """Kubeflow's PyTorchJob without torchrun: one process per pod (Lightning's ``KubeflowEnvironment``: local rank
    0, node rank = rank). The training operator sets ``WORLD_SIZE`` to the number of pods (``envvar.go`` at
    kubeflow/training-operator 5fa872f) or, in later versions, pods x ``PET_NPROC_PER_NODE`` while ``RANK`` stays
    the pod's index: with more than one process per pod only torchrun (which reads ``PET_*``) can number them."""
    nproc = env.get("PET_NPROC_PER_NODE", "").strip()
    if nproc.isdigit() and int(nproc) > 1:
        raise InitError(
            f"Kubeflow PyTorchJob with PET_NPROC_PER_NODE={nproc}: WORLD_SIZE={env.get('WORLD_SIZE')} counts "
            "processes but RANK is the pod's index, so the ranks cannot be told from them. Start the pod's "
            "processes with torchrun (it reads PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK), or set "
            "nprocPerNode: 1"
        )
    addr, port = _master(env)
    rank = _int(env, "RANK", "the pod's index")
    job = JobEnv("kubeflow", rank, _int(env, "WORLD_SIZE", "the number of pods"), 0, 1, rank, addr, port,
                 "Kubeflow PyTorchJob (RANK, WORLD_SIZE, MASTER_ADDR/PORT; one process per pod)")
    return _checked(job, _TORCHRUN)


def _slurm(env: Mapping[str, str]) -> JobEnv:
    """srun's variables (Lightning's ``SLURMEnvironment``): the store on the first node of the node list, its port
    from the job id."""
    rank, size, local, local_size = _ints(env, _SLURM)
    node = _int(env, "SLURM_NODEID", "this node's index in the allocation")
    if local_size is None and _has(env, "SLURM_TASKS_PER_NODE"):
        counts = tasks_per_node(env["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE")
        if node is not None and node < len(counts):
            local_size = counts[node]
        elif len(set(counts)) == 1:
            local_size = counts[0]
    addr, port = _master(env)
    if addr is None:
        name = next((v for v in ("SLURM_NODELIST", "SLURM_JOB_NODELIST") if _has(env, v)), "")
        addr = first_node(env[name], name) if name else "127.0.0.1"
    if port is None:
        port = _SLURM_DEFAULT_PORT
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if job_id:
            if not job_id[-4:].isdigit():
                raise InitError(f"SLURM_JOB_ID={job_id!r} does not end in digits: the rendezvous port is derived "
                                "from them (15000 + the last four); set MASTER_PORT")
            port = 15000 + int(job_id[-4:])
    job = JobEnv("slurm", rank, size, local, local_size, node, addr, port,
                 f"Slurm job {env.get('SLURM_JOB_ID', '?')} (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, node list)")
    return _checked(job, _SLURM)


def _lsf(env: Mapping[str, str]) -> JobEnv:
    """jsrun's variables (Lightning's ``LSFEnvironment``): the store on the first compute host of the rank file
    (its first line is the launch node), its port ``10000 + LSB_JOBID % 1000``."""
    hosts = _rank_file(env["LSB_DJOB_RANKFILE"].strip())
    order = {host: i for i, host in enumerate(dict.fromkeys(hosts))}  # the nodes in order of first appearance
    port = _master(env)[1]  # LSF takes MASTER_PORT, never MASTER_ADDR (as Lightning)
    if port is None:
        port = 10000 + (_int(env, "LSB_JOBID", "the LSF job id") or 0) % 1000
    rank, size, local, local_size = _ints(env, _LSF)
    job = JobEnv("lsf", rank, size, local, local_size, order.get(socket.gethostname()), hosts[0], port,
                 f"LSF job {env.get('LSB_JOBID', '?')} (JSM_NAMESPACE_*, LSB_DJOB_RANKFILE)")
    return _checked(job, _LSF)


def _rank_file(path: str) -> list[str]:
    """The compute hosts of LSF's rank file: one host per line, the first line (the launch node) skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except OSError as exc:
        raise InitError(f"LSB_DJOB_RANKFILE={path!r} cannot be read ({exc.strerror}): LSF's jsrun sets it to the "
                        "job's host list") from None
    hosts = [h for h in lines[1:] if h]
    if not hosts:
        raise InitError(f"LSB_DJOB_RANKFILE={path!r} lists no compute host after the launch node")
    return hosts


def _mpi(env: Mapping[str, str], flavour: str, names: Sequence[str]) -> JobEnv:
    # No node index: Open MPI's OMPI_COMM_WORLD_NODE_RANK is the process's rank among those on its node.
    rank, size, local, local_size = _ints(env, names)
    addr, port = _master(env)
    one_node = size is not None and local_size == size
    if addr is None and one_node:
        addr = "127.0.0.1"
    if port is None and one_node:
        port = _port_from_id(env.get("OMPI_MCA_ess_base_jobid", "") or env.get("PMIX_NAMESPACE", ""))
    if (addr is None or port is None) and size is not None and size > 1:
        missing = " and ".join(n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None)
        raise InitError(
            f"{flavour} started this process but gives no rendezvous {missing}"
            f"{'' if one_node else ' for a job across nodes'}: export it to the ranks (Open MPI: mpirun -x "
            "MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500; MPICH/Intel MPI: mpirun -genv MASTER_ADDR ... "
            "-genv MASTER_PORT ...), or pass init_method='tcp://host:port' to xccl.init"
        )
    job = JobEnv("mpi", rank, size, local, local_size, None, addr, port, f"{flavour} ({', '.join(names)})")
    return _checked(job, names)


def _port_from_id(job_id: str) -> int | None:
    """A port every rank of one job derives alike: Slurm's rule (15000 + the last four digits) on a numeric id,
    else a hash of it into the same range; None without an id."""
    job_id = job_id.strip()
    if not job_id:
        return None
    if job_id[-4:].isdigit():
        return 15000 + int(job_id[-4:])
    return 15000 + zlib.crc32(job_id.encode()) % 10000


# ----------------------------------------------------------------------------------------------------- parsers

_RANGE: Final = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT: Final = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def first_node(nodes: str, name: str = "SLURM_NODELIST") -> str:
    """The first host of a Slurm node list: ``"node[001-004,007],gpu1"`` -> ``"node001"``, ``"rack[1-2]-n[3,5]"``
    -> ``"rack1-n3"``, ``"h0 h1"`` -> ``"h0"``.

    Lightning's ``resolve_root_node_address`` does this with two regular expressions, which take the first name of
    each list but fail on names with two bracket groups; this parser also rejects what Slurm would not produce.

    Raises:
        InitError: an empty list, an unbalanced bracket or a malformed range (``name`` is the variable).
    """
    text = nodes.strip().split(" ")[0]
    first, depth = [], 0
    for ch in text:
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise InitError(f"{name}={nodes!r} is not a Slurm node list: unbalanced brackets")
        first.append(ch)
    if depth != 0:
        raise InitError(f"{name}={nodes!r} is not a Slurm node list: unbalanced brackets")
    host = "".join(first)

    def expand(m: re.Match[str]) -> str:
        head = m.group(1).split(",")[0]
        r = _RANGE.match(head)
        if r is None or (r.group(2) is not None and int(r.group(2)) < int(r.group(1))):
            raise InitError(f"{name}={nodes!r} is not a Slurm node list: bad range [{m.group(1)}]")
        return r.group(1)

    host = re.sub(r"\[([^\]]*)\]", expand, host)
    if not host or "[" in host or "]" in host:
        raise InitError(f"{name}={nodes!r} is not a Slurm node list (e.g. node[001-004,007])")
    return host


def tasks_per_node(spec: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's per-node task counts, expanded: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        InitError: not of that form (``name`` is the variable).
    """
    counts: list[int] = []
    for part in spec.strip().split(","):
        m = _COUNT.match(part.strip())
        if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise InitError(f"{name}={spec!r} is not a Slurm task count list (e.g. \"2(x3),1\")")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts
