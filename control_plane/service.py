"""The control plane's lifecycle: validate (admin token, listening ports, the snapshot) before
any side effect → etcd membership → etcd mirrors → snapshot cache → ADS → leader election,
health checks, failover; config reloads on SIGHUP or file change. Stopped in reverse order.

Every background task runs under one supervisor (kvgate.runtime.tasks.supervisor): a task that fails
is logged, counted, shown in `kvgate status` and restarted with backoff.
"""

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
from prometheus_client import CollectorRegistry, Counter, Gauge

from control_plane.admin.server import AdminServer, ServerTls
from control_plane.discovery import Discovery
from control_plane.discovery.metrics import DiscoveryMetrics
from control_plane.discovery.probes import DiscoveredProbes
from control_plane.failover import Failover
from control_plane.fleet import ControlPlaneCollector
from control_plane.health import HealthChecker
from control_plane.leader import LeaderElection
from control_plane.membership import membership_fields, membership_warning
from control_plane.operations import Operations
from control_plane.resources.snapshot import gateway_resources
from control_plane.status import ControlPlaneStatus
from control_plane.xds.cache import InconsistentSnapshot, SnapshotCache, check_consistency
from control_plane.xds.metrics import XdsMetrics
from control_plane.xds.server import AdsServer, NodeRegistry
from kvgate.config import Config, ConfigError, load_file
from kvgate.config.model import HostPort
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.endpoints import (
    EndpointDirectory,
    MembershipConflict,
    MembershipWatch,
    sync_membership,
)
from kvgate.etcd import EtcdClient, EtcdError, KeyValue, PrefixMirror
from kvgate.etcd.alarms import EtcdAlarmWatch
from kvgate.etcd.client import WatchEvent, wait_until_ready
from kvgate.etcd.observed import EtcdErrorLog, MirrorMetrics
from kvgate.etcd.security import etcd_security
from kvgate.observability.http import MetricsServer
from kvgate.runtime.tasks.listen import listen_grpc, listen_metrics
from kvgate.runtime.tasks.supervisor import Supervisor

log = structlog.get_logger("kvgate.control_plane")


