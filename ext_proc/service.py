"""ext_proc's lifecycle: etcd mirrors and binding store → gRPC server → metrics; stop in reverse."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc.decide import Decider
from ext_proc.metrics import ExtProcMetrics
from ext_proc.server import ExternalProcessor
from ext_proc.sources import SessionSources
from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.store import BindingStore
from kvgate.config.model import Config, HostPort
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, PrefixMirror
from kvgate.observability.http import MetricsServer

log = structlog.get_logger("kvgate.ext_proc")


@dataclass(frozen=True, slots=True)
class ExtProcOptions:
    listen: HostPort
    metrics: HostPort | None
    etcd_endpoints: tuple[str, ...] = ()  # empty: in-memory bindings (a single replica only)


class ExtProcService:
    def __init__(self, config: Config, options: ExtProcOptions) -> None:
        self._config = config
        self._options = options
        self.metrics = ExtProcMetrics()
        self.directory = EndpointDirectory(config)
        self._etcd: EtcdClient | None = None
        self.store: BindingStore
        self._mirror: PrefixMirror | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_server: MetricsServer | None = None
        self.port = options.listen.port

    async def start(self) -> None:
        config = self._config
        if self._options.etcd_endpoints:
            self._etcd = EtcdClient(self._options.etcd_endpoints)
            etcd_store = EtcdBindingStore(
                self._etcd, config.etcd.prefix, config.session.idle_ttl,
                on_etcd_error=self.metrics.etcd_errors.inc,
            )
            self._mirror = PrefixMirror(self._etcd, self.directory.prefix, self.directory)
            self._tasks.append(asyncio.create_task(self._mirror.run(), name="endpoints-mirror"))
            await etcd_store.start()
            self.store = etcd_store
            mirror = self._mirror
            self.metrics.track(
                lambda: len(etcd_store), lambda: etcd_store.pending,
                lambda: 1.0 if mirror.connected and not etcd_store.degraded else 0.0,
            )
        else:
            log.warning("bindings_in_memory", reason="no etcd configured; one replica only")
            memory = MemoryBindingStore(config.session.idle_ttl)
            self.store = memory
            self.metrics.track(lambda: sum(1 for _ in memory.bindings()), lambda: 0, lambda: 0)
        decider = Decider(self.store, self.directory, config.placement.load_factor)
        default_pool = config.pools[0].name if len(config.pools) == 1 else None
        servicer = ExternalProcessor(
            decider, SessionSources(config.session), self.metrics, default_pool
        )
        self._server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 10_000)]
        )
        pb_grpc.add_ExternalProcessorServicer_to_server(servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        listen = self._options.listen
        self.port = self._server.add_insecure_port(f"{listen}")
        if self.port == 0:
            raise OSError(f"ext_proc: cannot listen on {listen}")
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if self._options.metrics is not None:
            self._metrics_server = MetricsServer(
                self.metrics.registry, self._options.metrics.host, self._options.metrics.port
            )
            await self._metrics_server.start()
        log.info("ext_proc_ready", listen=f"{listen.host}:{self.port}",
                 metrics=None if self._metrics_server is None
                 else f"{self._options.metrics.host}:{self._metrics_server.port}",  # type: ignore[union-attr]
                 etcd=list(self._options.etcd_endpoints) or None)

    async def stop(self, grace: float = 5.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()
        if self._etcd is not None:
            await self._etcd.close()
        log.info("ext_proc_stopped")
