"""`kvgate up --ports auto|BASE`: every port of the stack from the OS, or consecutive from a base,
so a stack never collides with another one (or anything else) on a shared host."""

from __future__ import annotations

from dataclasses import replace

from kvgate.config.model import Config, ControlPlane, HostPort
from kvgate.runtime.children.ports import free_ports

AUTO = "auto"


class PortsError(ValueError):
    """A --ports value that cannot be used; the message says why."""


def port_count(config: Config) -> int:
    """How many ports the stack itself listens on (engines excluded: they pick their own)."""
    return 5 + len(config.ext_proc.addresses)  # gateway, Envoy admin, xds, admin API, metrics


def parse_ports(text: str) -> str | int:
    """``auto`` or a base port (1024..65535)."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        base = int(text)
    except ValueError:
        raise PortsError(f"--ports must be 'auto' or a base port number, got {text!r}") from None
    if not 1024 <= base <= 65535:
        raise PortsError(f"--ports base must be 1024..65535, got {base}")
    return base


def with_ports(config: Config, ports: str | int) -> Config:
    """``config`` with every listening port replaced, keeping each address's host.

    In order: gateway, Envoy admin, control-plane xDS, control-plane admin API, ext_proc
    metrics, then each ext_proc replica. From a base they are ``base, base+1, ...``; with
    ``auto`` the OS hands them out (held all at once, so they are distinct)."""
    count = port_count(config)
    if ports == AUTO:
        numbers = free_ports(count)
    else:
        base = int(ports)
        if base + count - 1 > 65535:
            raise PortsError(f"--ports {base}: the stack needs {count} ports, past 65535")
        numbers = list(range(base, base + count))
    it = iter(numbers)
    listener = HostPort(config.listener.host, next(it))
    envoy_admin = HostPort(config.envoy_admin.host, next(it))
    control_plane = ControlPlane(HostPort(config.control_plane.xds.host, next(it)),
                                 HostPort(config.control_plane.admin.host, next(it)))
    metrics = HostPort(config.ext_proc.metrics.host, next(it))
    addresses = tuple(HostPort(a.host, next(it)) for a in config.ext_proc.addresses)
    return replace(
        config, listener=listener, envoy_admin=envoy_admin, control_plane=control_plane,
        ext_proc=replace(config.ext_proc, addresses=addresses, metrics=metrics),
    )

