"""Errors the gateway itself makes reach a stock OpenAI client as OpenAI-style JSON with the
status that fits: its exception carries the message and the status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.stack import gateway_config, running_stack


def _error(reply: httpx.Response) -> dict[str, object]:
    assert reply.headers["content-type"].startswith("application/json"), reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["message"], error
    return dict(error)


async def test_a_body_over_the_limit_is_413_json(tmp_path: Path, upstreams, prefix: str) -> None:
    ups = await upstreams(2)
    config = gateway_config([u.address for u in ups], prefix=prefix, default_routes=True,
                            extra={"max_request_bytes": "64KiB"})
    async with running_stack(config, tmp_path):
        async with openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                      api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x" * 100_000}])
        assert caught.value.status_code == 413
        assert "max_request_bytes: 65536 bytes" in caught.value.message
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == (
            "request_too_large")

        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            async def chunks():  # no Content-Length: refused all the same
                for _ in range(10):
                    yield b"y" * 10_000

            reply = await http.post("/v1/completions", content=chunks(),
                                    headers={"content-type": "application/json"})
            assert reply.status_code == 413
            assert _error(reply)["type"] == "invalid_request_error"
            # Within the limit, sized or not, a body goes through whole.
            small = await http.post("/v1/completions", content=b'{"prompt": "hi"}',
                                    headers={"content-type": "application/json"})
            assert small.status_code == 200
            # A path the gateway does not serve: 404, JSON too.
            missing = await http.get("/admin")
            assert missing.status_code == 404 and _error(missing)["code"] == "not_found"
    assert 100_000 not in [size for u in ups for size in u.seen_body_sizes]


async def _resetting_engine() -> asyncio.Server:
    """An engine that accepts each connection and drops it before answering."""
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.transport.abort()  # a reset, not an answer

    return await asyncio.start_server(drop, "127.0.0.1", 0)


@pytest.mark.parametrize("fault", ["refused", "reset"])
async def test_an_engine_that_does_not_answer_is_503_json(
    tmp_path: Path, upstreams, prefix: str, fault: str
) -> None:
    if fault == "refused":
        ups = await upstreams(1)
        await ups[0].stop()  # nothing listens there any more: every connection is refused
        address, server = ups[0].address, None
    else:
        server = await _resetting_engine()
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    config = gateway_config([address], prefix=prefix)
    try:
        async with running_stack(config, tmp_path):
            async with openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                          api_key="unused", max_retries=0) as client:
                with pytest.raises(openai.APIStatusError) as caught:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hello"}])
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()
    assert caught.value.status_code == 503
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "server_error", body
    assert body["code"] in ("engine_unreachable", "no_healthy_engine"), body
    assert "engine" in caught.value.message
    assert ("reset" in caught.value.message or "termination" in caught.value.message) if (
        fault == "reset") else "connection" in caught.value.message


async def test_bodies_past_the_connection_buffer_pass_whole_up_to_the_limit(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    """The default limit (32 MiB) is far above the listener's per-connection buffer (~4 MiB,
    session.body_limit's): a 6 MB prompt, sized or chunked, reaches its engine whole."""
    ups = await upstreams(1)
    config = gateway_config([ups[0].address], prefix=prefix)
    assert config.max_request_bytes == 32 << 20
    body = b'{"prompt": "' + b"z" * 6_000_000 + b'"}'

    async def chunks():
        for start in range(0, len(body), 1 << 20):
            yield body[start:start + (1 << 20)]

    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=60) as http:
            for content in (body, chunks()):
                reply = await http.post("/v1/completions", content=content,
                                        headers={"content-type": "application/json"})
                assert reply.status_code == 200, reply.text[:300]
    assert ups[0].seen_body_sizes == [len(body), len(body)]
