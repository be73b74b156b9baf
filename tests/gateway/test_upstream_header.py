"""The opt-in upstream header through real Envoy: names the engine that served each request, is
absent unless configured, and an engine cannot forge it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
from aiohttp import web

from tests.support.stack import gateway_config, running_stack
from tests.support.upstreams import Upstream

HEADER = "x-kvgate-upstream"


class ForgingUpstream(Upstream):
    """An engine that sends the header itself, claiming to be somewhere else."""

    async def _handle(self, request: web.Request) -> web.Response:
        response = await super()._handle(request)
        response.headers[HEADER] = "10.9.9.9:1"
        return response


async def test_upstream_header_names_the_serving_engine_only_when_configured(
        tmp_path: Path, prefix: str) -> None:
    engines = [ForgingUpstream(), ForgingUpstream()]
    for engine in engines:
        await engine.start()
    try:
        config = gateway_config([e.address for e in engines], prefix=prefix)
        async with running_stack(replace(config, upstream_header=HEADER), tmp_path / "on") as s:
            async with httpx.AsyncClient(base_url=f"http://{s.config.listener}") as http:
                for session in ("a", "b", "c", "d"):
                    reply = await http.get("/v1/models", headers={"x-session-id": session})
                    assert reply.status_code == 200, reply.text
                    assert reply.headers[HEADER] == reply.json()["upstream"]
        async with running_stack(config, tmp_path / "off") as s:
            async with httpx.AsyncClient(base_url=f"http://{s.config.listener}") as http:
                reply = await http.get("/v1/models", headers={"x-session-id": "a"})
                assert reply.status_code == 200
                # Off: Envoy adds nothing; what the engine sent passes through untouched.
                assert reply.headers[HEADER] == "10.9.9.9:1"
    finally:
        for engine in engines:
            await engine.stop()
