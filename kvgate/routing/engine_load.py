"""Live engine load for the load gate: every `refresh_s`, each ext_proc replica scrapes the
/metrics of every active engine it routes to and records what it finds on its `LoadBoard`.

Why here, per replica: the gate reads the board on every request, so it must be in the
replica's memory; a shared copy in etcd would cost a write per engine per refresh and a watch
event per replica, for figures that are stale in 100 ms anyway. Replicas scrape independently
(N replicas × E engines small GETs per refresh; what one round costs is in docs/benchmarks.md).

What it reads (vLLM's names, summed over label sets; asked for by `name[]` where the engine
filters, see LOAD_PATH):
`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`. The
backlog the gate prices comes from the board's ledger (the work this replica sent, exact for
it); an observation only raises it: `waiting × the mean prefill this replica booked` (requests
vLLM has not scheduled yet each still need their prefill; other replicas' traffic shows up
there). Running requests are decoding or
prefilling in chunks already budgeted, so they are reported, not priced.

A scrape that fails or times out leaves the engine's last observation to age: past
`max_age_s` the board ignores it (LoadBoard.observed). A decision never waits on a scrape.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlencode

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from kvgate.contract import vllm
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.routing.recent import PrefillMix

log = structlog.get_logger("kvgate.ext_proc")

LOAD_GAUGES = (vllm.NUM_REQUESTS_WAITING, vllm.NUM_REQUESTS_RUNNING, vllm.KV_CACHE_USAGE_PERC)
# Only those gauges: vLLM 0.32 answers /metrics/ (trailing slash) from prometheus_client's ASGI
# app, which honours name[] (566 bytes against 54 KB for the whole page, docs/benchmarks.md);
# its /metrics ignores the filter. An engine without /metrics/ (404, or a page there without the
# gauges) is scraped at /metrics from then on.
LOAD_QUERY = urlencode([("name[]", name) for name in LOAD_GAUGES])
LOAD_PATH = f"/metrics/?{LOAD_QUERY}"
FULL_PATH = "/metrics"


class EngineScrapeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Counter(
            "kvgate_ext_proc_engine_scrapes", "Scrapes of the engines' /metrics for the load "
            "gate, by result (ok, failed)", ["result"], registry=registry)
        self.round_seconds = Histogram(
            "kvgate_ext_proc_engine_scrape_round_seconds",
            "Wall time of one scrape round over every active engine",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry)
        self.ok = self.scrapes.labels("ok")
        self.failed = self.scrapes.labels("failed")


class EngineLoadScraper:
    """Runs under the service's supervisor (`run`); one HTTP session, keep-alive connections."""

    def __init__(
        self, engines: Callable[[], Iterable[str]], board: LoadBoard, mix: PrefillMix,
        refresh_s: float, metrics: EngineScrapeMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = engines  # `ip:port` of every engine to scrape now (the active ones)
        self._board = board
        self._mix = mix
        self._refresh_s = refresh_s
        self._metrics = metrics
        self._clock = clock
        # A scrape slower than this is abandoned (its engine's report ages meanwhile).
        self._timeout = aiohttp.ClientTimeout(total=min(board.max_age_s, max(refresh_s, 0.25)))
        self._failing: set[str] = set()  # logged once per failing streak
        self._whole_page: set[str] = set()  # engines without the filtered path (404)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=connector) as http:
            while True:
                started = self._clock()
                await self.scrape_round(http)
                spent = self._clock() - started
                self._metrics.round_seconds.observe(spent)
                await asyncio.sleep(max(0.0, self._refresh_s - spent))

    async def scrape_round(self, http: aiohttp.ClientSession) -> None:
        """Every engine once, concurrently."""
        await asyncio.gather(*(self._scrape(http, address) for address in self._engines()))

    async def _scrape(self, http: aiohttp.ClientSession, address: str) -> None:
        path = FULL_PATH if address in self._whole_page else LOAD_PATH
        try:
            async with http.get(f"http://{address}{path}", timeout=self._timeout) as reply:
                if reply.status == 404 and path == LOAD_PATH:
                    self._whole_page.add(address)  # the next round asks for the whole page
                if reply.status != 200:
                    raise aiohttp.ClientResponseError(reply.request_info, (), status=reply.status)
                text = await reply.text()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            self._metrics.failed.inc()
            if address not in self._failing:
                self._failing.add(address)
                log.warning("engine_scrape_failed", endpoint=address,
                            error=str(exc) or type(exc).__name__)
            return
        sums = vllm.read_samples(text, LOAD_GAUGES)
        if not sums and path == LOAD_PATH:
            # Something answered there, but not vLLM's filter: read the whole page from now on.
            self._whole_page.add(address)
            self._metrics.failed.inc()
            return
        self._failing.discard(address)
        self._metrics.ok.inc()
        waiting = int(sums.get(vllm.NUM_REQUESTS_WAITING, 0.0))
        self._board.observe(address, ObservedLoad(
            at=self._clock(), backlog_s=waiting * self._mix.mean_s,
            running=int(sums.get(vllm.NUM_REQUESTS_RUNNING, 0.0)), waiting=waiting,
            kv_usage=sums.get(vllm.KV_CACHE_USAGE_PERC, 0.0)))
