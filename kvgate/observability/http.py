"""A tiny aiohttp server for /metrics (Prometheus text) and /healthz."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MetricsServer:
    def __init__(
        self, registry: CollectorRegistry, host: str, port: int,
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._healthy = healthy
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        if self._runner.addresses:  # the port the OS chose when asked for port 0
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _: web.Request) -> web.Response:
        ok = self._healthy()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy\n")
