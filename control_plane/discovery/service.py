"""Each discovering pool's reconciler, fed by its sources; the leader writes the result to etcd.

Every replica resolves (so each can say how old its sources' answers are); only the leader
writes. A new leader, or a restarted control plane, seeds its reconcilers from the records
already in etcd, so it neither re-adds nor forgets an engine. Envoy's endpoints (EDS), the
health checks and ext_proc's rings all follow the records (with_discovered)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial

import structlog

from control_plane.discovery.metrics import DiscoveryMetrics
from control_plane.discovery.records import RecordWriter
from kvgate.config import Config
from kvgate.config.address import HostPort
from kvgate.config.model import Endpoint, Pool
from kvgate.config.sections.discover import Discover
from kvgate.discovery.dns import SOURCE as DNS
from kvgate.discovery.dns import DnsFailure, DnsResolver
from kvgate.discovery.reconcile import Changes, Engine, Found, Reconciler, Resolution
from kvgate.discovery.registrations import SOURCE as REGISTRATIONS
from kvgate.discovery.registrations import RegistrationTable
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, EtcdError, PrefixMirror
from kvgate.etcd.records import Fence
from kvgate.runtime.tasks.supervisor import Supervisor

log = structlog.get_logger("kvgate.discovery")

EXPIRE_EVERY = 0.5  # seconds between looks for drains that are over
REGISTRATIONS_EVERY = 0.1  # seconds between looks at the registrations mirror
REGISTRATIONS_REFRESH = 1.0  # an unchanged, synced mirror still counts as an answer this often


@dataclass(frozen=True, slots=True)
class SourceView:
    """One source of one pool, as `kvgate status` shows it."""

    pool: str
    source: str
    engines: int  # addresses its last good answer named
    age_s: float | None  # since its last good answer (None: none yet)
    error: str  # its last failure since then ("" when its last try answered)


def thresholds(discover: Discover) -> dict[str, int]:
    found = {}
    if discover.dns is not None:
        found[DNS] = discover.misses
    if discover.etcd is not None:
        found[REGISTRATIONS] = 1  # a lost lease: the TTL was the hysteresis
    return found


def with_discovered(config: Config, directory: EndpointDirectory) -> Config:
    """`config` with each discovering pool's discovered records as endpoints (after the file's,
    by address): what Envoy's EDS and the health checks serve."""
    pools = []
    for pool in config.pools:
        if pool.discover is not None:
            listed = {e.key for e in pool.endpoints}
            found = sorted((r for r in directory.records(pool.name)
                            if r.discovered and r.address not in listed),
                           key=lambda r: r.address)
            extra = tuple(Endpoint(_host_port(r.address), r.kv_pool, r.weight) for r in found)
            pool = replace(pool, endpoints=pool.endpoints + extra)
        pools.append(pool)
    return replace(config, pools=tuple(pools))


def _host_port(address: str) -> HostPort:
    host, _, port = address.rpartition(":")
    return HostPort(host.strip("[]"), int(port))


