"""Real instances on loopback, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from kvgate.routing.engine_load import LOAD_GAUGES, LOAD_PATH, LOAD_QUERY
from tests.support.polling import eventually

MODEL = "Qwen/Qwen2.5-32B-Instruct"
CODE = "".join(
    f"def handler_{i}(request):\n    return route(request, pool={i})\n" for i in range(60)
)
MESSAGES = [
    {"role": "system", "content": "You are a code assistant."},
    {"role": "user", "content": "Explain this module:\n" + CODE},
]


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with Fleet(EmulatorOptions(instances=2, time_scale=0)) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def client(engine: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://{engine}/v1", api_key="unused", max_retries=0)


async def metrics(http: aiohttp.ClientSession, engine: str) -> dict[str, float]:
    """Samples of an instance's /metrics, keyed by sample name (one model label)."""
    async with http.get(f"http://{engine}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL
            if sample.name.endswith("_bucket"):
                continue
            out[sample.name] = sample.value
    return out


async def chat(engine: str, stream: bool) -> tuple[openai.types.CompletionUsage, str, str]:
    """(usage, text, x-engine-id) of one chat completion."""
    async with client(engine) as c:
        if not stream:
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=8
            )
            resp = raw.parse()
            assert resp.usage is not None
            return resp.usage, resp.choices[0].message.content or "", raw.headers["x-engine-id"]
        raw_stream = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        engine_id = raw_stream.headers["x-engine-id"]
        usage, text, roles = None, "", []
        async for chunk in raw_stream.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                if choice.delta.role:
                    roles.append(choice.delta.role)
        assert roles == ["assistant"]
        assert usage is not None
        return usage, text, engine_id


@pytest.mark.parametrize("stream", [False, True])
async def test_second_identical_request_on_same_instance_is_cached(
    fleet: Fleet, stream: bool
) -> None:
    engine = fleet.engines[0]
    first, text1, engine_id = await chat(engine, stream)
    second, text2, _ = await chat(engine, stream)
    assert engine_id == engine
    assert first.prompt_tokens > 500 and first.completion_tokens == 8
    assert first.prompt_tokens_details is not None and second.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0
    assert second.prompt_tokens_details.cached_tokens >= 0.9 * second.prompt_tokens
    assert text1 == text2 and len(text1.split()) == 8  # deterministic filler, max_tokens honoured


