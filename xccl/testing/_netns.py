"""Hosts in network namespaces: multi-node jobs on one Linux machine, and the faults that matter across nodes.

:class:`Hosts` builds ``n`` isolated "hosts": a network namespace each, with its own address in a private /24 that
exists only on this machine (``10.A.B.0/24`` with ``A`` in 213..250, chosen at random among ranges no interface
here uses), joined by a Linux bridge in the root namespace through one veth pair per host. Every process started
on a host runs under ``ip netns exec`` (and, where ``unshare`` exists, in its own UTS namespace with its own
hostname, which ``/etc/netns/<ns>/hosts`` resolves to its address): to torch and xccl it is a separate machine
that reaches the others only over that network. Nothing can leave the machine: the namespaces have no route
beyond their /24.

On top of that:

* :meth:`Hosts.run_torchrun` starts ``torchrun --nnodes N --nproc-per-node P`` on each host with the c10d (or
  static) rendezvous on host 0, and :meth:`Hosts.run_ranks` starts the ranks directly with torchrun's
  environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), for tests that need xccl's own rendezvous to be
  the one that waits. Both return a :class:`Job`: the programs write results as JSON files into ``job.out``.
* faults: :meth:`Hosts.kill_host` (SIGKILL every process of a host), :meth:`Hosts.link_down` (unplug its cable),
  :meth:`Hosts.delay` (``tc netem`` delay on its egress; where the kernel has no ``sch_netem``, the same delay
  from a small user-space relay spliced between the host and the bridge).

Everything is torn down on exit from the ``with`` block, on an exception, and at interpreter exit (``atexit``);
what an earlier run killed before its teardown left (its pid is in every name) is swept on the next start. Every
wait is bounded. Needs root and iproute2; :class:`NetnsUnavailable` says why not.

This module imports nothing but the standard library: it also runs as a script (the relay process).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["Host", "Hosts", "Job", "NetnsUnavailable", "unavailable_reason"]

#: Every name this module creates starts with these; the pid of the creating process follows.
NS_PREFIX: Final = "xccl"
LINK_ALIAS: Final = "xccl-netns"
#: Second octets of the ranges tried: 10.213.0.0/16 .. 10.250.0.0/16.
_OCTETS: Final = range(213, 251)
#: Each wait on a short command.
_CMD_TIMEOUT: Final = 20.0
#: Port of the rendezvous (every host has its own port space, so a fixed port cannot clash).
RDZV_PORT: Final = 29400
MASTER_PORT: Final = 29500
#: What the program's environment must not inherit from the test's.
_SCRUB: Final = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|ROLE_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|"
    r"XCCL_.*|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME|PYTEST_.*)$"
)

_SEQ = 0
_LIVE: list[Hosts] = []
_LOCK = threading.Lock()


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, no kernel support); the message says why."""


