"""The load gate's engine scrape: it asks for its three gauges only where the engine filters
(vLLM's /metrics/ with name[]), and reads the whole page from an engine that has no such path."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import ScrapeRounds
from kvgate.placement.live import LoadBoard
from kvgate.routing.engine_load import (
    FULL_PATH,
    LOAD_GAUGES,
    LOAD_PATH,
    EngineLoadScraper,
    EngineScrapeMetrics,
)

PAGE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.5
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0"} 1234.0
"""


@pytest.fixture(params=[404, 200])
async def whole_page_only(
        request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[str]]]:
    """An engine that serves /metrics, and under it nothing (404) or a page without the gauges
    (200: some other server's catch-all); records the paths asked for."""
    asked: list[str] = []
    status: int = request.param

    async def metrics(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        return web.Response(text=PAGE)

    async def elsewhere(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        return web.Response(status=status, text="not a metrics page\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/{anything:.*}", elsewhere)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


def scraper(addresses: list[str]) -> tuple[EngineLoadScraper, LoadBoard, CollectorRegistry]:
    board, registry = LoadBoard(), CollectorRegistry()
    return (EngineLoadScraper(lambda: addresses, board, PrefillMix(), 0.1,
                              EngineScrapeMetrics(registry, "ext_proc")), board, registry)


@pytest.mark.asyncio
async def test_an_engine_without_the_filtered_path_is_read_from_its_whole_page(
        whole_page_only: tuple[str, list[str]]) -> None:
    address, asked = whole_page_only
    scrape, board, registry = scraper([address])
    async with ScrapeRounds.session() as http:
        await scrape.scrape_round(http)  # nothing usable at the filtered path: counted failed
        assert board.observed(address, time.monotonic()) is None
        await scrape.scrape_round(http)
        await scrape.scrape_round(http)
    first = urlsplit(asked[0])
    assert first.path == "/metrics/"
    assert parse_qs(first.query)["name[]"] == list(LOAD_GAUGES)
    assert asked[1:] == [FULL_PATH, FULL_PATH]
    load = board.observed(address, time.monotonic())
    assert load is not None
    assert (load.figures.waiting, load.figures.running, load.figures.kv_usage) == (3, 2, 0.5)
    assert registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total",
                                     {"result": "failed"}) == 1


@pytest.mark.asyncio
async def test_an_emulated_engine_is_read_from_its_filtered_page() -> None:
    async with Fleet(EmulatorOptions(time_scale=0, no_ddr_pool=True)) as fleet:
        address = fleet.engines[0]
        scrape, board, registry = scraper([address])
        async with ScrapeRounds.session() as http:
            await scrape.scrape_round(http)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}{LOAD_PATH}") as reply:
                page = await reply.text()
    assert "vllm:num_requests_waiting" in page and "vllm:prompt_tokens" not in page
    assert board.observed(address, time.monotonic()) is not None
    assert registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total",
                                     {"result": "ok"}) == 1
