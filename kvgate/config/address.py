"""`host:port` as the config holds it (below the readers and the sections, which all use it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, address: str) -> HostPort:
        """The inverse of ``str()``: `host:port`, an IPv6 host in brackets. ValueError if it is
        not that shape (no checks of the host: the config's reader makes those)."""
        host, sep, port = address.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()):
            raise ValueError(f"not host:port: {address!r}")
        return cls(host.removeprefix("[").removesuffix("]"), int(port))
