"""TTFT against the model, through a fleet in its own process, as in production.

The engine reports each request's TTFT in emulated seconds (`vllm:time_to_first_token_seconds`),
computed from its schedule: that is compared with the documented formula exactly. The wall clock
is only used as a lower bound (at a time scale the first token may come late on a busy machine,
never early), so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import eventually

MODEL = "Qwen/Qwen2.5-32B-Instruct"
SCALE = 0.5
C0_S, RATE, KV_BYTES, DDR_BPS, DECODE_S = 0.5, 5000.0, 256 * 1024, 2e9, 0.1


ROOT = Path(__file__).resolve().parents[2]
FleetFactory = Callable[..., AbstractAsyncContextManager[list[str]]]


@pytest.fixture
def fleet(tmp_path: Path) -> FleetFactory:
    """Start ``python -m emulator`` with the timing parameters (plus extra args); yields engines."""

    @asynccontextmanager
    async def run(*extra: str) -> AsyncIterator[list[str]]:
        ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
        cmd = [sys.executable, "-m", "emulator", "--time-scale", str(SCALE),
               "--prefill-overhead-ms", str(C0_S * 1000), "--prefill-tokens-per-s", str(RATE),
               "--kv-bytes-per-token", str(KV_BYTES), "--ddr-gbps", str(DDR_BPS / 1e9),
               "--decode-ms-per-token", str(DECODE_S * 1000), "--log-level", "warning",
               "--ready-file", str(ready), *extra]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT)
        try:

            def written() -> bool:
                assert proc.returncode is None, "emulator exited"
                return ready.exists()

            await eventually(written, what="the emulator's ready file")
            yield json.loads(ready.read_text())["engines"]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 60) == 0

    return run


def model_ttft(prompt: int, hbm_hit: int, ddr_hit: int) -> float:
    """The documented formula without a queue, emulated seconds: c0 + computed / rate + DDR
    bytes / bandwidth."""
    computed = prompt - hbm_hit - ddr_hit
    return C0_S + computed / RATE + ddr_hit * KV_BYTES / DDR_BPS


async def reported_ttfts(engine: str) -> tuple[float, float]:
    """(count, sum) of the engine's `vllm:time_to_first_token_seconds`, emulated seconds."""
    async with aiohttp.ClientSession() as http, http.get(f"http://{engine}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:time_to_first_token_seconds":
            values = {s.name.rsplit("_", 1)[1]: s.value for s in family.samples}
            return values["count"], values["sum"]
    raise AssertionError("no vllm:time_to_first_token_seconds in /metrics")


async def occupancy(engine: str) -> tuple[int, int]:
    """(running, waiting) as the engine reports them."""
    async with aiohttp.ClientSession() as http, http.get(f"http://{engine}/admin/stats") as resp:
        stats = await resp.json()
    return stats["running"], stats["waiting"]


async def timed(engine: str, prompt: list[int], max_tokens: int = 2) -> tuple[float, float, int]:
    """(wall seconds to the first token, the engine's emulated TTFT, cached_tokens)."""
    count, total = await reported_ttfts(engine)
    wall, cached = await ttft(engine, prompt, max_tokens)
    count_after, total_after = await reported_ttfts(engine)
    assert count_after == count + 1
    return wall, total_after - total, cached


async def ttft(engine: str, prompt: list[int], max_tokens: int = 2) -> tuple[float, int]:
    """(wall seconds to the first content chunk, cached_tokens) of a streamed completion.

    Raw aiohttp with a pre-encoded body: the openai client's request building and validation
    cost tens of milliseconds on a loaded 2-core machine, which is not the engine's TTFT.
    """
    request = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
               "stream_options": {"include_usage": True}}  # fmt: skip
    body = json.dumps(request).encode()
    url = f"http://{engine}/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{engine}/health") as resp:  # connect first: not TTFT
            assert resp.status == 200
        first: float | None = None
        cached = -1
        start = time.perf_counter()
        async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.perf_counter() - start
                if chunk.get("usage"):
                    cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert first is not None
        return first, cached


async def test_cold_warm_and_ddr_ttft_match_the_model(fleet: FleetFactory) -> None:
    prompt = list(range(2500))
    async with fleet("--instances", "2") as (a, b):
        # cold; again on the same engine (n-1 rule: 156 full blocks from HBM); on the sibling
        # (the same blocks from the DDR pool).
        for engine, hbm_hit, ddr_hit in ((a, 0, 0), (a, 2496, 0), (b, 0, 2496)):
            wall, emulated, cached = await timed(engine, prompt)
            assert cached == hbm_hit + ddr_hit
            # TTFT counts from the request's arrival, so the DDR pool's lookup (a loopback call
            # to the pool, timed on the emulated clock) adds its own few hundred microseconds
            # to the formula: never less than the model, and never more than the wall allows.
            assert emulated >= model_ttft(2500, hbm_hit, ddr_hit) - 1e-9
            # The server waits the emulated time (scaled) before the first token: never less.
            assert wall >= emulated * SCALE - 0.001


async def test_a_request_waits_for_a_slot(fleet: FleetFactory) -> None:
    # The first request holds the only slot for 300 emulated s of decode (150 s wall): the
    # second certainly arrives meanwhile. The engine reports a TTFT when it admits a request
    # (its schedule is known then), so neither answer is awaited.
    decode_tokens = 3000
    async with fleet("--max-num-seqs", "1", "--no-ddr-pool") as (engine,):
        started = time.monotonic()
        first = asyncio.create_task(ttft(engine, list(range(1000)), max_tokens=1 + decode_tokens))
        second: asyncio.Task[tuple[float, int]] | None = None
        try:
            admitted = await eventually(lambda: reported_ttfts(engine),
                                        until=lambda reported: reported[0] == 1,
                                        what="the first request admitted")
            second = asyncio.create_task(ttft(engine, list(range(5000, 6000)), max_tokens=4))
            both = await eventually(lambda: reported_ttfts(engine),
                                    until=lambda reported: reported[0] == 2,
                                    what="the second request admitted")
            arrived_within = (time.monotonic() - started) / SCALE  # emulated s, at most
            assert await occupancy(engine) == (1, 1)  # one holds the slot, one waits
        finally:
            tasks = [t for t in (first, second) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    own = model_ttft(1000, 0, 0)
    assert admitted[1] == pytest.approx(own, rel=1e-9)
    waited = both[1] - admitted[1]
    # The second's first token comes when the slot frees (the first one's end) plus its own
    # prefill, counted from its arrival, which came at most `arrived_within` after the first's.
    slot_frees = own + decode_tokens * DECODE_S
    due = slot_frees + own
    assert due - arrived_within <= waited <= due
    assert waited > slot_frees - arrived_within > own  # far beyond its own prefill alone
