"""A service binds its listening port: gRPC servers through `listen_grpc`, its /metrics port
through `listen_metrics`, and one clear error, `ListenError`, for any port a service cannot
listen on, saying which service, which address, why (who holds the port, when /proc tells) and
what to change."""

from __future__ import annotations

import errno

import grpc
from prometheus_client import CollectorRegistry

from kvgate.config.address import HostPort
from kvgate.observability.http import MetricsServer
from kvgate.runtime.children.port_owner import holder
from kvgate.runtime.children.ports import bind_refusal


class ListenError(OSError):
    """A service cannot listen on its address; the message says why and what to do."""


def listen_grpc(server: grpc.aio.Server, address: HostPort, listener: str, setting: str,
                credentials: grpc.ServerCredentials | None = None) -> int:
    """Binds `server` to `address` (TLS with `credentials`); the bound port (port 0: the one the
    OS chose). ListenError if the address cannot be bound, naming `listener` (what serves
    there) and `setting`, where the user changes the address ("--listen or ext_proc.address").
    SO_REUSEPORT must be off on `server` (option grpc.so_reuseport 0), or a port another
    process holds is shared instead of refused.

    A RuntimeError from gRPC while the address itself binds is not the address's fault (with
    TLS: a key that fits no certificate): it is raised as it is, for the caller to name."""
    try:
        if credentials is None:
            port = server.add_insecure_port(str(address))
        else:
            port = server.add_secure_port(str(address), credentials)
    except RuntimeError:  # gRPC's words name no reason ("Failed to bind to address ...")
        refusal = bind_refusal(address.host, address.port)
        if refusal is None and credentials is not None:
            raise
        raise listen_error(address, listener, setting, refusal) from None
    if port == 0:
        raise listen_error(address, listener, setting, bind_refusal(address.host, address.port))
    return port


async def listen_metrics(registry: CollectorRegistry, address: HostPort,
                         setting: str) -> MetricsServer:
    """`registry`'s /metrics (and /healthz) served on `address`, started. ListenError if the
    address cannot be bound, naming `setting` ("--metrics or ext_proc.metrics"). Here, not in
    kvgate.observability, which sits below this tier and so cannot raise ListenError."""
    server = MetricsServer(registry, address.host, address.port)
    try:
        await server.start()
    except OSError as exc:  # aiohttp's words ("error while attempting to bind ..."): replaced
        await server.stop()
        raise listen_error(address, "metrics", setting, exc) from None
    return server


def listen_error(address: HostPort, listener: str, setting: str,
                 refusal: OSError | None) -> ListenError:
    """The error for a `listener` ("xDS", "admin API") that cannot listen on `address`,
    `refusal` being the OS's reason (None: gRPC refused an address the OS would bind). The
    service's runner puts the service's name before it."""
    if refusal is None:
        why = "gRPC could not bind it (GRPC_VERBOSITY=debug logs why)"
        do = f"set {setting} to another address"
    elif refusal.errno == errno.EADDRINUSE:
        held = holder(address.host, address.port)
        why = "the port is in use" + (f" ({held})" if held else "")
        do = f"stop what holds it, or set {setting} to another port"
    elif refusal.errno == errno.EADDRNOTAVAIL:
        why = "the host is not an address of this machine"
        do = f"set {setting} to one of its addresses (127.0.0.1 for this machine only)"
    else:
        why = refusal.strerror or str(refusal)
        do = f"set {setting} to another address"
    return ListenError(f"cannot listen on {address} ({listener}): {why}; {do}")
