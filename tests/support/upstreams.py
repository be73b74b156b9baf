"""Tiny HTTP upstreams that say who they are and which headers reached them."""

from __future__ import annotations

import asyncio
import json

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
        self.stream_gap_s = 0.01  # between the events of a streamed answer (?stream=N)
        self.streams_die_after: int | None = None  # events, then the connection drops
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, port: int = 0) -> None:
        # 8 KiB session ids must reach the upstream: raise aiohttp's 8190-byte header limit.
        # ... and bodies as large as the gateway's default limit (aiohttp's own is 1 MiB).
        app = web.Application(handler_args={"max_field_size": 65536, "max_line_size": 65536},
                              client_max_size=64 << 20)
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
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
        events = int(request.query.get("stream", "0"))
        if events:
            return await self._stream(request, events)
        return web.json_response(
            {"upstream": self.address, "path": request.path},
            headers={"x-engine-id": self.address},
        )

    async def _stream(self, request: web.Request, events: int) -> web.StreamResponse:
        """Server-sent events, as an engine streams its tokens: who answers first, then `events`
        more, ``stream_gap_s`` apart, then ``[DONE]``."""
        reply = web.StreamResponse(headers={"content-type": "text/event-stream",
                                            "x-engine-id": self.address})
        await reply.prepare(request)
        await reply.write(f"data: {json.dumps({'upstream': self.address})}\n\n".encode())
        for n in range(events):
            await asyncio.sleep(self.stream_gap_s)  # the pace of the tokens
            if n == self.streams_die_after and request.transport is not None:
                request.transport.close()  # an engine dying in the middle of an answer
                return reply
            await reply.write(f"data: {json.dumps({'n': n})}\n\n".encode())
        await reply.write(b"data: [DONE]\n\n")
        await reply.write_eof()
        return reply