def unavailable_reason() -> str | None:
    """Why :class:`Hosts` cannot work here, as far as can be told without creating anything; None if it may."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (`ip netns add`); run as root, e.g. in a CI container"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if not Path("/proc/self/ns/net").exists():
        return "the kernel has no network namespaces (/proc/self/ns/net is missing)"
    return None


# ------------------------------------------------------------------------------------------------ commands


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = _CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(argv)}: no answer within {timeout:g} s") from exc
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *(["-n", ns] if ns else []), *args], check=check)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_sysctl(path: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).write_text(value)


# ethtool through its ioctl (the ethtool program is often not installed): struct ethtool_value {u32 cmd, data}.
_SIOCETHTOOL: Final = 0x8946
_ETHTOOL_STXCSUM: Final = 0x17
_ETHTOOL_STSO: Final = 0x1F
_ETHTOOL_SGSO: Final = 0x24


def _ethtool_off(ifname: str, *cmds: int) -> None:
    """Turn features off on ``ifname`` (in this namespace). Raises OSError if the kernel refuses."""
    import ctypes

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for cmd in cmds:
            value = (ctypes.c_uint32 * 2)(cmd, 0)
            ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            fcntl.ioctl(s.fileno(), _SIOCETHTOOL, ifreq)


# ------------------------------------------------------------------------------------------------ stale runs


def _sweep_stale() -> None:
    """Remove what runs that died before their teardown left: namespaces and links named after a dead pid."""
    out = _ip("netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{NS_PREFIX}-(\d+)-\d+-h\d+$", name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_ns_pids(name)
            _ip("netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        m = re.search(rf"alias {LINK_ALIAS}:(\d+)", line)
        if m and not _pid_alive(int(m.group(1))):
            dev = line.split(":")[1].strip().split("@")[0]
            _ip("link", "del", dev, check=False)
    with contextlib.suppress(OSError):
        for d in Path("/etc/netns").iterdir():
            m = re.match(rf"^{NS_PREFIX}-(\d+)-\d+-h\d+$", d.name)
            if m and not _pid_alive(int(m.group(1))):
                shutil.rmtree(d, ignore_errors=True)


def _ns_pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_ns_pids(ns: str, rounds: int = 5) -> None:
    for _ in range(rounds):
        pids = _ns_pids(ns)
        if not pids:
            return
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)


def _ranges_in_use() -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            nets.append(ipaddress.IPv4Interface(m.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        tok = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if tok not in ("default", "broadcast", "local", "unreachable"):
                nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


def _pick_subnet(rng: random.Random) -> str:
    """``"10.A.B"`` of a /24 that no interface or route here overlaps."""
    used = _ranges_in_use()
    for _ in range(200):
        prefix = f"10.{rng.choice(_OCTETS)}.{rng.randrange(256)}"
        net = ipaddress.IPv4Network(f"{prefix}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return prefix
    raise NetnsUnavailable("no free /24 in 10.213.0.0-10.250.255.0 (every one tried is in use here)")


# ------------------------------------------------------------------------------------------------ the hosts


@dataclass(frozen=True)
class Host:
    """One namespaced host."""

    index: int
    #: The network namespace.
    ns: str
    #: Its address (``10.A.B.(10 + index)``).
    addr: str
    #: Its hostname (resolves to ``addr`` inside every host of the set).
    hostname: str
    #: Its interface, inside the namespace (what ``GLOO_SOCKET_IFNAME`` names).
    ifname: str
    #: The root-namespace end of its veth pair (its "cable").
    cable: str


@dataclass
class Job:
    """Processes started on some hosts for one program; results come back as files in ``out``."""

    hosts: Hosts
    #: The job's directory: the program's ``$XCCL_NETNS_OUT``, with each process's command and output.
    out: Path
    #: (host index, process) per started process: one torchrun agent per host, or one process per rank.
    procs: list[tuple[int, subprocess.Popen[bytes]]]
    #: Each process's output file, in ``procs`` order.
    logs: list[Path]
    started: float = field(default_factory=time.time)
    #: Indices (into ``procs``) of the processes :meth:`wait` had to kill at its deadline.
    hung: list[int] = field(default_factory=list)
    #: Index into ``procs`` -> ``time.time()`` at which :meth:`wait_exit` saw the process end.
    exits: dict[int, float] = field(default_factory=dict)

    def wait(self, timeout: float) -> list[int | None]:
        """Wait at most ``timeout`` seconds in all for every process; kill (and list in ``hung``) those still
        running then, with everything else on their host. Returns the exit codes in ``procs`` order (None: killed
        at the deadline)."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for i, (host, p) in enumerate(self.procs):
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.hung.append(i)
                _killpg(p)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
                codes.append(None)
                self.hosts.kill_host(host)
        return codes

    def wait_exit(self, timeout: float, poll: float = 0.05) -> dict[int, float]:
        """Wait at most ``timeout`` s for every process, noting in ``exits`` when each ended; kills nothing.
        Returns ``exits``."""
        deadline = time.monotonic() + timeout
        pending = {i for i in range(len(self.procs)) if i not in self.exits}
        while pending and time.monotonic() < deadline:
            for i in list(pending):
                if self.procs[i][1].poll() is not None:
                    self.exits[i] = time.time()
                    pending.discard(i)
            time.sleep(poll)
        return dict(self.exits)

    def wait_files(self, pattern: str, count: int, timeout: float) -> list[Path]:
        """Wait at most ``timeout`` s until ``count`` files match ``pattern`` in ``out`` (or every process ended);
        returns those that do."""
        deadline = time.monotonic() + timeout
        found: list[Path] = []
        while time.monotonic() < deadline:
            found = sorted(self.out.glob(pattern))
            if len(found) >= count or all(p.poll() is not None for _, p in self.procs):
                break
            time.sleep(0.1)
        return sorted(self.out.glob(pattern))

    def results(self, pattern: str = "rank-*.json") -> dict[int, dict[str, Any]]:
        """Every rank's result file (JSON with a ``rank`` field), by rank."""
        res: dict[int, dict[str, Any]] = {}
        for f in sorted(self.out.glob(pattern)):
            with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
                data = json.loads(f.read_text())
                res[int(data["rank"])] = data
        return res

    def log(self, tail: int = 6000) -> str:
        """The last ``tail`` characters of every process's output, for assertion messages."""
        parts = []
        for (host, _), path in zip(self.procs, self.logs, strict=True):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"----- host {host}: {path.name}\n{text[-tail:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """SIGKILL every process of the job (and its process group) and reap it."""
        for _, p in self.procs:
            _killpg(p)
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def _killpg(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        p.kill()


class Hosts:
    """``n`` namespaced hosts on one bridge; a context manager that tears everything down on exit.

    Example::

        with Hosts(2) as hosts:
            job = hosts.run_torchrun("prog.py", nproc=2)
            codes = job.wait(timeout=120)
            print(job.results())

    Args:
        n: number of hosts (at least 1).
        workdir: where jobs write their output (default: a new temporary directory, removed at teardown).
        seed: seeds the choice of address range (default: random).

    Raises:
        NetnsUnavailable: not root, no iproute2, or the kernel refused to create a namespace, veth or bridge.
    """

    def __init__(self, n: int, *, workdir: str | os.PathLike[str] | None = None, seed: int | None = None) -> None:
        global _SEQ
        if n < 1:
            raise ValueError(f"n={n}: at least one host")
        with _LOCK:
            _SEQ += 1
            seq = _SEQ
        pid = os.getpid()
        self.n = n
        self.token = f"xc{pid:x}{seq:x}"  # <= 10 chars: interface names stay within 15
        self.ns_base = f"{NS_PREFIX}-{pid}-{seq}"
        self._rng = random.Random(seed)
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="xccl-netns-")) if workdir is None else Path(workdir)
        self.bridge = f"{self.token}br"
        self.subnet = ""
        self.hosts: list[Host] = []
        self.uts = shutil.which("unshare") is not None
        self._created_ns: list[str] = []
        self._links: list[str] = []
        self._relays: dict[int, subprocess.Popen[bytes]] = {}
        self._jobs: list[Job] = []
        self._torn_down = False
        self._jobseq = 0
        #: How each host's egress delay was applied ("netem" or "relay"), by host index.
        self.delays: dict[int, str] = {}
        self._offloads_off = True

    # -------------------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> Hosts:
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        with _LOCK:
            _LIVE.append(self)
        try:
            self._setup()
        except BaseException as exc:
            self.teardown()
            if isinstance(exc, (RuntimeError, OSError)) and not isinstance(exc, NetnsUnavailable):
                raise NetnsUnavailable(f"could not create the namespaced hosts: {exc}") from exc
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def _alias(self, dev: str) -> None:
        _ip("link", "set", "dev", dev, "alias", f"{LINK_ALIAS}:{os.getpid()}", check=False)

    def _setup(self) -> None:
        _sweep_stale()
        self.subnet = _pick_subnet(self._rng)
        _ip("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        self._alias(self.bridge)
        # The bridge's address marks the range as taken for concurrent runs (they check `ip -4 addr`).
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        names = [f"xccl-host{i}" for i in range(self.n)]
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{self.subnet}.{10 + i} {names[i]}\n" for i in range(self.n)
        )
        for i in range(self.n):
            ns = f"{self.ns_base}-h{i}"
            cable, inner, ifname = f"{self.token}h{i}", f"{self.token}n{i}", f"xv{i}n"
            _ip("netns", "add", ns)
            self._created_ns.append(ns)
            # `ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts: every hostname resolves in every host.
            # Nothing needs it but name lookups (everything here is told addresses), so a read-only /etc is fine.
            with contextlib.suppress(OSError):
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts_file)
            _ip("link", "add", cable, "type", "veth", "peer", "name", inner)
            self._links.append(cable)
            self._alias(cable)
            # Checksums and segmentation in software on the host's side, so that frames on the wire are complete
            # and MTU-sized: what a user-space relay (delay()) can forward as they are.
            try:
                _ethtool_off(inner, _ETHTOOL_STXCSUM, _ETHTOOL_STSO, _ETHTOOL_SGSO)
            except OSError:
                self._offloads_off = False
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", inner, "name", ifname, ns=ns)
            _ip("addr", "add", f"{self.subnet}.{10 + i}/24", "dev", ifname, ns=ns)
            _ip("link", "set", ifname, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", cable, "master", self.bridge, "up")
            self.hosts.append(Host(i, ns, f"{self.subnet}.{10 + i}", names[i], ifname, cable))
        self._check_reachable()

    def _check_reachable(self, timeout: float = 15.0) -> None:
        """Every host reaches host 0's address (a TCP connect to a closed port is refused: that is an answer)."""
        probe = (
            "import socket,sys,time\n"
            "end=time.monotonic()+float(sys.argv[2])\n"
            "while time.monotonic()<end:\n"
            "    s=socket.socket(); s.settimeout(1)\n"
            "    try: s.connect((sys.argv[1],9)); sys.exit(0)\n"
            "    except ConnectionRefusedError: sys.exit(0)\n"
            "    except OSError: time.sleep(0.1)\n"
            "    finally: s.close()\n"
            "sys.exit(1)\n"
        )
        for h in self.hosts[1:]:
            out = _run(["ip", "netns", "exec", h.ns, sys.executable, "-S", "-c", probe, self.hosts[0].addr,
                        str(timeout)], check=False, timeout=timeout + 10)
            if out.returncode != 0:
                raise NetnsUnavailable(f"host {h.index} ({h.addr}) cannot reach host 0 ({self.hosts[0].addr}) over "
                                       f"the test bridge: {out.stderr.strip()}")

    def teardown(self) -> list[str]:
        """Kill every process started on the hosts, stop relays, delete namespaces, links and files.

        Idempotent; never raises. Returns what could not be removed (empty when all went).
        """
        if self._torn_down:
            return []
        self._torn_down = True
        problems: list[str] = []
        for job in self._jobs:
            with contextlib.suppress(Exception):
                job.kill()
        for relay in self._relays.values():
            _killpg(relay)
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(timeout=5)
        for ns in self._created_ns:
            try:
                _kill_ns_pids(ns)
                _ip("netns", "del", ns, check=False)
            except Exception as exc:
                problems.append(f"namespace {ns}: {exc}")
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for dev in reversed(self._links):
            with contextlib.suppress(Exception):
                _ip("link", "del", dev, check=False)
        try:
            left = _ip("-o", "link", "show", check=False).stdout
            problems += [f"link {d} is still there" for d in self._links if re.search(rf"\d+: {d}[@:]", left)]
            ns_left = _ip("netns", "list", check=False).stdout
            problems += [f"namespace {ns} is still there" for ns in self._created_ns if ns in ns_left.split()]
        except Exception as exc:
            problems.append(f"could not list what is left: {exc}")
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        with _LOCK, contextlib.suppress(ValueError):
            _LIVE.remove(self)
        return problems

    # -------------------------------------------------------------------------------------------- processes

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on host ``i``: in its namespace, with its hostname (where ``unshare`` exists)."""
        h = self.hosts[i]
        prefix = ["ip", "netns", "exec", h.ns]
        if self.uts:
            return [*prefix, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', h.hostname, *argv]
        return [*prefix, *argv]

    def env(self, i: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on host ``i``: the test's minus launcher and xccl variables, plus the
        host's interface for gloo, one OpenMP thread, and ``extra``."""
        env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(
            GLOO_SOCKET_IFNAME=self.hosts[i].ifname,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            XCCL_NETNS_HOST=str(i),
            XCCL_NETNS_ADDR=self.hosts[i].addr,
        )
        env.update(extra or {})
        return env

    def popen(self, i: int, argv: Sequence[str], *, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``i`` in a new session, output to ``log``."""
        with open(log, "ab") as f:
            return subprocess.Popen(
                self.command(i, argv), env=dict(env), stdout=f, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def _new_job_dir(self, name: str) -> Path:
        self._jobseq += 1
        out = self.workdir / f"job{self._jobseq}-{name}"
        out.mkdir(parents=True)
        return out

    def run_torchrun(
        self,
        program: str | os.PathLike[str],
        *,
        nproc: int = 2,
        hosts: Sequence[int] | None = None,
        nnodes: int | None = None,
        rdzv: str = "c10d",
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host_env: Mapping[int, Mapping[str, str]] | None = None,
        max_restarts: int = 0,
        rdzv_timeout: float = 60.0,
        name: str = "torchrun",
    ) -> Job:
        """Start ``torchrun ... program args`` on each of ``hosts`` (default: all), the rendezvous on host 0.

        Args:
            program: the Python file every rank runs.
            nproc: ranks per host (``--nproc-per-node``).
            hosts: host indices to start it on (a host left out never arrives).
            nnodes: ``--nnodes`` (default: the number of hosts of the set).
            rdzv: ``"c10d"`` (``--rdzv-backend c10d --rdzv-endpoint host0:29400``; node ranks in order of
                arrival) or ``"static"`` (``--master-addr host0 --node-rank i``).
            args: the program's arguments.
            env: extra environment of every process; ``host_env``: per host index, on top.
            max_restarts: torchrun's ``--max-restarts`` (0: an agent exits when one of its workers fails).
            rdzv_timeout: c10d's join timeout (seconds).
            name: names the job's output directory.

        The program's environment has ``XCCL_NETNS_OUT`` (the job's output directory), ``XCCL_NETNS_HOST`` and
        ``XCCL_NETNS_ADDR``, besides what torchrun sets.
        """
        which = list(range(self.n)) if hosts is None else list(hosts)
        nnodes = self.n if nnodes is None else nnodes
        out = self._new_job_dir(name)
        torchrun = Path(sys.executable).parent / "torchrun"
        launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
        h0 = self.hosts[0].addr
        procs: list[tuple[int, subprocess.Popen[bytes]]] = []
        logs: list[Path] = []
        run_id = f"{self.token}-{self._jobseq}"
        for i in which:
            h = self.hosts[i]
            common = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                      "--monitor-interval=0.2", f"--local-addr={h.addr}"]
            if rdzv == "c10d":
                conf = f"is_host={'1' if i == 0 else '0'},join_timeout={int(rdzv_timeout)},read_timeout=30"
                rd = ["--rdzv-backend=c10d", f"--rdzv-endpoint={h0}:{RDZV_PORT}", f"--rdzv-id={run_id}",
                      f"--rdzv-conf={conf}"]
            elif rdzv == "static":
                rd = [f"--master-addr={h0}", f"--master-port={MASTER_PORT}", f"--node-rank={i}"]
            else:
                raise ValueError(f"rdzv={rdzv!r}: 'c10d' or 'static'")
            argv = [*launcher, *common, *rd, str(program), *args]
            penv = self.env(i, {**(env or {}), **(host_env or {}).get(i, {}), "XCCL_NETNS_OUT": str(out)})
            log = out / f"host{i}.log"
            (out / f"host{i}.cmd").write_text(" ".join(argv) + "\n")
            procs.append((i, self.popen(i, argv, env=penv, log=log)))
            logs.append(log)
        job = Job(self, out, procs, logs)
        self._jobs.append(job)
        return job

    def run_ranks(
        self,
        program: str | os.PathLike[str],
        *,
        nproc: int = 2,
        hosts: Sequence[int] | None = None,
        world_size: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host_env: Mapping[int, Mapping[str, str]] | None = None,
        name: str = "ranks",
    ) -> Job:
        """Start ``python program args`` once per rank, with the environment torchrun would set, and no agent.

        Host ``i`` runs global ranks ``i * nproc .. i * nproc + nproc - 1``; ``MASTER_ADDR`` is host 0.
        ``WORLD_SIZE`` is ``world_size`` (default ``n * nproc``; ``host_env`` may override it per host). Nothing
        waits for the other hosts but ``xccl.init``'s own rendezvous.
        """
        which = list(range(self.n)) if hosts is None else list(hosts)
        world = self.n * nproc if world_size is None else world_size
        out = self._new_job_dir(name)
        procs: list[tuple[int, subprocess.Popen[bytes]]] = []
        logs: list[Path] = []
        for i in which:
            for local in range(nproc):
                rank = i * nproc + local
                penv = self.env(i, {
                    "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(i),
                    "MASTER_ADDR": self.hosts[0].addr, "MASTER_PORT": str(MASTER_PORT),
                    **(env or {}), **(host_env or {}).get(i, {}), "XCCL_NETNS_OUT": str(out),
                })
                log = out / f"host{i}-rank{rank}.log"
                procs.append((i, self.popen(i, [sys.executable, str(program), *args], env=penv, log=log)))
                logs.append(log)
        job = Job(self, out, procs, logs)
        self._jobs.append(job)
        return job

    # -------------------------------------------------------------------------------------------- faults

    def kill_host(self, i: int) -> float:
        """SIGKILL every process in host ``i``'s namespace (a power loss); returns ``time.time()`` of the kill."""
        ns = self.hosts[i].ns
        pids = _ns_pids(ns)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        at = time.time()
        _kill_ns_pids(ns)  # anything that was starting in between
        return at

    def link_down(self, i: int) -> float:
        """Take host ``i``'s cable down (a partition: its processes live on, unreachable); returns the time."""
        _ip("link", "set", self.hosts[i].cable, "down")
        return time.time()

    def link_up(self, i: int) -> float:
        """Plug host ``i``'s cable back in; returns the time."""
        _ip("link", "set", self.hosts[i].cable, "up")
        return time.time()

    def delay(self, i: int, ms: float) -> str:
        """Delay every frame host ``i`` sends by ``ms`` milliseconds (its egress, as ``netem`` on its interface).

        Uses ``tc qdisc ... netem delay``; where the kernel has no ``sch_netem``, splices a user-space relay
        between host ``i``'s cable and the bridge that holds each outgoing frame for ``ms`` (it costs bandwidth:
        every frame crosses Python). Calling it again changes the delay (``0``: none, the relay staying in the
        path). Returns how it is applied, ``"netem"`` or ``"relay"`` (also in ``delays``).
        """
        h = self.hosts[i]
        how = self.delays.get(i)
        if how == "relay":
            self._set_relay_delay(i, ms)
            return how
        verb = "change" if how == "netem" else "add"
        out = _ip("netns", "exec", h.ns, "tc", "qdisc", verb, "dev", h.ifname, "root", "netem", "delay",
                  f"{ms:g}ms", check=False)
        if out.returncode == 0:
            self.delays[i] = "netem"
            return "netem"
        if how == "netem" or "unknown" not in (out.stderr + out.stdout).lower():
            raise RuntimeError(f"tc netem on host {i} failed: {out.stderr.strip()}")
        if not self._offloads_off:
            raise RuntimeError("the kernel has no sch_netem, and checksum offload could not be turned off on the "
                               "hosts' interfaces, which the user-space relay needs")
        self._splice_relay(i, ms)
        self.delays[i] = "relay"
        return "relay"

    def _set_relay_delay(self, i: int, ms: float) -> None:
        control = self.workdir / f"relay{i}.delay"
        ack = self.workdir / f"relay{i}.delay.ack"
        value = f"{ms / 1000.0:g}"
        tmp = control.with_suffix(".tmp")
        tmp.write_text(value)
        os.replace(tmp, control)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if ack.read_text() == value:
                    return
            if self._relays[i].poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the delay relay of host {i} did not take the new delay {ms:g} ms")

    def _splice_relay(self, i: int, ms: float) -> None:
        h = self.hosts[i]
        near, far = f"{self.token}d{i}", f"{self.token}e{i}"
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        self._links.append(near)
        self._alias(near)
        self._alias(far)
        for dev in (h.cable, near):
            # The relay's ports carry the host's traffic, not the root namespace's: no ARP answers, no IPv6.
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{dev}/arp_ignore", "8")
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "1")
            _ip("link", "set", dev, "promisc", "on")
        with contextlib.suppress(OSError):
            _ethtool_off(near, _ETHTOOL_STXCSUM, _ETHTOOL_STSO, _ETHTOOL_SGSO)
        _ip("link", "set", near, "up")
        _ip("link", "set", far, "master", self.bridge, "up")
        control = self.workdir / f"relay{i}.delay"
        control.write_text(f"{ms / 1000.0:g}")
        log = open(self.workdir / f"relay{i}.log", "ab")  # noqa: SIM115 - the relay's own output, closed below
        try:
            relay = subprocess.Popen(
                [sys.executable, "-S", str(Path(__file__).resolve()), "relay", h.cable, near, str(control),
                 "3600", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            log.close()
        self._relays[i] = relay
        ready = self.workdir / f"relay{i}.log"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"relaying" not in ready.read_bytes():
            if relay.poll() is not None:
                raise RuntimeError(f"the delay relay of host {i} exited: {ready.read_text(errors='replace')}")
            time.sleep(0.05)
        # Only now move the host's cable off the bridge: from here its frames go through the relay.
        _ip("link", "set", h.cable, "nomaster")
        _ip("link", "set", h.cable, "up")


# ------------------------------------------------------------------------------------------------ the relay

_ETH_P_ALL: Final = 0x0003
_PACKET_OUTGOING: Final = 4


def _relay(inner: str, outer: str, control: str, lifetime: float, parent: int) -> int:
    """Forward Ethernet frames between ``inner`` (a host's cable) and ``outer`` (towards the bridge): frames
    from the host are held for the delay in seconds that the file ``control`` holds (re-read when it changes;
    acknowledged in ``control.ack``), frames to it pass at once. Ends after ``lifetime`` seconds or when
    ``parent`` is gone."""
    proto = socket.htons(_ETH_P_ALL)
    a = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, proto)
    b = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, proto)
    a.bind((inner, _ETH_P_ALL))
    b.bind((outer, _ETH_P_ALL))
    for s in (a, b):
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)

    def read_delay() -> tuple[float, str]:
        try:
            raw = Path(control).read_text().strip()
            value = float(raw)
        except (OSError, ValueError):
            return -1.0, ""
        tmp = f"{control}.ack.tmp"
        Path(tmp).write_text(raw)
        os.replace(tmp, f"{control}.ack")
        return value, raw

    delay, raw = read_delay()
    if delay < 0:
        print(f"relay: no delay in {control}", flush=True)
        return 2
    held: deque[tuple[float, bytes]] = deque()
    end = time.monotonic() + lifetime
    sent = dropped = 0
    print(f"relaying {inner} -> {outer} with {delay * 1000:g} ms", flush=True)
    next_check = 0.0
    while True:
        now = time.monotonic()
        if now > end:
            break
        if now > next_check:
            if not _pid_alive(parent):
                break
            with contextlib.suppress(OSError):
                if Path(control).read_text().strip() != raw:
                    new, raw = read_delay()
                    if new >= 0:
                        delay = new
                        print(f"delay now {delay * 1000:g} ms", flush=True)
            next_check = now + 0.2
        wait = 0.2 if not held else min(0.2, max(0.0, held[0][0] - now))
        ready, _, _ = select.select([a, b], [], [], wait)
        if a in ready:
            for _ in range(4096):
                try:
                    data, addr = a.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] != _PACKET_OUTGOING:
                    held.append((time.monotonic() + delay, data))
        if b in ready:
            for _ in range(4096):
                try:
                    data, addr = b.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] != _PACKET_OUTGOING:
                    try:
                        a.send(data)
                        sent += 1
                    except OSError:
                        dropped += 1
        now = time.monotonic()
        while held and held[0][0] <= now:
            try:
                b.send(held.popleft()[1])
                sent += 1
            except OSError:
                dropped += 1
    print(f"relay done: {sent} frames forwarded, {dropped} dropped", flush=True)
    return 0


def _teardown_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for hosts in live:
        with contextlib.suppress(Exception):
            hosts.teardown()


atexit.register(_teardown_all)


def _main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "relay":
        return _relay(argv[1], argv[2], argv[3], float(argv[4]), int(argv[5]))
    print("usage: _netns.py relay INNER OUTER DELAY_FILE LIFETIME_S PARENT_PID", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
