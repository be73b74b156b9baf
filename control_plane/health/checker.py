"""Probe every engine's health path; write state changes to its etcd endpoint record."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import structlog

from control_plane.health.tracker import HealthTracker
from kvgate.config.model import Config, Endpoint, Pool
from kvgate.endpoints import EndpointRecords, UnknownEndpoint
from kvgate.etcd import EtcdClient, EtcdUnavailable

log = structlog.get_logger("kvgate.health")


class HealthChecker:
    def __init__(self, config: Config, client: EtcdClient) -> None:
        self._config = config
        self._records = EndpointRecords(client, config.etcd.prefix)
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None
        self.states: dict[str, str] = {}

    async def start(self) -> None:
        # Probes must not reuse a connection the engine has half-closed: one per probe.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        for pool in self._config.pools:
            for endpoint in pool.endpoints:
                self._tasks.append(asyncio.create_task(
                    self._watch(pool, endpoint), name=f"health-{endpoint.key}"
                ))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.close()

    async def _watch(self, pool: Pool, endpoint: Endpoint) -> None:
        health = pool.health
        tracker = HealthTracker(health.unhealthy_threshold, health.healthy_threshold)
        url = f"http://{endpoint.key}{health.path}"
        self.states[endpoint.key] = "active"
        while True:
            changed = tracker.observe(await self._probe(url, health.timeout))
            if changed is not None:
                state = "failed" if changed else "active"
                self.states[endpoint.key] = state
                log.warning("endpoint_health", pool=pool.name, endpoint=endpoint.key, state=state)
                await self._publish(pool, endpoint, state)
            await asyncio.sleep(health.interval)

    async def _probe(self, url: str, limit: float) -> bool:
        assert self._http is not None
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as reply:
                return 200 <= reply.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _publish(self, pool: Pool, endpoint: Endpoint, state: str) -> None:
        healthy = state != "failed"
        for _ in range(20):
            try:
                await self._records.update(
                    pool.name, endpoint.key, lambda r: replace(r, healthy=healthy)
                )
                return
            except UnknownEndpoint:
                return  # removed from the config meanwhile
            except EtcdUnavailable as exc:
                log.warning("endpoint_publish_failed", endpoint=endpoint.key, error=str(exc))
                await asyncio.sleep(0.5)
