"""ext_proc's lifecycle: bind the listening port (before any side effect) → etcd mirrors and
binding store → serve → metrics; stop in reverse. Background tasks run under one supervisor."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc.http_server import HttpProcessor
from ext_proc.metrics import SERVICE, ExtProcMetrics
from ext_proc.pd_stream import PdProcessor, build_pd
from ext_proc.prompt_stream import PromptProcessor
from ext_proc.readiness import Readiness
from ext_proc.server import ExternalProcessor
from kvgate.admin_api.auth import READ_TOKEN_ENV, TOKEN_ENV, load_token
from kvgate.admin_api.tls import CA_ENV, channel_credentials
from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.store import BindingStore, Unbound
from kvgate.config.model import Config, HostPort
from kvgate.contract.envoy import DECISIONS_HEALTH_SERVICE
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdAuthError, EtcdClient, EtcdError, PrefixMirror
from kvgate.etcd.connection import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PAGE_SIZE
from kvgate.etcd.observed import EtcdErrorLog, MirrorMetrics
from kvgate.etcd.security import etcd_security
from kvgate.fleet.feed import FleetFeed, FleetFeedMetrics
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.observability.http import MetricsServer
from kvgate.observability.logs import Throttled
from kvgate.placement.live import LoadBoard
from kvgate.replicas import ReplicaReport, ReportPublisher
from kvgate.routing import STATIC, Pipeline, Policy, build_policy
from kvgate.routing.engine_load import EngineLoadScraper, EngineScrapeMetrics
from kvgate.routing.handler import RequestHandler
from kvgate.routing.prompt_blocks import PromptBlocks
from kvgate.routing.recent import RecentSessions
from kvgate.routing.sources import SessionSources
from kvgate.runtime.tasks.listen import listen_error, listen_grpc, listen_metrics
from kvgate.runtime.tasks.supervisor import Supervisor
from kvgate.session import SessionIds

log = structlog.get_logger("kvgate.ext_proc")

# Stopping, a replica keeps deciding until no request has come for this long (Envoy's health
# check, every 0.25 s, has moved its sessions away), at most DRAIN_MAX_S.
DRAIN_QUIET_S = 0.5
DRAIN_MAX_S = 3.0
_MAX_METADATA = 256 * 1024
_LISTEN_SETTING = "--listen or ext_proc.address"  # where a user changes the bound address


@dataclass(frozen=True, slots=True)
class ExtProcOptions:
    listen: HostPort
    metrics: HostPort | None
    etcd_endpoints: tuple[str, ...] = ()  # empty: in-memory bindings (a single replica only)
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    etcd_page_size: int = DEFAULT_PAGE_SIZE  # keys per page of a listing
    etcd_max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # the largest reply accepted


class ExtProcService:
    def __init__(self, config: Config, options: ExtProcOptions) -> None:
        self._config = config
        self._options = options
        self.metrics = ExtProcMetrics()
        self.directory = EndpointDirectory(config)
        self._etcd: EtcdClient | None = None
        # etcd.tls / etcd.auth: files and password read now (EtcdSecurityError: not started)
        self._etcd_security = etcd_security(config.etcd) if options.etcd_endpoints else None
        # The collector's stream over TLS, with the CA the CLI takes (TlsError: not started).
        ca = os.environ.get(CA_ENV) if config.placement.load_gate.feed == "collector" else None
        self._collector_tls = channel_credentials(ca) if ca else None
        self.store: BindingStore
        self._mirror: PrefixMirror | None = None
        self._report: ReportPublisher | None = None
        self._etcd_store: EtcdBindingStore | None = None
        self.supervisor = Supervisor(SERVICE, self.metrics.registry)
        self.etcd_errors = EtcdErrorLog(SERVICE, self.metrics.registry)
        self.mirrors = MirrorMetrics(SERVICE, self.metrics.registry)
        self._throttled = Throttled(log)
        self._server: grpc.aio.Server | None = None
        self._http: HttpProcessor | None = None  # ext_proc.transport: http
        self._http_socket: socket.socket | None = None
        self._health = health.aio.HealthServicer()
        self._readiness = Readiness(self._cut_off, self._set_serving)
        self._metrics_server: MetricsServer | None = None
        self.port = options.listen.port
        self.board: LoadBoard | None = None  # the load gate's, while it is on
        self.feed: FleetFeed | None = None  # load_gate.source: collector
        self._handler: RequestHandler | None = None
        self._hbm: HbmBoard | None = None  # the gate's HBM residency, from KV events
        self._pd: PdProcessor | None = None  # prefill/decode pools' two-stage wire
        self._draining = False

    async def start(self) -> None:
        config = self._config
        # Bound first: a busy port fails the start before etcd is touched.
        listen = self._options.listen
        if config.ext_proc.transport == "http":
            self._bind_http(listen)
        else:
            self._bind_grpc(listen)
        await self._open_store()
        policy = self._policy()
        pipeline = Pipeline(self.store, self.directory, config.placement.load_factor,
                            policy=policy, max_bindings=config.session.max_bindings,
                            on_unbound=self._unbound,
                            sessions=SessionIds(max_age_s=config.session.idle_ttl))
        default_pool = config.pools[0].name if len(config.pools) == 1 else None
        handler = RequestHandler(
            pipeline, SessionSources(config.session), self.metrics, default_pool,
            bytes_per_token=None if policy is STATIC
            else config.placement.load_gate.bytes_per_token, log=log,
        )
        await self._serve(handler)
        if self._options.metrics is not None:
            self._metrics_server = await listen_metrics(
                self.metrics.registry, self._options.metrics, "--metrics or ext_proc.metrics")
        log.info("ext_proc_ready", listen=f"{listen.host}:{self.port}",
                 metrics=None if self._metrics_server is None
                 else f"{self._options.metrics.host}:{self._metrics_server.port}",  # type: ignore[union-attr]
                 transport=config.ext_proc.transport,
                 etcd=list(self._options.etcd_endpoints) or None,
                 **(self._etcd_security.describe() if self._etcd_security else {}))

    async def _open_store(self) -> None:
        """The bindings: etcd's (with its mirrors, readiness and replica report), or, with no
        etcd configured, in memory for this one replica."""
        config = self._config
        if self._options.etcd_endpoints:
            self._etcd = EtcdClient(self._options.etcd_endpoints, on_error=self.etcd_errors,
                                    security=self._etcd_security,
                                    page_size=self._options.etcd_page_size,
                                    max_message_bytes=self._options.etcd_max_message_bytes)
            await _check_credentials(self._etcd, config.etcd.prefix)
            etcd_store = EtcdBindingStore(
                self._etcd, config.etcd.prefix, config.session.idle_ttl,
                supervisor=self.supervisor, on_etcd_error=self.metrics.etcd_errors.inc,
                write_limit_s=config.ext_proc.etcd_write_deadline,
                write_budget_s=config.ext_proc.etcd_write_budget,
                max_pending=config.ext_proc.max_pending_bindings,
            )
            self._mirror = self.mirrors.track(
                PrefixMirror(self._etcd, self.directory.prefix, self.directory, "endpoints"))
            self.mirrors.track(etcd_store.mirror)
            self.supervisor.spawn("endpoints-mirror", self._mirror.run)
            await etcd_store.start()
            self.store = self._etcd_store = etcd_store
            self.metrics.track(lambda: len(etcd_store), lambda: etcd_store.pending,
                               lambda: 1.0 if etcd_store.degraded else 0.0)
            self.supervisor.spawn("readiness", self._readiness.run)
            self._report = ReportPublisher(self._etcd, config.etcd.prefix,
                                           self._options.identity, self.report)
            self.supervisor.spawn("replica-report", self._report.run)
        else:
            log.warning("bindings_in_memory", reason="no etcd configured; one replica only")
            memory = MemoryBindingStore(config.session.idle_ttl)
            self.store = memory
            self.metrics.track(lambda: sum(1 for _ in memory.bindings()), lambda: 0, lambda: 0)

    async def _serve(self, handler: RequestHandler) -> None:
        """The transport bound at start answers with the core's pipeline (through `handler`)."""
        self._handler = handler
        if self._http_socket is not None:
            self._http = HttpProcessor(handler,
                                       lambda: self._readiness.ready and not self._draining)
            await self._http.serve(self._http_socket)
            return
        assert self._server is not None
        blocks = self._prompt_blocks()
        self._pd = build_pd(self._config, handler, self.directory, self.metrics.registry,
                            hbm=self._hbm, board=self.board, etcd=self._etcd, blocks=blocks)
        prompt = self._prompt(handler, blocks)
        processor = ExternalProcessor(handler, None if self._pd is None else self._pd.process,
                                      None if prompt is None else prompt.process)
        self._server.add_generic_rpc_handlers((processor.generic_handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(DECISIONS_HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    def _prompt_blocks(self) -> PromptBlocks:
        """How a body's prompt is cut into blocks, as the gate counts them (the prefix step's
        keys; the P/D decider's count of a prompt's blocks)."""
        settings = self._config.placement.load_gate
        return PromptBlocks(settings.prefix_block_tokens, settings.bytes_per_token)

    def _prompt(self, handler: RequestHandler, blocks: PromptBlocks) -> PromptProcessor | None:
        """The prefix step's stream, when the gate places by prompts (its routes are marked)."""
        if not self._config.placement.load_gate.reads_prompts:
            return None
        return PromptProcessor(handler, blocks, self._config.session.body_limit,
                               self.metrics.prompts_read)

    def _cut_off(self) -> bool:
        """This replica's writes do not reach etcd, or its copy of the bindings is not current
        (a session a peer moved meanwhile would be sent to its old engine)."""
        store = self._etcd_store
        return store is not None and (store.degraded or not store.mirror.connected)

    async def _set_serving(self, serving: bool) -> None:
        if self._server is not None and self._http is None:
            await self._health.set(DECISIONS_HEALTH_SERVICE,
                                   health_pb2.HealthCheckResponse.SERVING if serving
                                   else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _policy(self) -> Policy:
        """`placement.load_gate`: the gate over this replica's load board, fed by the engines'
        metrics (a supervised task): scraped here (`source: scrape`) or streamed from the
        control plane's collector (`source: collector`); when disabled, static stickiness
        (nothing scraped)."""
        config = self._config
        settings = config.placement.load_gate
        if settings.feed is None:
            return STATIC
        board = self.board = LoadBoard(settings.max_load_age_s)
        mix = PrefillMix()  # what this replica's booked requests cost: prices a waiting one
        hbm = self._hbm = (HbmBoard() if settings.feed == "collector" and settings.kv_events
                           else None)
        policy = build_policy(settings, config.placement.engine_cost, board,
                              recent=RecentSessions(max_age_s=config.session.idle_ttl), mix=mix,
                              hbm=hbm, log=log, block_tokens=settings.prefix_block_tokens)
        if settings.feed == "collector":
            addresses = [str(a) for a in settings.collectors(config.control_plane.admin)]
            token = load_token(READ_TOKEN_ENV) or load_token(TOKEN_ENV)
            self.feed = FleetFeed(addresses, board, mix,
                                  FleetFeedMetrics(self.metrics.registry, SERVICE, hbm), token,
                                  stall_s=max(2.0, 10 * settings.refresh_s), hbm=hbm,
                                  tls=self._collector_tls)
            self.supervisor.spawn("fleet-feed", self.feed.run)
            return policy
        scraper = EngineLoadScraper(self.directory.active_addresses, board, mix,
                                    settings.refresh_s,
                                    EngineScrapeMetrics(self.metrics.registry, SERVICE))
        self.supervisor.spawn("engine-load", scraper.run)
        return policy

    def report(self) -> ReplicaReport:
        """This replica as `kvgate status` shows it (kvgate.replicas)."""
        store = self._etcd_store
        unbound = sum(self.metrics.registry.get_sample_value(
            "kvgate_ext_proc_unbound_total", {"reason": r}) or 0.0
            for r in ("pending_full", "max_bindings"))
        return ReplicaReport(
            self._options.identity, time.time(),
            0 if store is None else len(store), 0 if store is None else store.pending,
            store is not None and store.degraded, int(unbound), tuple(self.mirrors.statuses()),
            {pool: dict(self.store.load(pool)) for pool in self.directory.pools()},
            self._backlogs(),
            "" if self.board is None else self._config.placement.load_gate.feed or "",
            None if self.feed is None else self.feed.age_s(),
            self.feed is not None and self.feed.reachable(),
        )

    def _backlogs(self) -> dict[str, float]:
        board = self.board
        if board is None:
            return {}
        now = time.monotonic()  # the board's clock (the gated policy's default)
        return {address: round(board.backlog_s(address, now), 3)
                for address in self.directory.active_addresses()}

    def _unbound(self, pool: str, session: str, why: Unbound) -> None:
        """A new session routed on Envoy's ring without a binding: counted always, logged at
        most every 10 s per reason (a flood of new sessions would flood the log too)."""
        self.metrics.unbound.labels(why.reason).inc()
        self._throttled.warning("session_unbound", why.reason, reason=why.reason, pool=pool,
                                session=session, detail=str(why))

    async def stop(self, grace: float = 5.0) -> None:
        await self._drain()
        if self._server is not None:
            await self._server.stop(grace)
        if self._http is not None:
            await self._http.stop()
        elif self._http_socket is not None:
            self._http_socket.close()
        if self._pd is not None:
            await self._pd.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        if hasattr(self, "store"):  # absent when start() failed before making it
            await self.store.close()
        if self._report is not None:
            self.supervisor.cancel("replica-report")
            await self._report.withdraw()
        await self.supervisor.stop()
        if self._etcd is not None:
            await self._etcd.close()
        log.info("ext_proc_stopped")

    async def _drain(self) -> None:
        """Steps aside (its health check fails) and keeps deciding while Envoy still sends:
        Envoy's check, every 0.25 s, moves this replica's sessions to the others before the
        port closes. Stopped at once, the streams of its sessions in that quarter second would
        all retry at once, and any that found no healthy peer would be routed unbound (a rolling
        upgrade restarting the peer just before). Without traffic it waits for nothing."""
        self._draining = True
        await self._health.enter_graceful_shutdown()
        handler = self._handler
        if handler is None:
            return
        deadline = time.perf_counter() + DRAIN_MAX_S
        while True:  # until DRAIN_QUIET_S pass without a decision, or the deadline
            wait = min(handler.last_decided + DRAIN_QUIET_S, deadline) - time.perf_counter()
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    def _bind_grpc(self, listen: HostPort) -> None:
        self._server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 10_000),
                     # The affinity metadata carries the session key (up to MAX_CARRIED_KEY)
                     # and session headers (Envoy admits 96 KiB of headers): gRPC's default
                     # 8 KiB would refuse such streams, to Envoy's fallback.
                     ("grpc.max_metadata_size", _MAX_METADATA),
                     ("grpc.absolute_max_metadata_size", _MAX_METADATA)]
        )
        self.port = listen_grpc(self._server, listen, "gRPC", _LISTEN_SETTING)

    def _bind_http(self, listen: HostPort) -> None:
        try:
            self._http_socket = socket.create_server((listen.host, listen.port))
        except OSError as exc:
            raise listen_error(listen, "HTTP", _LISTEN_SETTING, exc) from exc
        self._http_socket.setblocking(False)
        self.port = self._http_socket.getsockname()[1]


async def _check_credentials(client: EtcdClient, prefix: str) -> None:
    """Refused credentials are a configuration error: refuse to start, naming them. An etcd that
    does not answer is an outage: serve degraded, as always."""
    try:
        await client.get(prefix.encode())
    except EtcdAuthError:
        raise
    except EtcdError:
        pass
