"""The admin gRPC server: the Admin service, the standard health service and server reflection.

Loopback only unless told otherwise; listening anywhere else requires a bearer token.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from control_plane.admin.servicer import AdminServicer
from control_plane.operations import Operations
from control_plane.status import ControlPlaneStatus
from kvgate.admin_api.auth import TokenError, TokenInterceptor, is_loopback, load_token
from kvgate.admin_api.tls import ServerTls, TlsError
from kvgate.admin_api.v1 import admin_pb2, admin_pb2_grpc
from kvgate.config.model import HostPort

__all__ = ["AdminServer", "ServerTls", "TlsError", "TokenError", "load_token"]

log = structlog.get_logger("kvgate.admin")

ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name  # kvgate.admin.v1.Admin


class AdminServer:
    def __init__(
        self,
        operations: Operations,
        status: Callable[[], ControlPlaneStatus],
        listen: HostPort,
        token: str | None,
        health_servicer: health.aio.HealthServicer | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        if not is_loopback(listen.host) and not token:
            # Refused here, before anything binds: an open admin API could drain the whole fleet.
            raise TokenError(
                f"admin API on {listen} is reachable off this machine and needs a token: "
                "set KVGATE_ADMIN_TOKEN or --admin-token-file, or listen on 127.0.0.1"
            )
        self._servicer = AdminServicer(operations, status)
        self._listen = listen
        self._token = token or None
        self._tls = tls
        # A caller that already reports health (NOT_SERVING while stopping) passes its own.
        self._health = health_servicer or health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None  # bound port, known after start() (listen port 0 works)

    @property
    def address(self) -> HostPort:
        return HostPort(self._listen.host, self.port or self._listen.port)

    async def start(self, serving: bool = True) -> int:
        """Binds and serves; with `serving` False the health service says NOT_SERVING until
        `set_serving()` (a caller still starting up)."""
        interceptors = [TokenInterceptor(self._token)] if self._token else []
        # SO_REUSEPORT off: a port another process holds is an error, not silently shared.
        server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServicer_to_server(self._servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        if self._tls is None:
            try:
                port = server.add_insecure_port(str(self._listen))
            except RuntimeError:  # grpc's words for a port in use
                port = 0
        else:
            try:
                port = server.add_secure_port(str(self._listen), self._tls.credentials())
            except RuntimeError as exc:  # grpc's own words for a key that fits no certificate
                raise TlsError(f"admin TLS {self._tls.cert_file}: {exc}") from None
        if port == 0:
            raise OSError(f"admin API: cannot listen on {self._listen} (address in use?)")
        if not serving:  # grpc's health service says SERVING by default
            for service in ("", ADMIN_SERVICE):
                await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server, self.port = server, port
        if serving:
            await self.set_serving()
        # Whether a token is enforced, never the token itself.
        log.info("admin_api_ready", address=str(self.address), token=bool(self._token),
                 tls=self._tls is not None)
        if self._tls is None and not is_loopback(self._listen.host):
            log.warning("admin_api_plaintext", address=str(self.address),
                        hint="the token crosses the network in clear: give --admin-tls-cert "
                        "and --admin-tls-key")
        return port

    async def set_serving(self) -> None:
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(ADMIN_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float | None = 2.0) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
        log.info("admin_api_stopped", address=str(self.address))