async def test_same_request_on_sibling_hits_the_ddr_pool(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    a, b = fleet.engines
    await chat(a, stream=False)
    before = await metrics(http, b)
    usage, _, engine_id = await chat(b, stream=True)
    after = await metrics(http, b)
    assert engine_id == b
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens
    hits = "vllm:external_prefix_cache_hits_total"
    queries = "vllm:external_prefix_cache_queries_total"
    assert after[hits] - before[hits] == usage.prompt_tokens_details.cached_tokens
    assert after[queries] - before[queries] == usage.prompt_tokens
    assert after["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]


async def test_without_ddr_pool_the_sibling_misses(http: aiohttp.ClientSession) -> None:
    async with Fleet(EmulatorOptions(instances=2, time_scale=0, no_ddr_pool=True)) as f:
        assert f.pool_url is None
        a, b = f.engines
        await chat(a, stream=False)
        usage, _, _ = await chat(b, stream=False)
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0
        m = await metrics(http, b)
        assert m["vllm:external_prefix_cache_hits_total"] == 0
        assert m["vllm:external_prefix_cache_queries_total"] == 0


async def test_instances_in_another_process_share_a_pool_over_http() -> None:
    async with Fleet(EmulatorOptions(instances=1, time_scale=0)) as host:
        assert host.pool_url is not None
        joined_opts = EmulatorOptions(instances=1, time_scale=0, pool_url=host.pool_url)
        async with Fleet(joined_opts) as joined:
            assert joined.pool is None and joined.pool_url == host.pool_url
            await chat(joined.engines[0], stream=False)  # writes through HTTP
            assert host.pool is not None and len(host.pool) > 30
            usage, _, _ = await chat(host.engines[0], stream=False)
            assert usage.prompt_tokens_details is not None
            assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens


async def test_metrics_counters_agree_with_requests_sent(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    engine = fleet.engines[0]
    usages = [(await chat(engine, stream=i % 2 == 1))[0] for i in range(4)]
    async with client(engine) as c:
        done = await c.completions.create(model=MODEL, prompt="hello world " * 50, max_tokens=3)
    assert done.usage is not None
    usages.append(done.usage)
    m = await metrics(http, engine)
    assert m["vllm:request_success_total"] == 5
    assert m["vllm:prefix_cache_queries_total"] == sum(u.prompt_tokens for u in usages)
    assert m["vllm:prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    assert m["vllm:generation_tokens_total"] == sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages if u.prompt_tokens_details)
    assert m["vllm:prefix_cache_hits_total"] == cached  # all on this instance's HBM
    assert m["vllm:time_to_first_token_seconds_count"] == 5
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert 0 <= m["vllm:kv_cache_usage_perc"] <= 1


async def test_metrics_name_filter_works_where_vllms_does(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    """As vLLM 0.32: /metrics is the whole page whatever the query; /metrics/ honours name[]
    (prometheus_client's exposition), which the load gate's scraper asks for."""
    engine = fleet.engines[0]
    await chat(engine, stream=False)
    async with http.get(f"http://{engine}/metrics") as resp:
        full = await resp.text()
    async with http.get(f"http://{engine}/metrics?{LOAD_QUERY}") as resp:
        ignored = await resp.text()
    async with http.get(f"http://{engine}{LOAD_PATH}") as resp:
        assert resp.status == 200
        filtered = await resp.text()

    def names(text: str) -> set[str]:
        return {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    assert names(filtered) == set(LOAD_GAUGES)
    assert names(ignored) == names(full) > set(LOAD_GAUGES)
    assert len(filtered) * 5 < len(full)


async def test_completions_stream_and_token_id_prompts(fleet: Fleet) -> None:
    async with client(fleet.engines[1]) as c:
        chunks = [
            ch
            async for ch in await c.completions.create(
                model=MODEL, prompt=list(range(100)), max_tokens=5, stream=True,
                stream_options={"include_usage": True},
            )
        ]  # fmt: skip
        texts = [ch.choices[0].text for ch in chunks if ch.choices]
        assert len(texts) == 5 and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == 100
        again = await c.completions.create(model=MODEL, prompt=list(range(100)), max_tokens=5)
        assert again.choices[0].text == "".join(texts)
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == 96


async def test_malformed_requests_get_400s_and_the_instance_keeps_serving(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    engine = fleet.engines[0]
    url = f"http://{engine}/v1/chat/completions"
    bad_bodies: list[tuple[bytes, str]] = [
        (b"{not json", "JSON"),
        (b"[1, 2]", "object"),
        (b'{"model": "%s"}' % MODEL.encode(), "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": "hi"}', "messages"),
        (b'{"messages": [{"content": "x"}]}', "role"),
        (b'{"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}', "does not exist"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ]
    for body, needle in bad_bodies:
        async with http.post(url, data=body) as resp:
            payload = await resp.json()
            assert resp.status == 400, body
            assert resp.headers["x-engine-id"] == engine
            assert needle in payload["error"]["message"], (body, payload)
    async with http.post(f"http://{engine}/v1/completions", json={"prompt": ""}) as resp:
        assert resp.status == 400 and "empty" in (await resp.json())["error"]["message"]
    for prompt in ([1.5], [2**70], [-1], {"a": 1}):
        async with http.post(f"http://{engine}/v1/completions", json={"prompt": prompt}) as resp:
            assert resp.status == 400 and "prompt" in (await resp.json())["error"]["message"]
    async with http.get(f"http://{engine}/v1/nothing") as resp:
        assert resp.status == 404 and resp.headers["x-engine-id"] == engine
    async with client(engine) as c:
        with pytest.raises(openai.BadRequestError, match="does not exist"):
            await c.chat.completions.create(model="nope", messages=MESSAGES)
    usage, _, _ = await chat(engine, stream=False)
    assert usage.completion_tokens == 8


async def test_models_health_and_engine_id_template(http: aiohttp.ClientSession) -> None:
    opts = EmulatorOptions(instances=2, time_scale=0, model="m1", engine_id="emu-{index}")
    async with Fleet(opts) as f, client(f.engines[1]) as c:
        models = await c.models.list()
        assert [m.id for m in models.data] == ["m1"]
        async with http.get(f"http://{f.engines[1]}/health") as resp:
            assert resp.status == 200 and resp.headers["x-engine-id"] == "emu-1"


async def test_last_request_headers_are_recorded(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    engine = fleet.engines[0]
    await http.post(
        f"http://{engine}/v1/completions",
        json={"prompt": "hi", "max_tokens": 1},
        headers={"x-session-id": "abc", "X-Custom": "1"},
    )
    for probe in ("/health", "/metrics", "/metrics/"):  # probes and scrapes do not overwrite it
        async with http.get(f"http://{engine}{probe}", headers={"x-custom": "probe"}) as resp:
            assert resp.status == 200
    async with http.get(f"http://{engine}/admin/last-request-headers") as resp:
        seen = await resp.json()
    assert seen["path"] == "/v1/completions"
    assert seen["headers"]["x-session-id"] == "abc" and seen["headers"]["x-custom"] == "1"
    assert "x-gateway-destination-endpoint" not in seen["headers"]


async def refused(engine: str) -> bool:
    host, port = engine.rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def _listening(engine: str) -> bool:
    return not await refused(engine)


async def test_fault_injection(fleet: Fleet) -> None:
    engine = fleet.engines[0]
    chat_url = f"http://{engine}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    # A fresh session per phase: a pooled connection must not hide a refusal.
    async with aiohttp.ClientSession() as http:
        admin = f"http://{engine}/admin/fault"
        await http.post(admin, json={"mode": "unhealthy"})
        async with http.get(f"http://{engine}/health") as resp:
            assert resp.status == 503
        await http.post(admin, json={"mode": "error503"})
        async with http.post(chat_url, json=body) as resp:
            assert resp.status == 503 and resp.headers["x-engine-id"] == engine
        async with http.post(admin, json={"mode": "bogus"}) as resp:
            assert resp.status == 400
        await http.post(admin, json={"mode": "none"})
        async with http.post(chat_url, json=body) as resp:
            assert resp.status == 200
        # Long enough that no stall of this process can let it lapse before the check.
        async with http.post(admin, json={"mode": "refuse", "for_s": 3600}) as resp:
            assert resp.status == 200
    assert await refused(engine)
    # A short refusal lapses by itself (the port is closed, so set it in process).
    await fleet.server(engine).set_fault("refuse", for_s=0.1)
    await eventually(lambda: _listening(engine), what="the instance listening again")
    async with aiohttp.ClientSession() as http, http.post(chat_url, json=body) as resp:
        assert resp.status == 200
    # The sibling never stopped serving.
    assert not await refused(fleet.engines[1])


async def test_stopping_a_fleet_does_not_wait_for_long_streams() -> None:
    fleet = Fleet(EmulatorOptions(instances=1, time_scale=1.0, decode_ms_per_token=1000))
    await fleet.start()
    engine = fleet.engines[0]
    async with aiohttp.ClientSession() as http:
        body = {"prompt": "x " * 20, "max_tokens": 100, "stream": True}
        async with http.post(f"http://{engine}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # first token is out; 99 s of decode remain
            await fleet.stop()
            try:
                rest = await resp.content.read()
            except aiohttp.ClientPayloadError:  # cut mid-stream
                rest = b""
            # The stream was cut, not served to its end 99 s later.
            assert b"[DONE]" not in rest
        assert fleet.servers[0].model.cache.usage() == 0.0  # the cancelled request unpinned


async def test_refuse_also_drops_pooled_connections_and_set_fault_reopens(fleet: Fleet) -> None:
    engine = fleet.engines[0]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{engine}/health") as resp:
            assert resp.status == 200  # this connection is now pooled
        await fleet.server(engine).set_fault("refuse")  # in-process control, no timer
        assert await refused(engine)
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"http://{engine}/health") as resp:
                await resp.read()
        await fleet.server(engine).set_fault("none")
        async with http.get(f"http://{engine}/health") as resp:
            assert resp.status == 200


async def test_a_busy_port_fails_start_and_leaves_nothing_listening() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fleet = Fleet(EmulatorOptions(instances=1, port=port, time_scale=0))
        with pytest.raises(OSError):
            await fleet.start()
        assert fleet.pool_url is not None
        assert await refused(fleet.pool_url.removeprefix("http://"))


async def test_pool_service_api_and_metrics(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.pool_url
    async with http.post(f"{url}/v1/insert", json={"hashes": [11, 12, 13]}) as resp:
        assert (await resp.json()) == {"inserted": 3}
    async with http.post(f"{url}/v1/lookup", json={"hashes": [11, 12, 99, 13]}) as resp:
        assert (await resp.json()) == {"hits": 2}
    async with http.post(f"{url}/v1/lookup", json={"hashes": ["x"]}) as resp:
        assert resp.status == 400
    async with http.post(f"{url}/v1/lookup", data=b"nope") as resp:
        assert resp.status == 400
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["kvgate_ddr_pool_blocks"] == 3
    assert samples["kvgate_ddr_pool_hit_blocks_total"] == 2
    assert samples["kvgate_ddr_pool_inserted_blocks_total"] == 3
