"""Tiny HTTP upstreams that say who they are and which headers reached them."""

from __future__ import annotations

from aiohttp import web


class Upstream:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.requests = 0
        self.probes = 0
        self.scrapes = 0  # of /metrics/: the load gate's (the control plane's own go to /metrics)
        self.metrics_page = ""  # what /metrics/ and /metrics answer (vLLM text format)
        self.seen_headers: list[dict[str, str]] = []
        self.seen_body_sizes: list[int] = []
        self.probes_refused = False  # /health answers 503: the control plane's probes fail
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, port: int = 0) -> None:
        # 8 KiB session ids must reach the upstream: raise aiohttp's 8190-byte header limit.
        app = web.Application(handler_args={"max_field_size": 65536, "max_line_size": 65536})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port or self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Closes the listener and every open connection: like a dead engine."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        # The control plane's probes and the load gate's scrapes (at vLLM's /metrics/ first).
        if request.path in ("/health", "/metrics", "/metrics/"):
            self.probes += 1
            if request.path == "/health":
                if self.probes_refused:
                    return web.Response(status=503, text="unavailable\n")
                return web.Response(text="ok\n")
            self.scrapes += request.path == "/metrics/"
            return web.Response(text=self.metrics_page)
        self.requests += 1
        self.seen_headers.append({k.lower(): v for k, v in request.headers.items()})
        self.seen_body_sizes.append(len(await request.read()))
        return web.json_response(
            {"upstream": self.address, "path": request.path},
            headers={"x-engine-id": self.address},
        )
