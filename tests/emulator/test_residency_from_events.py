"""HBM residency from the emulator's KV event stream (real ZeroMQ, two emulated engines with
small caches): before every turn, sticky and moved, what the events say the engine holds of the
session is what the turn then finds cached. The same plan runs against real vLLM in
tests/real_vllm/test_residency_vs_vllm.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import httpx
import pytest

from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL
from tests.support.kv_events import Subscriber
from tests.support.ports import free_ports
from tests.support.residency_check import WatchedEngine, converse, summary

USABLE_BLOCKS = 24  # 3,072 tokens per engine: three sessions of up to 1,300 do not fit


@pytest.fixture
async def engines() -> AsyncIterator[list[WatchedEngine]]:
    async with AsyncExitStack() as stack, httpx.AsyncClient(timeout=60) as http:
        watched = []
        for _ in range(2):
            (port,) = free_ports(1)
            fleet = await stack.enter_async_context(Fleet(EmulatorOptions(
                instances=1, time_scale=0, no_ddr_pool=True, model=SERVED_MODEL,
                block_size=BLOCK_SIZE, hbm_tokens=USABLE_BLOCKS * BLOCK_SIZE,
                kv_events_port=port)))
            sub = await stack.enter_async_context(Subscriber(f"tcp://127.0.0.1:{port}", b"kv"))
            engine = WatchedEngine(f"http://{fleet.engines[0]}", sub)

            async def reset(url: str = engine.url) -> None:  # says AllBlocksCleared
                await http.post(f"{url}/reset_prefix_cache")

            await sub.ready(reset)
            watched.append(engine)
        yield watched


async def test_residency_from_events_matches_what_each_turn_finds_cached(
        engines: list[WatchedEngine]) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        rows = await converse(engines, http, BLOCK_SIZE)
    print("\n" + summary(rows, BLOCK_SIZE))
    assert sum(e.gaps for e in engines) == 0
    assert any(r.moved for r in rows)
    assert any(r.cached < r.prompt / 2 for r in rows if not r.moved)  # evictions really happen
    assert any(r.cached >= r.prompt / 2 for r in rows)
    assert [r for r in rows if r.guess != r.cached] == []  # the emulator's events are exact
