"""An emulated engine as a real process, asked by real HTTP clients: a prompt past its
``--max-model-len`` is refused as vLLM refuses it (emulator/context_length.py), and a request
whose client goes away stops counting as running or waiting and frees its slot, as vLLM aborts
it (emulator/completions.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from kvgate.runtime.children.child import Child
from tests.support.polling import eventually

MODEL = "Qwen/Qwen2.5-32B-Instruct"


async def _engine(tmp_path: Path, *flags: str) -> AsyncIterator[str]:
    """One emulated engine in its own process (no DDR pool); its address."""
    ready = tmp_path / "engine.json"
    child = Child("engine", [sys.executable, "-m", "emulator", "--instances", "1", "--port", "0",
                             "--no-ddr-pool", "--ready-file", str(ready), *flags],
                  tmp_path / "engine.log")
    await child.start()
    try:
        async def written() -> bool:
            return await asyncio.to_thread(ready.exists)

        await child.wait_ready(written, 60)
        yield json.loads(ready.read_text())["engines"][0]
    finally:
        await child.stop()


@pytest.fixture
async def small_context(tmp_path: Path) -> AsyncIterator[str]:
    async for engine in _engine(tmp_path, "--max-model-len", "64", "--time-scale", "0"):
        yield engine


@pytest.fixture
async def one_slot(tmp_path: Path) -> AsyncIterator[str]:
    """One request at a time, 0.1 s a token: a 2,000-token answer would hold it 200 s."""
    async for engine in _engine(tmp_path, "--max-num-seqs", "1", "--decode-ms-per-token", "100",
                                "--time-scale", "1"):
        yield engine


async def _tokens(http: aiohttp.ClientSession, engine: str, prompt: str) -> int:
    async with http.post(f"http://{engine}/tokenize", json={"prompt": prompt}) as reply:
        return int((await reply.json())["count"])


async def test_a_prompt_past_max_model_len_gets_vllms_400(small_context: str) -> None:
    engine = small_context
    async with aiohttp.ClientSession() as http:
        long_prompt = "hello " * 100
        assert await _tokens(http, engine, long_prompt) > 60
        async with http.post(f"http://{engine}/v1/completions",
                             json={"prompt": long_prompt, "max_tokens": 4}) as reply:
            assert reply.status == 400
            assert await reply.json() == {"error": {
                "message": "This model's maximum context length is 64 tokens. However, you "
                           "requested 4 output tokens and your prompt contains at least 61 "
                           "input tokens, for a total of at least 65 tokens. Please reduce "
                           "the length of the input prompt or the number of requested output "
                           "tokens. (parameter=input_tokens, value=61)",
                "type": "BadRequestError", "param": "input_tokens", "code": 400}}
        async with http.post(f"http://{engine}/v1/completions",
                             json={"prompt": "hello", "max_tokens": 65}) as reply:
            assert reply.status == 400
            assert (await reply.json())["error"]["param"] == "max_tokens"
        # Without max_tokens only the prompt is checked, and the answer fits what is left.
        fits = "hello " * 55
        left = 64 - await _tokens(http, engine, fits)
        assert 0 < left < 16  # below the emulator's default answer of 16 tokens
        async with http.post(f"http://{engine}/v1/completions",
                             json={"prompt": fits}) as reply:
            assert reply.status == 200
            assert (await reply.json())["usage"]["completion_tokens"] == left

    client = AsyncOpenAI(base_url=f"http://{engine}/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": long_prompt}], max_tokens=8)
        assert refused.value.status_code == 400
        assert "maximum context length is 64 tokens" in refused.value.message
        short = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        assert short.usage is not None and short.usage.completion_tokens == 8
    finally:
        await client.close()


async def _occupancy(http: aiohttp.ClientSession, engine: str) -> tuple[float, float]:
    """``(vllm:num_requests_running, vllm:num_requests_waiting)`` as a scrape reads them."""
    async with http.get(f"http://{engine}/metrics") as reply:
        text = await reply.text()
    found = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            found[name] = float(line.rsplit(" ", 1)[1])
    return found["vllm:num_requests_running"], found["vllm:num_requests_waiting"]


async def _ask(engine: str, stream: bool, max_tokens: int,
               first: asyncio.Event | None = None) -> int:
    """One completion on its own connection; its HTTP status once the answer is read whole."""
    body = {"prompt": "a long answer please", "max_tokens": max_tokens, "stream": stream}
    async with aiohttp.ClientSession() as http, http.post(
            f"http://{engine}/v1/completions", json=body) as reply:
        if first is not None:
            await reply.content.readline()
            first.set()
        await reply.read()
        return reply.status


async def test_a_client_that_goes_away_frees_its_place(one_slot: str) -> None:
    engine = one_slot
    async with aiohttp.ClientSession() as http:
        streaming = asyncio.Event()
        running = asyncio.create_task(_ask(engine, True, 2000, streaming))
        await asyncio.wait_for(streaming.wait(), 30)  # its answer is streaming: it holds the slot
        queued = asyncio.create_task(_ask(engine, False, 2000))
        await eventually(lambda: _occupancy(http, engine), until=lambda o: o == (1, 1),
                         what="one running, one waiting")

        queued.cancel()  # the waiting client goes away: its connection closes
        await asyncio.gather(queued, return_exceptions=True)
        await eventually(lambda: _occupancy(http, engine), until=lambda o: o == (1, 0),
                         what="the waiting request gone, the streaming one still running")

        running.cancel()  # the streaming client goes away mid-answer
        await asyncio.gather(running, return_exceptions=True)
        await eventually(lambda: _occupancy(http, engine), until=lambda o: o == (0, 0),
                         what="nothing running or waiting")

        # The slot is free: a short request is answered now, not after the 200 s the
        # abandoned answer would have taken.
        assert await asyncio.wait_for(_ask(engine, False, 2), 30) == 200
