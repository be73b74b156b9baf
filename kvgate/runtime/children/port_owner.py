"""Who holds a TCP port, best effort, from /proc (Linux): the sockets whose local port it is
(/proc/net/tcp and tcp6) and the processes whose open files include them (/proc/PID/fd).

A port a server cannot bind is held by a listener (another server), by a connection that used
it as its local port (an outgoing one takes its port from the same range as `--ports` bases in
the 32768-60999 band), or only by such a connection that has closed and sits in TIME-WAIT,
which the kernel frees within 60 s (Linux's fixed TCP_TIMEWAIT_LEN). A server's own closed
connections in TIME-WAIT never block it: they carry its SO_REUSEADDR.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TIME_WAIT_S = 60.0  # Linux: TCP_TIMEWAIT_LEN (include/net/tcp.h)
_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
           "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
           "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


@dataclass(frozen=True, slots=True)
class PortSocket:
    """One socket whose local port is the one asked about."""

    address: str  # its local address
    state: str  # LISTEN, ESTABLISHED, TIME_WAIT, ...
    inode: int  # 0 for TIME-WAIT (no file holds it any more)


def sockets_on(host: str, port: int, proc: Path = PROC) -> list[PortSocket]:
    """Sockets bound to `port` on `host` or on a wildcard address (either side)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            local = _address(address)
            if _overlaps(local, host):
                found.append(PortSocket(local, _STATES.get(fields[3], fields[3]),
                                        int(fields[9])))
    return found


def only_time_wait(host: str, port: int, proc: Path = PROC) -> bool:
    """Only closed connections in TIME-WAIT hold the port: it frees itself within 60 s."""
    held = sockets_on(host, port, proc)
    return bool(held) and all(s.state == "TIME_WAIT" for s in held)


def holder(host: str, port: int, proc: Path = PROC) -> str | None:
    """Who holds the port, in words ("pid 123 (python3 -m http.server)", "a connection in
    TIME-WAIT ..."), or None when /proc does not tell."""
    held = sockets_on(host, port, proc)
    if not held:
        return None
    if all(s.state == "TIME_WAIT" for s in held):
        return ("a closed connection in TIME-WAIT that used it as its local port (the kernel "
                f"frees it within {TIME_WAIT_S:g} s)")
    live = sorted(held, key=lambda s: s.state != "LISTEN")
    owners = processes_holding({s.inode for s in live if s.inode}, proc)
    what = "listening" if live[0].state == "LISTEN" else f"a connection ({live[0].state})"
    if not owners:
        return f"{what}, by a process this user cannot see"
    return f"{what}, by " + ", ".join(f"pid {pid} ({command})"
                                      for pid, command in sorted(owners.items()))


def processes_holding(inodes: set[int], proc: Path = PROC) -> dict[int, str]:
    """pid → command line of each process (of those this user may look into) with one of the
    socket `inodes` open."""
    if not inodes:
        return {}
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        if _links(fds) & wanted:
            owners[int(entry.name)] = _command(entry)
    return owners


def _links(fds: list[Path]) -> set[str]:
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
    return links


def _command(entry: Path, width: int = 80) -> str:
    try:
        raw = (entry / "cmdline").read_bytes()
    except OSError:
        return "?"
    # Whitespace folded: an argument with line breaks (`python -c` code) keeps the error
    # that names the holder on one line.
    text = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, swapped)


def _overlaps(local: str, host: str) -> bool:
    """A socket on `local` keeps a server on `host` from binding the same port."""
    try:
        a, b = _ip(local), _ip(host)
    except ValueError:
        return True  # a host name: assume it may be the same address
    return a.is_unspecified or b.is_unspecified or a == b


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(text.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
