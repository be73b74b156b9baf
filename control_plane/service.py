"""The control plane's lifecycle. Today: endpoint records from the YAML, active health checks,
and a gRPC admin listener (health service) on `control_plane.admin`."""

from __future__ import annotations

import asyncio

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from control_plane.health import HealthChecker
from kvgate.config.model import Config, HostPort
from kvgate.endpoints import seed_from_config
from kvgate.etcd import EtcdClient
from kvgate.etcd.client import wait_until_ready

log = structlog.get_logger("kvgate.control_plane")


class ControlPlaneService:
    def __init__(self, config: Config, etcd_endpoints: tuple[str, ...], admin: HostPort) -> None:
        self._config = config
        self._etcd = EtcdClient(etcd_endpoints)
        self._admin = admin
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.checker = HealthChecker(config, self._etcd)

    async def start(self, etcd_wait: float = 10.0) -> None:
        await wait_until_ready(self._etcd, asyncio.get_running_loop().time() + etcd_wait)
        await seed_from_config(self._etcd, self._config)
        await self.checker.start()
        self._server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        if self._server.add_insecure_port(str(self._admin)) == 0:
            raise OSError(f"control plane: cannot listen on {self._admin}")
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("control_plane_ready", admin=str(self._admin),
                 endpoints=sum(len(p.endpoints) for p in self._config.pools))

    async def stop(self, grace: float = 2.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
        await self.checker.stop()
        await self._etcd.close()
        log.info("control_plane_stopped")
