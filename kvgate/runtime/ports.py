"""Free loopback ports, and a clear error when a wanted one is taken."""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out for `host` (bind to 0), released for a child to take."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1", exclude: Collection[int] = ()) -> list[int]:
    """`count` distinct free ports: all held at once while the OS hands them out (one at a time,
    a port just released can come back). `exclude`: ports already promised to someone else
    (released, so the OS may hand them out again)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    found: list[int] = []
    try:
        while len(found) < count:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)  # held, even when excluded, so the OS moves on
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in exclude:
                found.append(port)
        return found
    finally:
        for sock in sockets:
            sock.close()


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False