class Discovery:
    def __init__(self, client: EtcdClient, directory: EndpointDirectory, supervisor: Supervisor,
                 metrics: DiscoveryMetrics, *, leading: Callable[[], bool],
                 fence: Callable[[], Fence | None], clock: Callable[[], float] = time.time
                 ) -> None:
        self._directory = directory
        self._supervisor = supervisor
        self._metrics = metrics
        self._leading = leading
        self._fence = fence
        self._clock = clock
        self._writer: RecordWriter | None = None
        self._client = client
        self.reconcilers: dict[str, Reconciler] = {}
        self._settings: dict[str, tuple[Discover, float, frozenset[str]]] = {}
        self._tasks: list[str] = []
        self._pools: dict[str, Pool] = {}
        self.registrations: RegistrationTable | None = None
        self.mirror: PrefixMirror | None = None  # of registrations/, made by configure

    def configure(self, config: Config) -> None:
        """Reconcilers for the config's discovering pools; one whose settings are unchanged
        keeps its engines. Call `start` (again) to run its sources."""
        self._writer = RecordWriter(self._client, config.etcd.prefix)
        if self.registrations is None:
            self.registrations = RegistrationTable(config.etcd.prefix)
            self.mirror = PrefixMirror(self._client, self.registrations.prefix,
                                       self.registrations, "registrations")
        kept: dict[str, Reconciler] = {}
        for pool in config.pools:
            if pool.discover is None:
                continue
            static = frozenset(e.key for e in pool.endpoints)
            settings = (pool.discover, pool.health.max_failed_fraction, static)
            if self._settings.get(pool.name) == settings:
                kept[pool.name] = self.reconcilers[pool.name]
            else:
                kept[pool.name] = Reconciler(
                    misses=thresholds(pool.discover), drain_s=pool.discover.drain,
                    max_fraction=pool.health.max_failed_fraction, static=static)
            self._settings[pool.name] = settings
        self._settings = {k: v for k, v in self._settings.items() if k in kept}
        self.reconcilers = kept
        self.seed()
        self._pools = {p.name: p for p in config.pools if p.discover is not None}

    def seed(self) -> None:
        """Engines etcd's records already hold (a previous leader's writes)."""
        now = self._clock()
        for name, reconciler in self.reconcilers.items():
            for record in self._directory.records(name):
                if not record.discovered or record.address in reconciler.engines:
                    continue
                known = record.source in reconciler.sources
                left = record.left_at if known else (record.left_at or now)
                found = Found(record.address, record.kv_pool, record.weight)
                reconciler.seed(Engine(found, record.source, {record.source: 0} if known
                                       else {}, left))

    async def start(self) -> None:
        await self.stop()
        for pool in self._pools.values():
            assert pool.discover is not None
            if pool.discover.dns is not None:
                self._spawn(f"discover-dns:{pool.name}", partial(self._dns_loop, pool))
        if any(p.discover is not None and p.discover.etcd is not None
               for p in self._pools.values()):
            assert self.mirror is not None
            self._spawn("registrations-mirror", self.mirror.run)
            self._spawn("discover-etcd", self._registrations_loop)
        self._spawn("discover-expire", self._expire_loop)

    def _spawn(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        self._supervisor.spawn(name, run)
        self._tasks.append(name)

    async def stop(self) -> None:
        await self._supervisor.stop(self._tasks)
        self._tasks = []

    async def _dns_loop(self, pool: Pool) -> None:
        assert pool.discover is not None and pool.discover.dns is not None
        resolver = DnsResolver(pool.discover.dns, pool.kv_pool)
        while True:
            try:
                found: tuple[Found, ...] | None = await resolver.resolve()
                error = ""
            except DnsFailure as exc:
                found, error = None, str(exc)
                log.warning("discovery_failed", pool=pool.name, source=DNS, error=error)
            await self.observe(pool.name, Resolution(DNS, found, self._clock(), error))
            await asyncio.sleep(pool.discover.dns.every)

    async def _registrations_loop(self) -> None:
        """Each change of the registrations mirror is an answer of every pool's `etcd` source;
        a mirror out of sync (etcd unreachable) is a failure, which changes nothing."""
        assert self.mirror is not None and self.registrations is not None
        seen, last = -1, 0.0
        while True:
            now = self._clock()
            table = self.registrations
            if table.changes != seen or now - last >= REGISTRATIONS_REFRESH:
                seen, last = table.changes, now
                for pool in self._pools.values():
                    if pool.discover is None or pool.discover.etcd is None:
                        continue
                    source = pool.discover.etcd
                    if self.mirror.connected:
                        found: tuple[Found, ...] | None = tuple(
                            r.found(source, pool.kv_pool)
                            for _, r in sorted(table.pools.get(pool.name, {}).items()))
                        error = ""
                    else:
                        found = None
                        error = str(self.mirror.last_error or "registrations not in sync")
                    await self.observe(pool.name, Resolution(REGISTRATIONS, found, now, error))
            await asyncio.sleep(REGISTRATIONS_EVERY)

    async def observe(self, pool: str, resolution: Resolution) -> None:
        reconciler = self.reconcilers.get(pool)
        if reconciler is None:
            return
        changes = reconciler.observe(resolution)
        self._metrics.observed(pool, resolution, changes)
        self._log(pool, changes)
        await self.apply(pool)

    async def _expire_loop(self) -> None:
        while True:
            for pool, reconciler in list(self.reconcilers.items()):
                changes = reconciler.expire(self._clock())
                if changes:
                    self._metrics.expired(pool, changes)
                    self._log(pool, changes)
                await self.apply(pool)
            await asyncio.sleep(EXPIRE_EVERY)

    async def apply(self, pool: str) -> None:
        """Leader only: etcd's records made to say what the reconciler holds."""
        reconciler = self.reconcilers.get(pool)
        if reconciler is None or self._writer is None or not self._leading():
            return
        try:
            await self._writer.apply(pool, reconciler, self._directory.records(pool),
                                     self._fence())
        except EtcdError as exc:  # the next round writes it again
            log.warning("discovery_write_failed", pool=pool, kind=str(exc.kind), error=str(exc))

    @staticmethod
    def _log(pool: str, changes: Changes) -> None:
        for kind in ("added", "returned", "leaving", "removed"):
            for engine in getattr(changes, kind):
                log.info(f"discovered_engine_{kind}", pool=pool, endpoint=engine.found.address,
                         source=engine.source, kv_pool=engine.found.kv_pool)
        if changes.held:
            log.warning("discovery_bound_holding", pool=pool, engines=list(changes.held))

    def views(self) -> tuple[SourceView, ...]:
        now = self._clock()
        return tuple(
            SourceView(pool, name, status.engines, reconciler.staleness(name, now),
                       status.last_error)
            for pool, reconciler in sorted(self.reconcilers.items())
            for name, status in sorted(reconciler.sources.items()))
