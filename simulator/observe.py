"""What the engines' `/metrics` would show, scraped every so often.

The gauges are kvgate's (kvgate.contract.vllm.GAUGES): vLLM's `vllm:num_requests_waiting` (not
yet prefilling: queued, or loading its KV from the pool), `vllm:num_requests_running`
(prefilling or decoding) and `vllm:kv_cache_usage_perc`. The simulator keeps, per engine, when
each request reached it, started its prefill and finished, and answers for any instant already
simulated; a router sees a scrape taken at the last tick of the refresh interval, never the
engine's schedule itself.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvgate.contract.vllm import EngineFigures


class Scrape(NamedTuple):
    """One engine's metrics as of `at` (emulated seconds)."""

    at: float
    figures: EngineFigures


class EngineGauges:
    """Per engine, the instants that make its request gauges; counts at any t ≥ the last one
    asked (scrapes go forward in time)."""

    __slots__ = ("_arrived", "_finished", "_finishes", "_started")

    def __init__(self) -> None:
        self._arrived: list[float] = []  # when each request reached the engine (nondecreasing)
        self._started: list[float] = []  # prefill starts, in admission order (nondecreasing)
        self._finishes: list[float] = []  # heap of the finishes not yet counted
        self._finished = 0

    def arrived(self, at: float) -> None:
        self._arrived.append(at)

    def admitted(self, prefill_start: float, finish: float) -> None:
        self._started.append(prefill_start)
        heapq.heappush(self._finishes, finish)

    def counts(self, at: float) -> tuple[int, int]:
        """(running, waiting) at `at`."""
        finishes = self._finishes
        while finishes and finishes[0] <= at:
            heapq.heappop(finishes)
            self._finished += 1
        arrived = bisect_right(self._arrived, at)
        started = bisect_right(self._started, at)
        return max(0, started - self._finished), max(0, arrived - started)

    def lost(self) -> None:
        """The engine failed: its requests are gone."""
        self._arrived.clear()
        self._started.clear()
        self._finishes.clear()
        self._finished = 0


class Scraper:
    """The engines' metrics as a router holding a scrape every `refresh_s` has them: asked at
    `now`, the values as of the last tick (a multiple of `refresh_s`) at or before it. Scraped
    on demand, which is the same thing as scraping every engine at every tick, without the cost
    of the engines nobody looks at (a 1,000-engine fleet)."""

    def __init__(self, addresses: Sequence[str], gauges: Sequence[EngineGauges],
                 usage: Callable[[int, float], float], refresh_s: float) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh interval must be > 0, got {refresh_s:g}")
        self._index = {a: e for e, a in enumerate(addresses)}
        self._gauges = gauges
        self._usage = usage
        self.refresh_s = refresh_s
        self._last: list[Scrape | None] = [None] * len(gauges)

    def scrape(self, address: str, now: float) -> Scrape | None:
        """`address`'s metrics as last scraped before `now` (None: not an engine here)."""
        e = self._index.get(address)
        if e is None:
            return None
        tick = math.floor(now / self.refresh_s) * self.refresh_s
        last = self._last[e]
        if last is not None and last.at >= tick:
            return last
        running, waiting = self._gauges[e].counts(tick)
        scrape = Scrape(tick, EngineFigures.of(running=running, waiting=waiting,
                                               kv_usage=self._usage(e, tick)))
        self._last[e] = scrape
        return scrape
