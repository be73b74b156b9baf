"""The scale benchmark's engines: endpoints that only answer health probes."""

from __future__ import annotations

from aiohttp import web


class Engines:
    """Endpoints that answer the control plane's health probes (and nothing else): what the
    benchmark measures never reaches an engine."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def nothing(request: web.Request) -> web.Response:
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", nothing)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for port in self.ports:
            await web.TCPSite(self._runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
