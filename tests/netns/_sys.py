"""The system plumbing under :mod:`netns`: commands (``ip``), a namespace's processes, the address
ranges in use, an ``ethtool`` feature switch, and the user-space delay relay that stands in for ``tc netem`` where
the kernel has no ``sch_netem``.

Standard library only: the relay runs this file as a script (``python -S _sys.py relay ...``), outside the
package.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "ETHTOOL_SGSO", "ETHTOOL_STSO", "ETHTOOL_STXCSUM", "ethtool_off", "ip", "kill_ns_pids", "ns_pids", "pid_alive",
    "ranges_in_use", "relay", "run", "write_sysctl",
]

#: Each wait on a short command.
CMD_TIMEOUT: Final = 20.0


def run(argv: Sequence[str], *, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run a short command; raises RuntimeError if it fails (``check``) or outlives ``timeout``."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(argv)}: no answer within {timeout:g} s") from exc
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(["ip", *(["-n", ns] if ns else []), *args], check=check)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_sysctl(path: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).write_text(value)


# ethtool through its ioctl (the ethtool program is often not installed): struct ethtool_value {u32 cmd, data}.
SIOCETHTOOL: Final = 0x8946
ETHTOOL_STXCSUM: Final = 0x17
ETHTOOL_STSO: Final = 0x1F
ETHTOOL_SGSO: Final = 0x24


def ethtool_off(ifname: str, *cmds: int) -> None:
    """Turn features off on ``ifname`` (in this namespace). Raises OSError if the kernel refuses."""
    import ctypes

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for cmd in cmds:
            value = (ctypes.c_uint32 * 2)(cmd, 0)
            ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)



def ns_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_ns_pids(ns: str, rounds: int = 5) -> None:
    for _ in range(rounds):
        pids = ns_pids(ns)
        if not pids:
            return
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)


def ranges_in_use() -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            nets.append(ipaddress.IPv4Interface(m.group(1)).network)
    for line in ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        tok = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if tok not in ("default", "broadcast", "local", "unreachable"):
                nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


# ------------------------------------------------------------------------------------------------ the relay

_ETH_P_ALL: Final = 0x0003
_PACKET_OUTGOING: Final = 4


def relay(inner: str, outer: str, control: str, lifetime: float, parent: int) -> int:
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
            if not pid_alive(parent):
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



def _main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "relay":
        return relay(argv[1], argv[2], argv[3], float(argv[4]), int(argv[5]))
    print("usage: _sys.py relay INNER OUTER DELAY_FILE LIFETIME_S PARENT_PID", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
