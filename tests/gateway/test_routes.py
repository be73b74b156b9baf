"""Routes closed by default: without `routes:`, real Envoy serves the inference API and answers
404 itself for everything else, so clients never reach an engine's private endpoints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from kvgate.etcd import EtcdClient
from tests.support.fleet import EngineProcesses
from tests.support.stack import gateway_config, running_stack

NOT_SERVED = {"message": "no route: this gateway serves only its configured paths",
              "type": "invalid_request_error", "code": "not_found"}
PRIVATE = [
    ("GET", "/metrics"),
    ("GET", "/health"),
    ("POST", "/admin/fault"),
    ("GET", "/admin/stats"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/tokenize"),
    ("GET", "/v1/chat/completionsX"),
    ("GET", "/"),
    # Sent as written (no client normalizes them): Envoy normalizes before it matches.
    ("GET", "/v1/models/../../metrics"),
    ("GET", "/v1/chat/completions/../../admin/stats"),
    ("GET", "/v1/models/%2e%2e/metrics"),
    ("GET", "//metrics"),
]


async def raw_request(address: str, method: str, path: str, session: str) -> tuple[int, str, str]:
    """(status, x-engine-id or "", body) for a request whose path goes out byte for byte."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"mode": "unhealthy"}' if method == "POST" else b""
    writer.write(f"{method} {path} HTTP/1.1\r\nhost: gateway\r\nx-session-id: {session}\r\n"
                 f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                 "connection: close\r\n\r\n".encode() + body)
    await writer.drain()
    reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, content = reply.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers.get("x-engine-id", ""), content.decode()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[EngineProcesses]:
    engines = EngineProcesses(2, tmp_path / "fleet")
    await engines.start()
    yield engines
    await engines.stop()


async def test_without_routes_only_the_inference_api_is_served(
    tmp_path: Path, fleet: EngineProcesses, prefix: str
) -> None:
    config = gateway_config(fleet.engines, prefix=prefix, default_routes=True)
    async with running_stack(config, tmp_path / "stack") as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            served = await http.post(
                "/v1/chat/completions", headers={"x-session-id": "served"},
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert served.status_code == 200, served.text
            assert served.headers["x-engine-id"] in fleet.engines
            models = await http.get("/v1/models?limit=1")
            assert models.status_code == 200 and models.json()["data"], models.text
            for method, path in PRIVATE:
                status, engine, text = await raw_request(str(config.listener), method, path,
                                                         f"private-{path}")
                assert (status, engine) == (404, ""), path  # Envoy answered, in JSON
                assert json.loads(text)["error"] == NOT_SERVED, text
            # An encoded slash is refused outright: an engine might decode it into a path.
            status, engine, _ = await raw_request(
                str(config.listener), "GET", "/v1/responses/..%2f..%2fmetrics", "encoded")
            assert (status, engine) == (400, "")
            for engine in fleet.engines:  # POST /admin/fault never reached an engine
                fault = (await http.get(f"http://{engine}/admin/fault")).json()
                assert fault == {"mode": "none"}, (engine, fault)
        client = EtcdClient(stack.etcd_endpoints)
        try:
            kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
        finally:
            await client.close()
        assert len(kvs) == 1  # "served" only: ext_proc was not asked about 404s
