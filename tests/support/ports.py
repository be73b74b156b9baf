"""Free loopback ports for tests: below the OS's ephemeral range, a block per pytest-xdist worker.

The product's `free_ports` asks the OS (bind to 0) and releases the port for a child to take. The
OS hands those out from its ephemeral range, the same range every outgoing connection of every
test draws from; with several workers and thousands of connections a released port was once taken
by someone else before Envoy bound it ("cannot bind ...: Address already in use"). Here each
worker walks its own block below that range, in order from a random start, so no connection and
no other worker of the run takes a port in the moment after it is handed out, and one worker hands
a port out again only after its whole block.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection
from pathlib import Path

from kvgate.runtime.children import ports as os_ports

BLOCK = 3000  # ports per worker
FIRST = 11000  # where the first worker's block starts
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # unset when the run is serial
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


class PortWalk:
    """One process's block of ports, handed out in order from a random start."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.next = random.randint(low, high)

    def take(self, count: int, host: str, exclude: Collection[int]) -> list[int]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        held: list[socket.socket] = []
        found: list[int] = []
        try:
            for _ in range(self.high - self.low + 1):
                if len(found) == count:
                    return found
                port = self.next
                self.next = self.low if port == self.high else port + 1
                if port in exclude:
                    continue
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.bind((host, port))  # without address reuse: refused if anything holds it
                except OSError:
                    sock.close()
                    continue
                held.append(sock)
                found.append(port)
            if len(found) == count:
                return found
            raise os_ports.NoFreePorts(f"only {len(found)} of {count} ports free in "
                                       f"{self.low}-{self.high} on {host}")
        finally:
            for sock in held:
                sock.close()


def _walk() -> PortWalk | None:
    low = FIRST + _worker_index() * BLOCK
    if low + BLOCK > _ephemeral_low():
        return None  # no room below the ephemeral range: ask the OS
    return PortWalk(low, low + BLOCK - 1)


WALK = _walk()


def free_ports(count: int, host: str = "127.0.0.1", exclude: Collection[int] = ()) -> list[int]:
    """`count` distinct free ports for children this test starts."""
    if WALK is None:
        return os_ports.free_ports(count, host, exclude=exclude)
    return WALK.take(count, host, exclude)


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
