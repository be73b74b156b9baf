"""What the engines' `/metrics` would show, scraped every so often.

vLLM exports `vllm:num_requests_waiting` (not yet prefilling: queued, or loading its KV from the
pool), `vllm:num_requests_running` (prefilling or decoding) and `vllm:kv_cache_usage_perc`. The
simulator keeps, per engine, when each request reached it, started its prefill and finished,
and answers for any instant already simulated; a router sees a scrape taken at the last tick of
the refresh interval, never the engine's schedule itself.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from typing import NamedTuple


class Scrape(NamedTuple):
    """One engine's metrics as of `at` (emulated seconds)."""

    at: float
    running: int
    waiting: int
    kv_usage: float


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
    """Scrapes every engine each `refresh_s` (lazily: at the first routing after a tick, with
    the values as of that tick) and hands each scrape to `deliver(engine, scrape)`."""

    def __init__(self, gauges: list[EngineGauges], usage: Callable[[int, float], float],
                 refresh_s: float, deliver: Callable[[int, Scrape], None]) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh interval must be > 0, got {refresh_s:g}")
        self._gauges = gauges
        self._usage = usage
        self._refresh_s = refresh_s
        self._deliver = deliver
        self._last_tick = -math.inf

    def before_routing(self, now: float) -> None:
        tick = math.floor(now / self._refresh_s) * self._refresh_s
        if tick <= self._last_tick:
            return
        self._last_tick = tick
        for e, gauges in enumerate(self._gauges):
            running, waiting = gauges.counts(tick)
            self._deliver(e, Scrape(tick, running, waiting, self._usage(e, tick)))
