"""The DDR pool as a service, and the clients engine instances use to reach it.

Endpoints (JSON; hashes are unsigned 64-bit integers):

- ``POST /v1/lookup``  ``{"hashes": [h, ...], "skip": s}`` -> ``{"hits": n}``, n = blocks past
  the first s (the engine's HBM hit) the pool serves, found as its connector profile looks them
  up; with ``"device": i`` the n blocks are also moved to engine i's HBM and the answer comes
  once they are there (the transfer model of :mod:`emulator.pool_host`)
- ``POST /v1/store``  ``{"hashes": [h, ...], "hbm_blocks": a, "ddr_blocks": b}`` ->
  ``{"inserted": m}``: a prefill is done (a leading blocks came from HBM, b then from the pool);
  its prompt's blocks are written as the profile says, m new
- ``POST /v1/finish``  the same and ``"answer": [h, ...]`` -> ``{"inserted": m}``: a request is
  over (decode blocks, end-of-request refresh, as the profile says)
- ``POST /v1/held``  ``{"hashes": [h, ...]}`` -> ``{"held": [h, ...]}``: those the pool holds,
  nothing refreshed
- ``POST /v1/insert``  ``{"hashes": [h, ...]}`` -> ``{"inserted": k}``, k = new blocks
- each answers 503 while the pool is down (``--pool-fail``)
- ``GET /v1/stats`` -> the connector profile's name, counters and occupancy
- ``GET /health`` -> ``ok``
- ``GET /metrics`` -> the same as Prometheus text (``kvgate_ddr_pool_*``)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
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

    async def load(self, hashes: Sequence[int], device: int, skip: int = 0) -> int:
        """How many of ``hashes`` past the first ``skip`` the pool serves, returning once they
        are in ``device``'s HBM."""
        ...

    async def insert(self, hashes: Sequence[int]) -> None:
        """Put ``hashes`` in the pool."""
        ...

    async def store(self, hashes: Sequence[int], hbm_blocks: int, ddr_blocks: int) -> None:
        """A prefill is done: offer its prompt's blocks (the profile decides what is written)."""
        ...

    async def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int,
                     ddr_blocks: int) -> None:
        """A request is over: its prompt's and answer's blocks (the profile decides)."""
        ...

    async def close(self) -> None:
        """Release resources."""
        ...


class LocalPoolClient:
    """The pool in this process: called directly, no HTTP."""

    def __init__(self, host: PoolHost) -> None:
        self.host = host

    async def load(self, hashes: Sequence[int], device: int, skip: int = 0) -> int:
        """See :class:`PoolClient`."""
        return await self.host.load(hashes, device, skip) if hashes else 0

    async def insert(self, hashes: Sequence[int]) -> None:
        """See :class:`PoolClient`."""
        self.host.insert(hashes)

    async def store(self, hashes: Sequence[int], hbm_blocks: int, ddr_blocks: int) -> None:
        """See :class:`PoolClient`."""
        self.host.store(hashes, hbm_blocks, ddr_blocks)

    async def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int,
                     ddr_blocks: int) -> None:
        """See :class:`PoolClient`."""
        self.host.finish(prompt, answer, hbm_blocks, ddr_blocks)

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

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        async with self._client().post(f"{self.base_url}{path}", json=body) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def load(self, hashes: Sequence[int], device: int, skip: int = 0) -> int:
        """See :class:`PoolClient`."""
        if not hashes:
            return 0
        body = await self._post("/v1/lookup", {"hashes": list(hashes), "device": device,
                                               "skip": skip})
        return int(body["hits"])

    async def insert(self, hashes: Sequence[int]) -> None:
        """See :class:`PoolClient`."""
        if hashes:
            await self._post("/v1/insert", {"hashes": list(hashes)})

    async def store(self, hashes: Sequence[int], hbm_blocks: int, ddr_blocks: int) -> None:
        """See :class:`PoolClient`."""
        if hashes:
            await self._post("/v1/store", {"hashes": list(hashes), "hbm_blocks": hbm_blocks,
                                           "ddr_blocks": ddr_blocks})

    async def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int,
                     ddr_blocks: int) -> None:
        """See :class:`PoolClient`."""
        await self._post("/v1/finish", {"hashes": list(prompt), "answer": list(answer),
                                        "hbm_blocks": hbm_blocks, "ddr_blocks": ddr_blocks})

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


