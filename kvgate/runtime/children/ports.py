"""Free loopback ports, and a clear error when a wanted one is taken."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

from kvgate.runtime.children.port_owner import holder, only_time_wait

PortRange = tuple[int, int]  # (low, high), both included


class NoFreePorts(RuntimeError):
    """Not enough free ports in a range a user confined us to; the message says which."""


def parse_port_range(text: str) -> PortRange:
    """``LOW-HIGH`` (both included) -> ``(low, high)``; ValueError saying what is wrong."""
    low, sep, high = text.strip().partition("-")
    try:
        if not sep:
            raise ValueError
        bounds = int(low), int(high)
    except ValueError:
        raise ValueError(f"expected LOW-HIGH such as 30000-30999, got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1] <= 65535:
        raise ValueError(f"expected 1 <= LOW <= HIGH <= 65535, got {text!r}")
    return bounds


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out for `host` (bind to 0), released for a child to take."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1", within: PortRange | None = None,
               exclude: Collection[int] = ()) -> list[int]:
    """`count` distinct free ports: all held at once while the OS hands them out (one at a time,
    a port just released can come back). `within`: only from that range (tried in random order,
    so two runs confined to one range rarely collide); NoFreePorts if it has too few free.
    `exclude`: ports already promised to someone else (released, so the OS may hand them out
    again)."""
    if within is not None:
        with ReservedPorts(count + len(exclude), host, within) as reserved:
            return [p for p in reserved.ports if p not in exclude][:count]
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


# Consecutive runs are sought below Linux's ephemeral range (32768-60999 by default), where
# outgoing connections do not take ports.
RUN_RANGE: PortRange = (20000, 32767)


def free_run(count: int, host: str = "127.0.0.1", exclude: Collection[int] = (),
             first: int | None = None, tries: int = 200) -> int:
    """The first of `count` consecutive free ports, none in `exclude`: from `first` if those
    are free, else from a random base in RUN_RANGE. Free when looked at: a child started soon
    after takes them. NoFreePorts after `tries` bases."""
    low, high = RUN_RANGE
    bases = ([first] if first is not None else []) + [
        random.randint(low, high - count + 1) for _ in range(tries)]
    for base in bases:
        run = range(base, base + count)
        if 1024 <= base and run[-1] <= 65535 and not any(
                p in exclude or port_in_use(host, p) for p in run):
            return base
    raise NoFreePorts(f"no {count} consecutive free ports on {host} after {tries} tries")


class ReservedPorts:
    """`count` distinct free ports (from the OS, or from `within`), kept from everyone else until
    closed, for children started later, possibly several times over.

    Each port is held by a socket bound with SO_REUSEADDR that never listens: no other program can
    bind it without address reuse, and the kernel never gives an explicitly bound port to an
    outgoing connection; yet a child that binds with address reuse and listens (the emulator,
    Envoy, etcd, the gRPC and HTTP servers here all do) gets it. A port released and taken again
    later could meanwhile become some outgoing connection's, on a busy host."""

    def __init__(self, count: int, host: str = "127.0.0.1",
                 within: PortRange | None = None) -> None:
        self._sockets: list[socket.socket] = []
        try:
            if within is None:
                for _ in range(count):
                    self._sockets.append(_held(host, 0))
            else:
                self._hold_within(count, host, within)
        except BaseException:
            self.close()
            raise
        self.ports = [int(sock.getsockname()[1]) for sock in self._sockets]

    def _hold_within(self, count: int, host: str, within: PortRange) -> None:
        low, high = within
        candidates = list(range(low, high + 1))
        random.shuffle(candidates)
        for port in candidates:
            if len(self._sockets) == count:
                return
            try:
                self._sockets.append(_held(host, port))
            except OSError:
                continue
        if len(self._sockets) < count:
            raise NoFreePorts(f"only {len(self._sockets)} of the {count} ports needed are free "
                              f"in {low}-{high} on {host}")

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()

    def __enter__(self) -> ReservedPorts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _held(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Bound without address reuse first, so a port anything else has bound (another
        # reservation included) is refused; reuse is allowed afterwards, for the children.
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError:
        sock.close()
        raise
    return sock


def port_in_use(host: str, port: int) -> bool:
    return bind_refusal(host, port) is not None


def bind_refusal(host: str, port: int) -> OSError | None:
    """Why a server could not bind `host:port` now (EADDRINUSE, EADDRNOTAVAIL, ...), or None
    when it could. Tried with SO_REUSEADDR, as servers bind (gRPC and asyncio's included)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
        return None


class _Address(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


A = TypeVar("A", bound=_Address)


async def wait_for_ports(wanted: Sequence[tuple[str, A]], time_wait_s: float,
                         report: Callable[[str], None] = lambda line: None,
                         every: float = 0.5) -> list[tuple[str, A, str | None]]:
    """The ``(name, address)`` pairs whose port a server cannot bind, each with who holds it
    (kvgate.runtime.children.port_owner; None: not known). A port held only by closed
    connections in TIME-WAIT is waited for, up to ``time_wait_s``: the kernel frees it."""
    busy = [(n, a) for n, a in wanted if port_in_use(a.host, a.port)]
    waiting = [(n, a) for n, a in busy if only_time_wait(a.host, a.port)]
    if waiting:
        names = ", ".join(f"{n} {a}" for n, a in waiting)
        report(f"  waiting up to {time_wait_s:g} s for {names}: held only by a closed "
               "connection in TIME-WAIT, which the kernel frees")
        deadline = time.monotonic() + time_wait_s
        while time.monotonic() < deadline:
            if not any(port_in_use(a.host, a.port) and only_time_wait(a.host, a.port)
                       for _, a in waiting):
                break
            await asyncio.sleep(every)  # the kernel tells no one: poll
        busy = [(n, a) for n, a in wanted if port_in_use(a.host, a.port)]
    return [(n, a, holder(a.host, a.port)) for n, a in busy]
