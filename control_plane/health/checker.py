"""Probe every engine's health path; scrape its /metrics (the load `kvgate endpoints list` and
`kvgate status` show, kept in memory); publish state changes (leader only).

Every replica probes, so a new leader starts from fresh observations; only the leader writes
them to etcd, so replicas never fight over a record. A state etcd did not take (unreachable, out
of space) is written again at every probe until it is; the probes themselves never wait on etcd.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import structlog
from prometheus_client import CollectorRegistry

from control_plane.health.guard import allowed_failures, guard
from control_plane.health.lag import LoopLag
from control_plane.health.metrics import HealthMetrics
from control_plane.health.scrape import LoadTracker
from control_plane.health.tracker import HealthTracker
from control_plane.operations import EndpointLoad, Probes
from kvgate.config.model import Config, Endpoint, Pool
from kvgate.endpoints import EndpointRecords, UnknownEndpoint
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.records import Fence
from kvgate.runtime.tasks.supervisor import Supervisor

log = structlog.get_logger("kvgate.health")

SCRAPE_INTERVAL = 5.0
_RESULTS = {True: "ok", False: "failed", None: "inconclusive"}


class HealthChecker:
    def __init__(
        self, config: Config, client: EtcdClient, supervisor: Supervisor,
        leading: Callable[[], bool] = lambda: True,
        registry: CollectorRegistry | None = None,
        fence: Callable[[], Fence | None] = lambda: None,
    ) -> None:
        self._config = config
        self._records = EndpointRecords(client, config.etcd.prefix)
        self._leading = leading
        self._fence = fence  # the leader's: a deposed leader's verdicts are refused by etcd
        self._supervisor = supervisor
        self._tasks: list[str] = []  # names of this checker's tasks under the supervisor
        self._unpublished: set[tuple[str, str]] = set()  # states etcd has not taken yet
        self._http: aiohttp.ClientSession | None = None
        self.metrics = HealthMetrics(registry or CollectorRegistry())
        self.lag = LoopLag()
        # What this replica says (published while it leads): the probes' verdicts, guarded.
        self.healthy: dict[tuple[str, str], bool] = {}
        # Engines whose probes say dead, since when (loop time): the guard serves them in order.
        self._failing: dict[tuple[str, str], float] = {}
        # Engines probes call dead that the guard keeps active, and why (what status shows).
        self.held: dict[tuple[str, str], str] = {}
        self._settling: dict[str, asyncio.Lock] = {}
        self.loads: dict[str, LoadTracker] = {}

    def probes(self, pool: str, address: str) -> Probes:
        key = (pool, address)
        return Probes(key in self._failing, self.held.get(key, ""))

    def load(self, address: str) -> EndpointLoad:
        tracker = self.loads.get(address)
        return EndpointLoad() if tracker is None else tracker.current

    async def start(self) -> None:
        # Probes must not reuse a connection the engine has half-closed: one per probe.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self._supervisor.spawn("health-loop-lag", self.lag.run)
        self._spawn()

    def _spawn(self) -> None:
        for pool in self._config.pools:
            for endpoint in pool.endpoints:
                where = f"{pool.name}/{endpoint.key}"
                for name, run in ((f"probe:{where}", self._watch), (f"scrape:{where}",
                                                                   self._scrape)):
                    self._supervisor.spawn(name, functools.partial(run, pool, endpoint))
                    self._tasks.append(name)

    async def reconfigure(self, config: Config) -> None:
        await self._cancel()
        self._config = config
        wanted = {(p.name, e.key) for p in config.pools for e in p.endpoints}
        self.healthy = {k: v for k, v in self.healthy.items() if k in wanted}
        self._unpublished &= wanted
        # Failed engines keep their verdict (their probes restart failed); held ones are judged
        # again from fresh probes.
        self._failing = {k: t for k, t in self._failing.items()
                         if k in wanted and not self.healthy.get(k, True)}
        self.held = {k: why for k, why in self.held.items() if k in self._failing}
        self._spawn()

    async def stop(self) -> None:
        await self._cancel()
        await self._supervisor.stop(["health-loop-lag"])
        if self._http is not None:
            await self._http.close()

    async def _cancel(self) -> None:
        await self._supervisor.stop(self._tasks)
        self._tasks = []

    async def publish_all(self) -> None:
        """On taking leadership: make etcd say what this replica observes."""
        for (pool, address), healthy in list(self.healthy.items()):
            if not await self._publish(pool, address, healthy):
                self._unpublished.add((pool, address))

    async def _watch(self, pool: Pool, endpoint: Endpoint) -> None:
        health = pool.health
        key = (pool.name, endpoint.key)
        tracker = HealthTracker(health.unhealthy_threshold, health.healthy_threshold,
                                failed=key in self._failing)
        self.healthy.setdefault(key, True)
        url = f"http://{endpoint.key}{health.path}"
        loop = asyncio.get_running_loop()
        while True:
            result = await self._probe(url, health.timeout)
            self.metrics.probes.labels(pool.name, _RESULTS[result]).inc()
            changed = None if result is None else tracker.observe(result)
            if changed is not None:
                log.warning("endpoint_probes", pool=pool.name, endpoint=endpoint.key,
                            healthy=not changed)
                if changed:
                    self._failing[key] = loop.time()
                else:
                    self._failing.pop(key, None)
                await self._settle(pool)
            elif key in self._unpublished and await self._publish(*key, self.healthy[key]):
                self._unpublished.discard(key)
            await asyncio.sleep(health.interval)

    async def _settle(self, pool: Pool) -> None:
        """Publishes the pool's guarded verdicts: at most max_failed_fraction failed at once."""
        async with self._settling.setdefault(pool.name, asyncio.Lock()):
            keys = [(pool.name, e.key) for e in pool.endpoints]
            failing = sorted((k for k in keys if k in self._failing), key=self._failing.__getitem__)
            failed = {k for k in keys if not self.healthy.get(k, True)}
            limit = allowed_failures(len(keys), pool.health.max_failed_fraction)
            verdict = guard(failing, failed, limit)
            why = (f"the health guard keeps it active: {len(verdict.failed)} of the pool's "
                   f"{len(keys)} engines are failed already, health.max_failed_fraction "
                   f"{pool.health.max_failed_fraction:g} allows {limit}")
            for key in verdict.held:
                if key not in self.held:
                    self.metrics.held.labels(pool.name).inc()
                    log.warning("health_guard_holding", pool=pool.name, endpoint=key[1],
                                failing=len(failing), limit=limit, reason=why)
            self.held = {k: v for k, v in self.held.items() if k not in keys}
            self.held |= {key: why for key in verdict.held}
            self.metrics.holding.labels(pool.name).set(len(verdict.held))
            for key in keys:
                healthy = key not in verdict.failed
                if self.healthy.get(key, True) != healthy:
                    self.healthy[key] = healthy
                    log.warning("endpoint_health", pool=pool.name, endpoint=key[1],
                                healthy=healthy)
                    self._unpublished.add(key)
            for key in keys:
                if key in self._unpublished and await self._publish(*key, self.healthy[key]):
                    self._unpublished.discard(key)

    async def _probe(self, url: str, limit: float) -> bool | None:
        """True: healthy; False: not; None: timed out while the loop itself was stalled for
        half the timeout or more, so the engine's answer may just not have been read."""
        assert self._http is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as reply:
                return 200 <= reply.status < 300
        except TimeoutError:
            end = loop.time()
            stalled = max(self.lag.stalled_between(start, end), end - start - limit)
            return None if stalled >= limit / 2 else False
        except (aiohttp.ClientError, OSError):
            return False

    async def _scrape(self, pool: Pool, endpoint: Endpoint) -> None:
        assert self._http is not None
        tracker = self.loads.setdefault(endpoint.key, LoadTracker())
        url = f"http://{endpoint.key}/metrics"
        while True:
            try:
                timeout = aiohttp.ClientTimeout(total=pool.health.timeout)
                async with self._http.get(url, timeout=timeout) as reply:
                    if reply.status == 200:
                        tracker.update(await reply.text())
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                pass  # health probes decide about failure; load is best effort
            await asyncio.sleep(SCRAPE_INTERVAL)

    async def _publish(self, pool: str, address: str, healthy: bool) -> bool:
        """Writes one endpoint's observed health; False if etcd did not take it (retried at the
        next probe). A follower has nothing to write: publish_all runs when it takes over."""
        if not self._leading():
            return True
        try:
            await self._records.update(pool, address, lambda r: replace(r, healthy=healthy),
                                       fence=self._fence())
        except UnknownEndpoint:
            pass  # removed from the config meanwhile
        except EtcdError as exc:
            log.warning("endpoint_publish_failed", pool=pool, endpoint=address, healthy=healthy,
                        kind=str(exc.kind), error=str(exc))
            return False
        return True