def _hash_list(body: Any, key: str) -> list[int] | None:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, list) or not all(_is_int(h) for h in value):
        return None
    return value


def _count(body: dict[str, Any], key: str) -> int | None:
    """A non-negative integer field (absent: 0), or None when it is anything else."""
    value = body.get(key, 0)
    return value if _is_int(value) and value >= 0 else None


async def _read_body(request: web.Request) -> dict[str, Any] | web.Response:
    """The JSON body with a valid ``hashes`` list, or the 400 that says what is wrong."""
    try:
        body: Any = await request.json()
    except ValueError:
        return _bad_request("body is not valid JSON")
    if _hash_list(body, "hashes") is None:
        return _bad_request("'hashes' must be a list of integers")
    assert isinstance(body, dict)
    for key in ("skip", "hbm_blocks", "ddr_blocks"):
        if _count(body, key) is None:
            return _bad_request(f"'{key}' must be a non-negative integer")
    device = body.get("device")
    if device is not None and not (_is_int(device) and device >= 0):
        return _bad_request("'device' must be a non-negative integer")
    if "answer" in body and _hash_list(body, "answer") is None:
        return _bad_request("'answer' must be a list of integers")
    return body


def _down(exc: PoolUnavailable) -> web.Response:
    return web.json_response(
        {"error": {"message": str(exc), "type": "ServiceUnavailable", "param": None,
                   "code": 503}}, status=503)


_PoolOp = Callable[[PoolHost, dict[str, Any]], Awaitable[Any]]


def _pool_handler(key: str, op: _PoolOp) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A POST handler: the body checked (400), ``op`` run on the pool, its answer sent as
    ``{key: answer}``, or 503 while the pool is down."""

    async def handle(request: web.Request) -> web.Response:
        body = await _read_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            answer = await op(request.app[POOL_KEY], body)
        except PoolUnavailable as exc:
            return _down(exc)
        return web.json_response({key: answer})

    return handle


async def _lookup(host: PoolHost, body: dict[str, Any]) -> int:
    hashes, device, skip = body["hashes"], body.get("device"), body.get("skip", 0)
    return (host.lookup(hashes, skip) if device is None
            else await host.load(hashes, device, skip))


async def _held(host: PoolHost, body: dict[str, Any]) -> list[int]:
    return host.held(body["hashes"])


async def _insert(host: PoolHost, body: dict[str, Any]) -> int:
    return host.insert(body["hashes"])


async def _store(host: PoolHost, body: dict[str, Any]) -> int:
    return host.store(body["hashes"], body.get("hbm_blocks", 0), body.get("ddr_blocks", 0))


async def _finish(host: PoolHost, body: dict[str, Any]) -> int:
    return host.finish(body["hashes"], body.get("answer", []), body.get("hbm_blocks", 0),
                       body.get("ddr_blocks", 0))


async def _stats(request: web.Request) -> web.Response:
    host = request.app[POOL_KEY]
    return web.json_response({**host.stats(), "connector": host.pool.profile.name})


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
    app.router.add_post("/v1/lookup", _pool_handler("hits", _lookup))
    app.router.add_post("/v1/held", _pool_handler("held", _held))
    app.router.add_post("/v1/insert", _pool_handler("inserted", _insert))
    app.router.add_post("/v1/store", _pool_handler("inserted", _store))
    app.router.add_post("/v1/finish", _pool_handler("inserted", _finish))
    app.router.add_get("/v1/stats", _stats)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app
