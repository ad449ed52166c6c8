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

Standard library only, split in three: this module (the hosts, faults), :mod:`._jobs` (launching, the
:class:`Job`) and :mod:`._sys` (commands and the delay relay, which also runs as a script).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import _sys
from ._jobs import MASTER_PORT, RDZV_PORT, Job, killpg, run_ranks, run_torchrun
from ._sys import (
    ETHTOOL_SGSO,
    ETHTOOL_STSO,
    ETHTOOL_STXCSUM,
    ethtool_off,
    ip,
    kill_ns_pids,
    ns_pids,
    pid_alive,
    ranges_in_use,
    run,
    write_sysctl,
)

__all__ = ["MASTER_PORT", "RDZV_PORT", "Host", "Hosts", "Job", "NetnsUnavailable", "unavailable_reason"]

#: Every name this module creates starts with these; the pid of the creating process follows.
NS_PREFIX: Final = "xccl"
LINK_ALIAS: Final = "xccl-netns"
#: Second octets of the ranges tried: 10.213.0.0/16 .. 10.250.0.0/16.
_OCTETS: Final = range(213, 251)
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


# ------------------------------------------------------------------------------------------------ stale runs


def _sweep_stale() -> None:
    """Remove what runs that died before their teardown left: namespaces and links named after a dead pid."""
    out = ip("netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{NS_PREFIX}-(\d+)-\d+-h\d+$", name)
        if m and not pid_alive(int(m.group(1))):
            kill_ns_pids(name)
            ip("netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    links = ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        m = re.search(rf"alias {LINK_ALIAS}:(\d+)", line)
        if m and not pid_alive(int(m.group(1))):
            dev = line.split(":")[1].strip().split("@")[0]
            ip("link", "del", dev, check=False)
    with contextlib.suppress(OSError):
        for d in Path("/etc/netns").iterdir():
            m = re.match(rf"^{NS_PREFIX}-(\d+)-\d+-h\d+$", d.name)
            if m and not pid_alive(int(m.group(1))):
                shutil.rmtree(d, ignore_errors=True)


def _pick_subnet(rng: random.Random) -> str:
    """``"10.A.B"`` of a /24 that no interface or route here overlaps."""
    used = ranges_in_use()
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
        ip("link", "set", "dev", dev, "alias", f"{LINK_ALIAS}:{os.getpid()}", check=False)

    def _setup(self) -> None:
        _sweep_stale()
        self.subnet = _pick_subnet(self._rng)
        ip("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        self._alias(self.bridge)
        # The bridge's address marks the range as taken for concurrent runs (they check `ip -4 addr`).
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        names = [f"xccl-host{i}" for i in range(self.n)]
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{self.subnet}.{10 + i} {names[i]}\n" for i in range(self.n)
        )
        for i in range(self.n):
            ns = f"{self.ns_base}-h{i}"
            cable, inner, ifname = f"{self.token}h{i}", f"{self.token}n{i}", f"xv{i}n"
            ip("netns", "add", ns)
            self._created_ns.append(ns)
            # `ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts: every hostname resolves in every host.
            # Nothing needs it but name lookups (everything here is told addresses), so a read-only /etc is fine.
            with contextlib.suppress(OSError):
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts_file)
            ip("link", "add", cable, "type", "veth", "peer", "name", inner)
            self._links.append(cable)
            self._alias(cable)
            # Checksums and segmentation in software on the host's side, so that frames on the wire are complete
            # and MTU-sized: what a user-space relay (delay()) can forward as they are.
            try:
                ethtool_off(inner, ETHTOOL_STXCSUM, ETHTOOL_STSO, ETHTOOL_SGSO)
            except OSError:
                self._offloads_off = False
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", inner, "name", ifname, ns=ns)
            ip("addr", "add", f"{self.subnet}.{10 + i}/24", "dev", ifname, ns=ns)
            ip("link", "set", ifname, "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
            ip("link", "set", cable, "master", self.bridge, "up")
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
            out = run(["ip", "netns", "exec", h.ns, sys.executable, "-S", "-c", probe, self.hosts[0].addr,
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
            killpg(relay)
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(timeout=5)
        for ns in self._created_ns:
            try:
                kill_ns_pids(ns)
                ip("netns", "del", ns, check=False)
            except Exception as exc:
                problems.append(f"namespace {ns}: {exc}")
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for dev in reversed(self._links):
            with contextlib.suppress(Exception):
                ip("link", "del", dev, check=False)
        try:
            left = ip("-o", "link", "show", check=False).stdout
            problems += [f"link {d} is still there" for d in self._links if re.search(rf"\d+: {d}[@:]", left)]
            ns_left = ip("netns", "list", check=False).stdout
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

    run_torchrun = run_torchrun
    run_ranks = run_ranks

    # -------------------------------------------------------------------------------------------- faults

    def kill_host(self, i: int) -> float:
        """SIGKILL every process in host ``i``'s namespace (a power loss); returns ``time.time()`` of the kill."""
        ns = self.hosts[i].ns
        pids = ns_pids(ns)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        at = time.time()
        kill_ns_pids(ns)  # anything that was starting in between
        return at

    def link_down(self, i: int) -> float:
        """Take host ``i``'s cable down (a partition: its processes live on, unreachable); returns the time."""
        ip("link", "set", self.hosts[i].cable, "down")
        return time.time()

    def link_up(self, i: int) -> float:
        """Plug host ``i``'s cable back in; returns the time."""
        ip("link", "set", self.hosts[i].cable, "up")
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
        out = ip("netns", "exec", h.ns, "tc", "qdisc", verb, "dev", h.ifname, "root", "netem", "delay",
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
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        self._links.append(near)
        self._alias(near)
        self._alias(far)
        for dev in (h.cable, near):
            # The relay's ports carry the host's traffic, not the root namespace's: no ARP answers, no IPv6.
            write_sysctl(f"/proc/sys/net/ipv4/conf/{dev}/arp_ignore", "8")
            write_sysctl(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "1")
            ip("link", "set", dev, "promisc", "on")
        with contextlib.suppress(OSError):
            ethtool_off(near, ETHTOOL_STXCSUM, ETHTOOL_STSO, ETHTOOL_SGSO)
        ip("link", "set", near, "up")
        ip("link", "set", far, "master", self.bridge, "up")
        control = self.workdir / f"relay{i}.delay"
        control.write_text(f"{ms / 1000.0:g}")
        log = open(self.workdir / f"relay{i}.log", "ab")  # noqa: SIM115 - the relay's own output, closed below
        try:
            relay = subprocess.Popen(
                [sys.executable, "-S", str(Path(_sys.__file__).resolve()), "relay", h.cable, near, str(control),
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
        ip("link", "set", h.cable, "nomaster")
        ip("link", "set", h.cable, "up")



def _teardown_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for hosts in live:
        with contextlib.suppress(Exception):
            hosts.teardown()


atexit.register(_teardown_all)

