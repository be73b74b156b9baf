"""Reading engines' load from their /metrics, in rounds over every active engine.

What it reads: the gauges of kvgate.contract.vllm.GAUGES (vLLM's names, summed over label sets;
asked for by `name[]` where the engine filters, see LOAD_PATH). Who stamps and keeps the
figures is the caller's business (`on_read`): an ext_proc replica's load board
(kvgate.routing.engine_load) or the fleet collector (kvgate.fleet.collector).

A scrape that fails or times out reports nothing: the engine's last figures age where they are
kept. Nothing here is on a decision's path. The GETs go through kvgate.fleet.keepalive (one
kept-alive connection per engine), several times cheaper in CPU than a general HTTP client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol
from urllib.parse import urlencode

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from kvgate.contract import vllm
from kvgate.contract.vllm import EngineFigures
from kvgate.fleet.keepalive import KeepAliveClient, OnReply, Page, PageError

log = structlog.get_logger("kvgate.fleet")

__all__ = ["FULL_PATH", "LOAD_GAUGES", "LOAD_PATH", "LOAD_QUERY", "EngineFigures",
           "EngineScrapeMetrics", "OnRead", "Pages", "ScrapeRounds"]

LOAD_GAUGES = tuple(gauge.metric for gauge in vllm.GAUGES)
# Only those gauges: vLLM 0.32 answers /metrics/ (trailing slash) from prometheus_client's ASGI
# app, which honours name[] (566 bytes against 54 KB for the whole page, docs/benchmarks.md);
# its /metrics ignores the filter. An engine without /metrics/ (404, or a page there without the
# gauges) is scraped at /metrics from then on.
LOAD_QUERY = urlencode([("name[]", name) for name in LOAD_GAUGES])
LOAD_PATH = f"/metrics/?{LOAD_QUERY}"
FULL_PATH = "/metrics"


class EngineScrapeMetrics:
    """Scrape counts and round times, named after the service that scrapes (`ext_proc`,
    `control_plane`): `kvgate_{service}_engine_scrapes_total`, ..."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.scrapes = Counter(
            f"kvgate_{service}_engine_scrapes", "Scrapes of the engines' /metrics for the load "
            "gate, by result (ok, failed)", ["result"], registry=registry)
        self.round_seconds = Histogram(
            f"kvgate_{service}_engine_scrape_round_seconds",
            "Wall time of one scrape round over every active engine",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry)
        self.ok = self.scrapes.labels("ok")
        self.failed = self.scrapes.labels("failed")


OnRead = Callable[[str, EngineFigures, float], None]  # address, figures, when (the clock's)


class Pages(Protocol):
    """What scrapes GET with: a KeepAliveClient (`ScrapeRounds.session`) in the product; a bench
    may pass another client to compare (bench/engine_state_cost.py)."""

    async def get_each(self, wanted: Sequence[tuple[str, str]], timeout_s: float,
                       on_reply: OnReply) -> None:
        """GETs each `(address, path)` at once; `on_reply(index, reply)` as each reply arrives
        (a Page, or the PageError, OSError or TimeoutError that ended it); returns when all
        have been handed over, `timeout_s` at the latest."""
        ...


class ScrapeRounds:
    """Every `refresh_s`, each engine `engines()` names, once, concurrently; one kept-alive
    connection per engine. Runs under a supervisor (`run`)."""

    def __init__(
        self, engines: Callable[[], Iterable[str]], on_read: OnRead, refresh_s: float,
        timeout_s: float, metrics: EngineScrapeMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = engines  # `ip:port` of every engine to scrape now (the active ones)
        self._on_read = on_read
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._metrics = metrics
        self._clock = clock
        self._failing: set[str] = set()  # logged once per failing streak
        self._whole_page: set[str] = set()  # engines without the filtered path (404)

    async def run(self) -> None:
        async with self.session() as http:
            while True:
                spent = await self.timed_round(http)
                await asyncio.sleep(max(0.0, self.refresh_s - spent))

    @staticmethod
    def session() -> KeepAliveClient:
        """The client rounds GET with; close it when done (`async with`)."""
        return KeepAliveClient()

    async def timed_round(self, http: Pages) -> float:
        """One round, observed; returns the seconds it took."""
        started = self._clock()
        await self.scrape_round(http)
        spent = self._clock() - started
        self._metrics.round_seconds.observe(spent)
        return spent

    async def scrape_round(self, http: Pages) -> None:
        """Every engine once, concurrently; each engine's figures are read as its reply comes
        (not at the round's end), so one slow engine delays no other's."""
        wanted = [(address, FULL_PATH if address in self._whole_page else LOAD_PATH)
                  for address in self._engines()]
        # A scrape slower than timeout_s is abandoned (its engine's figures age meanwhile).
        await http.get_each(wanted, self.timeout_s,
                            lambda index, reply: self._read(*wanted[index], reply))

    def _read(self, address: str, path: str, reply: Page | Exception) -> None:
        """One engine's reply (or why there is none), counted and, if it has the gauges, read."""
        error: Exception | None = None
        if isinstance(reply, Exception):
            if not isinstance(reply, PageError | OSError):  # TimeoutError is an OSError
                raise reply  # not a failed scrape: a bug, for the supervisor
            error = reply
        elif reply.status != 200:
            if reply.status == 404 and path == LOAD_PATH:
                self._whole_page.add(address)  # the next round asks for the whole page
            error = PageError(f"HTTP {reply.status}")
        else:
            try:
                text = reply.body.decode()  # the exposition format is UTF-8
            except UnicodeDecodeError as exc:
                error = exc
        if error is not None:
            self._metrics.failed.inc()
            if address not in self._failing:
                self._failing.add(address)
                log.warning("engine_scrape_failed", endpoint=address,
                            error=str(error) or type(error).__name__)
            return
        sums = vllm.read_samples(text, LOAD_GAUGES)
        if not sums and path == LOAD_PATH:
            # Something answered there, but not vLLM's filter: read the whole page from now on.
            self._whole_page.add(address)
            self._metrics.failed.inc()
            return
        self._failing.discard(address)
        self._metrics.ok.inc()
        self._on_read(address, EngineFigures.read(sums), self._clock())
