"""Live engine load for the load gate, per replica (`load_gate.source: scrape`): every
`refresh_s`, each ext_proc replica scrapes the /metrics of every active engine it routes to
(kvgate.fleet.scrape) and records what it finds on its `LoadBoard`. With `source: collector`
the control-plane leader scrapes once for the whole gateway instead (kvgate.fleet.collector,
kvgate.fleet.feed) and nothing here runs.

Per replica, N replicas × E engines small GETs per refresh (what one round costs is in
docs/benchmarks.md). The backlog the gate prices comes from the board's ledger (the work this
replica sent, exact for it); an observation only raises it: `waiting × the mean prefill this
replica booked` (requests vLLM has not scheduled yet each still need their prefill; other
replicas' traffic shows up there). Running requests are decoding or prefilling in chunks
already budgeted, so they are reported, not priced.

A scrape that fails or times out leaves the engine's last observation to age: past
`max_age_s` the board ignores it (LoadBoard.observed). A decision never waits on a scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import (
    FULL_PATH,
    LOAD_GAUGES,
    LOAD_PATH,
    LOAD_QUERY,
    EngineFigures,
    EngineScrapeMetrics,
    Pages,
    ScrapeRounds,
)
from kvgate.placement.live import LoadBoard, ObservedLoad

__all__ = ["FULL_PATH", "LOAD_GAUGES", "LOAD_PATH", "LOAD_QUERY", "EngineLoadScraper",
           "EngineScrapeMetrics", "observed_load", "scrape_timeout"]


def observed_load(figures: EngineFigures, at: float, mix: PrefillMix) -> ObservedLoad:
    """An engine's figures as the board keeps them: its waiting requests priced at the mean
    prefill this replica booked."""
    return ObservedLoad(at, figures.waiting * mix.mean_s, figures)


def scrape_timeout(max_age_s: float, refresh_s: float) -> float:
    """A scrape slower than this is abandoned: its figures would be stale, or the next round
    would be late."""
    return min(max_age_s, max(refresh_s, 0.25))


class EngineLoadScraper:
    """Runs under the service's supervisor (`run`); one kept-alive connection per engine."""

    def __init__(
        self, engines: Callable[[], Iterable[str]], board: LoadBoard, mix: PrefillMix,
        refresh_s: float, metrics: EngineScrapeMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._board = board
        self._mix = mix
        self._rounds = ScrapeRounds(engines, self._observe, refresh_s,
                                    scrape_timeout(board.max_age_s, refresh_s), metrics, clock)

    def _observe(self, address: str, figures: EngineFigures, at: float) -> None:
        self._board.observe(address, observed_load(figures, at, self._mix))

    async def run(self) -> None:
        await self._rounds.run()

    async def scrape_round(self, http: Pages) -> None:
        """Every engine once, concurrently."""
        await self._rounds.scrape_round(http)
