"""The DDR pool as a service, and the clients engine instances use to reach it.

Endpoints (JSON; hashes are unsigned 64-bit integers):

- ``POST /v1/lookup``  ``{"hashes": [h, ...]}`` -> ``{"hits": n}``, n = leading hashes present;
  with ``"device": i`` the n blocks are also moved to engine i's HBM and the answer comes once
  they are there (the transfer model of :mod:`emulator.pool_host`)
- ``POST /v1/insert``  ``{"hashes": [h, ...]}`` -> ``{"inserted": k}``, k = new blocks
- either answers 503 while the pool is down (``--pool-fail``)
- ``GET /v1/stats`` -> counters and occupancy; ``GET /health`` -> ``ok``
- ``GET /metrics`` -> the same as Prometheus text (``kvgate_ddr_pool_*``)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from emulator.ddr_pool import DdrPool
from emulator.pool_host import PoolHost, PoolUnavailable

POOL_KEY: web.AppKey[PoolHost] = web.AppKey("ddr_pool", PoolHost)
REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)


class PoolCollector(Collector):
    """The pool's counters at scrape time, under ``kvgate_ddr_pool_*``."""

    def __init__(self, pool: DdrPool | PoolHost) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families."""
        stats = self._pool.stats()
        if "read_bytes" in stats:
            yield CounterMetricFamily("kvgate_ddr_pool_read_bytes",
                                      "Bytes moved from the pool into engines' HBM.",
                                      stats["read_bytes"])
            yield GaugeMetricFamily("kvgate_ddr_pool_transfers_in_flight",
                                    "Transfers to engines in flight.",
                                    stats["transfers_in_flight"])
        yield GaugeMetricFamily("kvgate_ddr_pool_blocks", "Blocks held.", stats["blocks"])
        yield GaugeMetricFamily(
            "kvgate_ddr_pool_capacity_blocks", "Capacity in blocks.", stats["capacity_blocks"]
        )
        for key, doc in (
            ("lookups", "Lookup batches served."),
            ("hit_blocks", "Blocks found by lookups."),
            ("inserted_blocks", "New blocks stored."),
            ("evictions", "Blocks evicted (LRU)."),
        ):
            yield CounterMetricFamily(f"kvgate_ddr_pool_{key}", doc, stats[key])


class PoolClient(Protocol):
    """How an engine instance talks to the DDR pool."""

    async def lookup(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` the pool holds."""
        ...

    async def load(self, hashes: Sequence[int], device: int) -> int:
        """Like :meth:`lookup`, returning once the blocks found are in ``device``'s HBM."""
        ...

    async def insert(self, hashes: Sequence[int]) -> None:
        """Store ``hashes`` in the pool."""
        ...

    async def close(self) -> None:
        """Release resources."""
        ...


class LocalPoolClient:
    """The pool in this process: called directly, no HTTP."""

    def __init__(self, host: PoolHost) -> None:
        self.host = host

    async def lookup(self, hashes: Sequence[int]) -> int:
        """See :class:`PoolClient`."""
        return self.host.lookup(hashes)

    async def load(self, hashes: Sequence[int], device: int) -> int:
        """See :class:`PoolClient`."""
        return await self.host.load(hashes, device) if hashes else 0

    async def insert(self, hashes: Sequence[int]) -> None:
        """See :class:`PoolClient`."""
        self.host.insert(hashes)

    async def close(self) -> None:
        """Nothing to release."""


class HttpPoolClient:
    """A pool in another process, reached over HTTP with one pooled session."""

    def __init__(self, base_url: str, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def lookup(self, hashes: Sequence[int]) -> int:
        """See :class:`PoolClient`."""
        if not hashes:
            return 0
        async with self._client().post(
            f"{self.base_url}/v1/lookup", json={"hashes": list(hashes)}
        ) as resp:
            resp.raise_for_status()
            body = await resp.json()
        return int(body["hits"])

    async def load(self, hashes: Sequence[int], device: int) -> int:
        """See :class:`PoolClient`."""
        if not hashes:
            return 0
        async with self._client().post(
            f"{self.base_url}/v1/lookup", json={"hashes": list(hashes), "device": device}
        ) as resp:
            resp.raise_for_status()
            body = await resp.json()
        return int(body["hits"])

    async def insert(self, hashes: Sequence[int]) -> None:
        """See :class:`PoolClient`."""
        if not hashes:
            return
        async with self._client().post(
            f"{self.base_url}/v1/insert", json={"hashes": list(hashes)}
        ) as resp:
            resp.raise_for_status()

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _bad_request(message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}},
        status=400,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _read_body(request: web.Request) -> tuple[list[int], int | None] | web.Response:
    try:
        body: Any = await request.json()
    except ValueError:
        return _bad_request("body is not valid JSON")
    hashes = body.get("hashes") if isinstance(body, dict) else None
    if not isinstance(hashes, list) or not all(_is_int(h) for h in hashes):
        return _bad_request("'hashes' must be a list of integers")
    device = body.get("device")
    if device is not None and not (_is_int(device) and device >= 0):
        return _bad_request("'device' must be a non-negative integer")
    return hashes, device


def _down(exc: PoolUnavailable) -> web.Response:
    return web.json_response(
        {"error": {"message": str(exc), "type": "ServiceUnavailable", "param": None,
                   "code": 503}}, status=503)


async def _lookup(request: web.Request) -> web.Response:
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    hashes, device = body
    host = request.app[POOL_KEY]
    try:
        hits = host.lookup(hashes) if device is None else await host.load(hashes, device)
    except PoolUnavailable as exc:
        return _down(exc)
    return web.json_response({"hits": hits})


async def _insert(request: web.Request) -> web.Response:
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    try:
        return web.json_response({"inserted": request.app[POOL_KEY].insert(body[0])})
    except PoolUnavailable as exc:
        return _down(exc)


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[POOL_KEY].stats())


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def make_pool_app(host: PoolHost) -> web.Application:
    """The aiohttp application serving the pool ``host`` holds."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[POOL_KEY] = host
    registry = CollectorRegistry(auto_describe=False)  # per app: never the global registry
    registry.register(PoolCollector(host))
    app[REGISTRY_KEY] = registry
    app.router.add_post("/v1/lookup", _lookup)
    app.router.add_post("/v1/insert", _insert)
    app.router.add_get("/v1/stats", _stats)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app