@dataclass(frozen=True, slots=True)
class ControlPlaneOptions:
    config_path: Path
    etcd: tuple[str, ...]
    admin: HostPort
    metrics: HostPort | None = None
    admin_token: str | None = None  # the operator token (None on loopback: one is made)
    admin_read_token: str | None = None
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
        self.registry = CollectorRegistry()
        self.supervisor = Supervisor("control_plane", self.registry)
        self.etcd_errors = EtcdErrorLog("control_plane", self.registry)
        self.mirrors = MirrorMetrics("control_plane", self.registry)
        # etcd.tls / etcd.auth: files and password read now (EtcdSecurityError: not started)
        self._etcd = EtcdClient(options.etcd, on_error=self.etcd_errors,
                                security=etcd_security(config.etcd))
        self.etcd_alarms = EtcdAlarmWatch(self._etcd, "control_plane", self.registry)
        self.cache = SnapshotCache()
        self.nodes = NodeRegistry()
        self.directory = EndpointDirectory(config)
        self._states_changed = asyncio.Event()
        self.leader = LeaderElection(
            self._etcd, f"{config.etcd.prefix}leader".encode(), options.identity,
            on_change=self._on_leadership,
        )
        self.checker = HealthChecker(config, self._etcd, self.supervisor,
                                     leading=lambda: self.leader.leading, registry=self.registry,
                                     fence=self.leader.fence)
        # Same shape as ext_proc's kvgate_ext_proc_rebinds_total: the moves made here.
        rebinds = Counter("kvgate_control_plane_rebinds",
                          "Sessions the control plane moved, by reason (failed, drained: the "
                          "failover; manual: kvgate sessions move)", ["reason"],
                          registry=self.registry)
        for reason in MoveReason:
            rebinds.labels(reason.value)

        def moved(reason: MoveReason, count: int) -> None:
            rebinds.labels(reason.value).inc(count)

        self.failover = Failover(self._etcd, self.directory, config.etcd.prefix,
                                 config.placement.load_factor, on_moved=moved,
                                 fence=self.leader.fence)
        self.operations = Operations(self._etcd, config.etcd.prefix, loads=self.checker.load,
                                     on_moved=moved, probes=self.checker.probes)
        self.last_reload_error: str | None = None
        self.membership = MembershipWatch(config.etcd.prefix)
        # load_gate.source: collector: the leader scrapes each engine once for every ext_proc.
        self.fleet = ControlPlaneCollector(lambda: self.config, self.leader, self.directory,
                                           self.registry)
        self.discovery, self.probe_set = self._discovery()
        self._seen_stamp = _stamp(options.config_path)  # kept across restarts of the reload task
        self._reload_retry_at: float | None = None  # loop time; set after etcd refused a reload
        self._reload_backoff = 1.0
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

    def _discovery(self) -> tuple[Discovery, DiscoveredProbes]:
        """pools[].discover: engines from DNS and registrations, written by the leader; the
        health checks follow them."""
        discovery = Discovery(self._etcd, self.directory, self.supervisor,
                              DiscoveryMetrics(self.registry),
                              leading=lambda: self.leader.leading, fence=self.leader.fence)
        return discovery, DiscoveredProbes(discovery, self.directory, self.checker.reconfigure,
                                           self.mirrors)

    async def start(self, etcd_wait: float = 10.0) -> None:
        # Validate, then act: whatever can refuse the start (the admin token, a port in use, a
        # config Envoy would reject) is checked before etcd is written.
        problems = check_consistency(gateway_resources(self.config, self._configured_states()))
        if problems:
            raise ValueError("the config makes an inconsistent Envoy snapshot: "
                             + "; ".join(problems))
        self._admin = AdminServer(self.operations, self.status, self._options.admin,
                                  self._options.admin_token, self._health,
                                  self._options.admin_tls, self._options.admin_read_token,
                                  self.fleet.stream)
        self._xds = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AdsServer(self.cache, XdsMetrics(self.registry), self.nodes), self._xds
        )
        self.xds_port = listen_grpc(self._xds, self.config.control_plane.xds, "xDS",
                                    "--xds or control_plane.xds")
        await self._admin.start(serving=False)
        if self._options.metrics is not None:
            self._metrics_server = await listen_metrics(self.registry, self._options.metrics,
                                                        "--metrics")

        loop = asyncio.get_running_loop()
        await wait_until_ready(self._etcd, loop.time() + etcd_wait,
                               self.config.etcd.prefix.encode())
        state = await sync_membership(self._etcd, self.config, self._options.identity,
                                      claim=False)
        self.membership.stored = state.stored
        if not state.in_sync:
            log.warning("membership_differs", **membership_fields(state.stored))
        endpoints = self.mirrors.track(PrefixMirror(
            self._etcd, self.directory.prefix, _Notifying(self.directory, self._states_changed),
            "endpoints"))
        membership = self.mirrors.track(PrefixMirror(
            self._etcd, self.membership.key, self.membership, "membership"))
        self.supervisor.spawn("endpoints-mirror", endpoints.run)
        self.supervisor.spawn("membership-mirror", membership.run)
        await asyncio.wait_for(endpoints.synced.wait(), etcd_wait)
        self.probe_set.configure(self.config)
        await self._publish()
        await self._xds.start()
        await self.checker.start()
        await self.probe_set.follow(self.config)
        await self.discovery.start()
        for name, run in (("leader-election", self.leader.run), ("snapshot", self._snapshot_loop),
                          ("failover", self._failover_loop), ("reload", self._reload_loop),
                          ("etcd-alarms", self.etcd_alarms.run),
                          ("fleet-collector", self.fleet.collector.run)):
            self.supervisor.spawn(name, run)
        await self._admin.set_serving()
        log.info("control_plane_ready", xds=f"{self.config.control_plane.xds.host}:"
                 f"{self.xds_port}", admin=str(self._options.admin),
                 identity=self._options.identity,
                 **(self._etcd.security.describe() if self._etcd.security else {}))

    def _configured_states(self) -> dict[str, dict[str, EndpointState]]:
        return {p.name: {e.key: EndpointState.ACTIVE for e in p.endpoints}
                for p in self.config.pools}

    def request_reload(self) -> None:
        self._reload_wanted.set()

    def status(self) -> ControlPlaneStatus:
        snapshot = self.cache.current
        stored = self.membership.stored
        return ControlPlaneStatus(
            identity=self._options.identity,
            leader=self.leader.leader,
            config_version=snapshot.version if snapshot else "",
            config_source=str(self._options.config_path),
            nodes=self.nodes.snapshot(),
            last_reload_error=self.last_reload_error,
            failing_tasks=tuple(self.supervisor.failing()),
            etcd_errors=tuple(self.etcd_errors.recent()),
            membership_generation=0 if stored is None else stored.generation,
            membership_warning=membership_warning(stored, self.config),
            mirrors=tuple(self.mirrors.statuses()),
            fleet_collector=self.fleet.status(),
            discovery=self.discovery.views(),
        )

    # -- background loops ------------------------------------------------------------------

    async def _publish(self) -> None:
        states = self.directory.states()
        self._endpoint_state.clear()
        for pool, members in states.items():
            for address, state in members.items():
                self._endpoint_state.labels(pool, address, state).set(1)
        try:
            serving = self.probe_set.serving(self.config)
            snapshot = await self.cache.publish(gateway_resources(serving, states))
        except InconsistentSnapshot as exc:
            log.error("snapshot_inconsistent", error=str(exc))
            return
        log.debug("snapshot_published", version=snapshot.version)

    async def _snapshot_loop(self) -> None:
        while True:
            await self._states_changed.wait()
            self._states_changed.clear()
            try:
                await self._publish()
                await self.probe_set.follow(self.config)
            except BaseException:
                self._states_changed.set()  # not published: the restarted loop tries again
                raise
            self._failover_wanted.set()

    async def _failover_loop(self) -> None:
        while True:
            if self.leader.leading:
                try:
                    await self.failover.sweep()
                except EtcdError as exc:  # anything else goes to the supervisor
                    log.warning("failover_sweep_failed", kind=str(exc.kind), error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._failover_wanted.wait(), 0.25)
            self._failover_wanted.clear()

    def _on_leadership(self, leading: bool) -> None:
        if leading:
            self.discovery.seed()
            self.failover.forget()
            self.supervisor.cancel("publish-health")
            self.supervisor.spawn("publish-health", self.checker.publish_all, once=True)

    async def _reload_loop(self) -> None:
        loop = asyncio.get_running_loop()
        path = self._options.config_path
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload_wanted.wait(), 0.2)  # a stat() per tick
            changed = self._options.watch_file and _stamp(path) != self._seen_stamp
            retry = self._reload_retry_at is not None and loop.time() >= self._reload_retry_at
            if not (self._reload_wanted.is_set() or changed or retry):
                continue
            self._reload_wanted.clear()
            self._seen_stamp = _stamp(path)
            self._reload_retry_at = None
            await self.reload()

    async def reload(self) -> bool:
        """Validate, then act: the file is parsed and checked, then etcd must accept its endpoint
        membership, and only then is it applied in memory. A file failing any step changes
        nothing and says why (log, `kvgate status`); an etcd refusal is retried with backoff."""
        try:
            config = load_file(self._options.config_path)
        except ConfigError as exc:
            return self._reload_failed(exc.render(), [str(p) for p in exc.problems])
        for key in ("prefix", "tls", "auth"):  # the etcd client is made once, at start
            if getattr(config.etcd, key) != getattr(self.config.etcd, key):
                return self._reload_failed(f"etcd.{key} cannot change while running; "
                                           "restart instead")
        problems = check_consistency(gateway_resources(config, self._configured_states()))
        if problems:
            return self._reload_failed("the config makes an inconsistent Envoy snapshot: "
                                       + "; ".join(problems))
        try:
            state = await sync_membership(self._etcd, config, self._options.identity, claim=True,
                                          before_write=self._membership_writing)
        except MembershipConflict as exc:
            return self._reload_failed(str(exc))
        except EtcdError as exc:
            delay = self._reload_backoff
            self._reload_backoff = min(self._reload_backoff * 2, 30.0)
            self._reload_retry_at = asyncio.get_running_loop().time() + delay
            return self._reload_failed(
                f"etcd did not take the new endpoint membership ({exc.kind}): {exc}; the "
                f"running config stays; retrying in {delay:.0f}s", kind=str(exc.kind),
            )
        self._reload_backoff = 1.0
        self.membership.stored = state.stored
        self.config = config
        self.last_reload_error = None
        self.directory.reconfigure(config)
        await self.probe_set.reload(config)
        self._states_changed.set()
        log.info("config_reloaded", pools=len(config.pools),
                 endpoints=sum(len(p.endpoints) for p in config.pools),
                 membership_generation=None if state.stored is None else state.stored.generation,
                 records_changed=state.changed)
        return True

    def _membership_writing(self) -> None:
        """The reload's write is about to leave: the endpoints mirror may show its records before
        etcd's reply reaches `reload`, so a failed reload's error is cleared first and no reader
        ever sees the new membership beside it. Should the write fail, the error is set again."""
        self.last_reload_error = None

    def _reload_failed(
        self, reason: str, problems: list[str] | None = None, kind: str | None = None
    ) -> bool:
        self.last_reload_error = reason
        log.error("config_rejected", problems=problems or [reason], kind=kind)
        return False

    async def stop(self, grace: float = 2.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._admin is not None:
            await self._admin.stop(grace)
        if self._xds is not None:
            await self._xds.stop(grace)
        await self.checker.stop()
        await self.supervisor.stop()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        await self._etcd.close()
        log.info("control_plane_stopped")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What says the file changed: its mtime, size and inode. Not the mtime alone: a file
    rewritten in place (truncated, then written) within one tick of the kernel's coarse clock
    keeps its mtime, and a reload that read it truncated would never see it whole."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino
