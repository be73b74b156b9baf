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

from control_plane.health.scrape import LoadTracker
from control_plane.health.tracker import HealthTracker
from control_plane.operations import EndpointLoad
from kvgate.config.model import Config, Endpoint, Pool
from kvgate.endpoints import EndpointRecords, UnknownEndpoint
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.runtime.supervisor import Supervisor

log = structlog.get_logger("kvgate.health")

SCRAPE_INTERVAL = 5.0


class HealthChecker:
    def __init__(
        self, config: Config, client: EtcdClient, supervisor: Supervisor,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._config = config
        self._records = EndpointRecords(client, config.etcd.prefix)
        self._leading = leading
        self._supervisor = supervisor
        self._tasks: list[str] = []  # names of this checker's tasks under the supervisor
        self._unpublished: set[tuple[str, str]] = set()  # states etcd has not taken yet
        self._http: aiohttp.ClientSession | None = None
        self.healthy: dict[tuple[str, str], bool] = {}
        self.loads: dict[str, LoadTracker] = {}

    def load(self, address: str) -> EndpointLoad:
        tracker = self.loads.get(address)
        return EndpointLoad() if tracker is None else tracker.current

    async def start(self) -> None:
        # Probes must not reuse a connection the engine has half-closed: one per probe.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
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
        self._spawn()

    async def stop(self) -> None:
        await self._cancel()
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
                                failed=not self.healthy.get(key, True))
        self.healthy.setdefault(key, True)
        url = f"http://{endpoint.key}{health.path}"
        while True:
            changed = tracker.observe(await self._probe(url, health.timeout))
            if changed is not None:
                self.healthy[key] = not changed
                log.warning("endpoint_health", pool=pool.name, endpoint=endpoint.key,
                            healthy=not changed)
                self._unpublished.add(key)
            if key in self._unpublished and await self._publish(*key, self.healthy[key]):
                self._unpublished.discard(key)
            await asyncio.sleep(health.interval)

    async def _probe(self, url: str, limit: float) -> bool:
        assert self._http is not None
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as reply:
                return 200 <= reply.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError):
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
            await self._records.update(pool, address, lambda r: replace(r, healthy=healthy))
        except UnknownEndpoint:
            pass  # removed from the config meanwhile
        except EtcdError as exc:
            log.warning("endpoint_publish_failed", pool=pool, endpoint=address, healthy=healthy,
                        kind=str(exc.kind), error=str(exc))
            return False
        return True
