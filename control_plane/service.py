"""The control plane's lifecycle: etcd mirrors → snapshot cache → ADS and admin servers →
leader election, health checks, failover; config reloads on SIGHUP or file change.
Stopped in reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog
from envoy.service.discovery.v3 import ads_pb2_grpc
from grpc_health.v1 import health
from prometheus_client import CollectorRegistry, Gauge

from control_plane.admin.server import AdminServer, ServerTls
from control_plane.failover import Failover
from control_plane.health import HealthChecker
from control_plane.leader import LeaderElection
from control_plane.operations import Operations
from control_plane.resources.snapshot import gateway_resources
from control_plane.status import ControlPlaneStatus
from control_plane.xds.cache import InconsistentSnapshot, SnapshotCache
from control_plane.xds.metrics import XdsMetrics
from control_plane.xds.server import AdsServer, NodeRegistry
from kvgate.bindings.mirror import BindingMirror
from kvgate.config import Config, ConfigError, load_file
from kvgate.config.model import HostPort
from kvgate.endpoints import EndpointDirectory, seed_from_config
from kvgate.etcd import EtcdClient, KeyValue, PrefixMirror
from kvgate.etcd.client import WatchEvent, wait_until_ready
from kvgate.observability.http import MetricsServer

log = structlog.get_logger("kvgate.control_plane")


@dataclass(frozen=True, slots=True)
class ControlPlaneOptions:
    config_path: Path
    etcd: tuple[str, ...]
    admin: HostPort
    metrics: HostPort | None = None
    admin_token: str | None = None
    admin_tls: ServerTls | None = None
    identity: str = f"{socket.gethostname()}-{os.getpid()}"
    watch_file: bool = True  # reload when the file changes, not only on SIGHUP


class _Notifying:
    """Feeds a mirror handler and wakes the snapshot loop on every change."""

    def __init__(self, handler: EndpointDirectory, changed: asyncio.Event) -> None:
        self._handler = handler
        self._changed = changed

    def reset(self, kvs: list[KeyValue]) -> None:
        self._handler.reset(kvs)
        self._changed.set()

    def apply(self, event: WatchEvent) -> None:
        self._handler.apply(event)
        self._changed.set()


class ControlPlaneService:
    def __init__(self, config: Config, options: ControlPlaneOptions) -> None:
        self.config = config
        self._options = options
        self._etcd = EtcdClient(options.etcd)
        self.registry = CollectorRegistry()
        self.cache = SnapshotCache()
        self.nodes = NodeRegistry()
        self.directory = EndpointDirectory(config)
        self.bindings = BindingMirror(config.etcd.prefix)
        self._states_changed = asyncio.Event()
        self.leader = LeaderElection(
            self._etcd, f"{config.etcd.prefix}leader".encode(), options.identity,
            on_change=self._on_leadership,
        )
        self.checker = HealthChecker(config, self._etcd, leading=lambda: self.leader.leading,
                                     registry=self.registry)
        self.failover = Failover(self._etcd, self.directory, self.bindings,
                                 config.placement.load_factor)
        self.operations = Operations(self._etcd, config.etcd.prefix, loads=self.checker.load)
        self.last_reload_error: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._xds: grpc.aio.Server | None = None
        self._admin: AdminServer | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_server: MetricsServer | None = None
        self._reload_wanted = asyncio.Event()
        self._failover_wanted = asyncio.Event()
        self.xds_port = config.control_plane.xds.port
        self._endpoint_state = Gauge(
            "kvgate_endpoint_state", "1 for each endpoint's current state",
            ["pool", "endpoint", "state"], registry=self.registry,
        )
        Gauge("kvgate_control_plane_leader", "1 while this replica leads",
              registry=self.registry).set_function(lambda: 1.0 if self.leader.leading else 0.0)

    async def start(self, etcd_wait: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        await wait_until_ready(self._etcd, loop.time() + etcd_wait)
        await seed_from_config(self._etcd, self.config)
        endpoints = PrefixMirror(self._etcd, self.directory.prefix,
                                 _Notifying(self.directory, self._states_changed))
        bindings = PrefixMirror(self._etcd, self.bindings.prefix, self.bindings)
        self._spawn(endpoints.run(), bindings.run())
        await asyncio.wait_for(endpoints.synced.wait(), etcd_wait)
        await self._publish()
        self._xds = grpc.aio.server()
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AdsServer(self.cache, XdsMetrics(self.registry), self.nodes), self._xds
        )
        self.xds_port = self._listen(self._xds, self.config.control_plane.xds)
        await self._xds.start()
        await self._start_admin()
        await self.checker.start()
        self._spawn(self.leader.run(), self._snapshot_loop(), self._failover_loop(),
                    self._reload_loop())
        if self._options.metrics is not None:
            self._metrics_server = MetricsServer(
                self.registry, self._options.metrics.host, self._options.metrics.port
            )
            await self._metrics_server.start()
        log.info("control_plane_ready", xds=f"{self.config.control_plane.xds.host}:"
                 f"{self.xds_port}", admin=str(self._options.admin),
                 identity=self._options.identity)

    async def _start_admin(self) -> None:
        self._admin = AdminServer(self.operations, self.status, self._options.admin,
                                  self._options.admin_token, self._health,
                                  self._options.admin_tls)
        await self._admin.start()

    @staticmethod
    def _listen(server: grpc.aio.Server, address: HostPort) -> int:
        port = server.add_insecure_port(str(address))
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        return port

    def _spawn(self, *coroutines: object) -> None:
        for coroutine in coroutines:
            self._tasks.append(asyncio.create_task(coroutine))  # type: ignore[arg-type]

    def request_reload(self) -> None:
        self._reload_wanted.set()

    def status(self) -> ControlPlaneStatus:
        snapshot = self.cache.current
        return ControlPlaneStatus(
            identity=self._options.identity,
            leader=self.leader.leader,
            config_version=snapshot.version if snapshot else "",
            config_source=str(self._options.config_path),
            nodes=self.nodes.snapshot(),
            last_reload_error=self.last_reload_error,
        )

    # -- background loops ------------------------------------------------------------------

    async def _publish(self) -> None:
        states = self.directory.states()
        self._endpoint_state.clear()
        for pool, members in states.items():
            for address, state in members.items():
                self._endpoint_state.labels(pool, address, state).set(1)
        try:
            snapshot = await self.cache.publish(gateway_resources(self.config, states))
        except InconsistentSnapshot as exc:
            log.error("snapshot_inconsistent", error=str(exc))
            return
        log.debug("snapshot_published", version=snapshot.version)

    async def _snapshot_loop(self) -> None:
        while True:
            await self._states_changed.wait()
            self._states_changed.clear()
            await self._publish()
            self._failover_wanted.set()

    async def _failover_loop(self) -> None:
        while True:
            if self.leader.leading:
                try:
                    await self.failover.sweep()
                except Exception:
                    log.exception("failover_sweep_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._failover_wanted.wait(), 0.25)
            self._failover_wanted.clear()

    def _on_leadership(self, leading: bool) -> None:
        if leading:
            self._spawn(self.checker.publish_all())

    async def _reload_loop(self) -> None:
        path = self._options.config_path
        seen = _mtime(path)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload_wanted.wait(), 0.2)  # a stat() per tick
            changed = self._options.watch_file and _mtime(path) != seen
            if not (self._reload_wanted.is_set() or changed):
                continue
            self._reload_wanted.clear()
            seen = _mtime(path)
            await self.reload()

    async def reload(self) -> bool:
        """Applies the file if valid; otherwise keeps the running config and says why."""
        try:
            config = load_file(self._options.config_path)
        except ConfigError as exc:
            self.last_reload_error = exc.render()
            log.error("config_rejected", problems=[str(p) for p in exc.problems])
            return False
        if config.etcd.prefix != self.config.etcd.prefix:
            self.last_reload_error = "etcd.prefix cannot change while running; restart instead"
            log.error("config_rejected", problems=[self.last_reload_error])
            return False
        self.config = config
        self.last_reload_error = None
        await seed_from_config(self._etcd, config)
        self.directory.reconfigure(config)
        await self.checker.reconfigure(config)
        self._states_changed.set()
        log.info("config_reloaded", pools=len(config.pools),
                 endpoints=sum(len(p.endpoints) for p in config.pools))
        return True

    async def stop(self, grace: float = 2.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._admin is not None:
            await self._admin.stop(grace)
        if self._xds is not None:
            await self._xds.stop(grace)
        await self.checker.stop()
        for task in reversed(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        await self._etcd.close()
        log.info("control_plane_stopped")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None
