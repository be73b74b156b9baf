"""The admin gRPC server: the Admin service, the standard health service and server reflection.

Loopback only unless told otherwise; listening anywhere else requires an operator token. On
loopback without one, the server makes its own and writes it where its user's kvgate CLI finds
it (kvgate.admin_api.token_file): operator actions always need the operator token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from control_plane.admin.fleet_stream import FleetStream
from control_plane.admin.servicer import AdminServicer
from control_plane.operations import Operations
from control_plane.status import ControlPlaneStatus
from kvgate.admin_api.auth import TokenError, TokenInterceptor, is_loopback, load_token
from kvgate.admin_api.tls import ServerTls, TlsError
from kvgate.admin_api.token_file import new_token, remove_token, token_path, write_token
from kvgate.admin_api.v1 import admin_pb2, admin_pb2_grpc
from kvgate.config.model import HostPort
from kvgate.runtime.tasks.listen import listen_grpc

__all__ = ["AdminServer", "ServerTls", "TlsError", "TokenError", "load_token"]

log = structlog.get_logger("kvgate.admin")

TOKEN_HINT = "the kvgate CLI sends it from KVGATE_ADMIN_TOKEN or --token-file"

ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name  # kvgate.admin.v1.Admin
_LISTEN_SETTING = "--admin or control_plane.admin"  # where a user changes the bound address


class AdminServer:
    def __init__(
        self,
        operations: Operations,
        status: Callable[[], ControlPlaneStatus],
        listen: HostPort,
        token: str | None,
        health_servicer: health.aio.HealthServicer | None = None,
        tls: ServerTls | None = None,
        read_token: str | None = None,
        fleet: FleetStream | None = None,
    ) -> None:
        if not is_loopback(listen.host) and not token:
            # Refused here, before anything binds: an open admin API could drain the whole fleet.
            raise TokenError(
                f"admin API on {listen} is reachable off this machine and needs a token: "
                "set KVGATE_ADMIN_TOKEN or --admin-token-file, or listen on 127.0.0.1"
            )
        if read_token and read_token == token:
            raise TokenError("the read-only admin token must differ from the operator token")
        self._servicer = AdminServicer(operations, status, fleet)
        self._listen = listen
        self._token = token or None
        self._read_token = read_token or None
        self._tls = tls
        self.token_file: Path | None = None  # the operator token this server wrote, if any
        self._made_token: str | None = None
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
        token = self._token or new_token()  # only on loopback (see __init__)
        interceptor = TokenInterceptor(token, self._read_token,
                                       open_reads=is_loopback(self._listen.host),
                                       hint=f" ({TOKEN_HINT})")
        # SO_REUSEPORT off: a port another process holds is an error, not silently shared.
        server = grpc.aio.server(interceptors=[interceptor],
                                 options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServicer_to_server(self._servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        if self._tls is None:
            port = listen_grpc(server, self._listen, "admin API", _LISTEN_SETTING)
        else:
            try:
                port = listen_grpc(server, self._listen, "admin API", _LISTEN_SETTING,
                                   self._tls.credentials())
            except RuntimeError as exc:  # grpc's own words for a key that fits no certificate
                raise TlsError(f"admin TLS {self._tls.cert_file}: {exc}") from None
        if self._token is None:  # bound, so the port names the file
            path = token_path(port)
            write_token(path, token)
            self.token_file, self._made_token = path, token
            interceptor.hint = f" (kvgate reads it from {path}, which only its owner may read)"
        if not serving:  # grpc's health service says SERVING by default
            for service in ("", ADMIN_SERVICE):
                await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server, self.port = server, port
        if serving:
            await self.set_serving()
        # Where the tokens come from, never a token itself.
        log.info("admin_api_ready", address=str(self.address),
                 operator_token="configured" if self._token else str(self.token_file),
                 read_token=self._read_token is not None, tls=self._tls is not None)
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
        if self.token_file is not None and self._made_token is not None:
            remove_token(self.token_file, self._made_token)
        log.info("admin_api_stopped", address=str(self.address))
