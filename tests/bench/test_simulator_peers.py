"""The simulator's routers: the peers' policies on hand-built cases, what they see (prefix index,
scrapes, prompt estimates), and kvgate's load gate against static stickiness."""

from __future__ import annotations

import asyncio

import pytest
from bench_helpers import small_bank

from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from kvgate.contract.vllm import EngineFigures
from kvgate.placement import EnvoyRing, session_hash
from simulator.estimate import PromptEstimate
from simulator.observe import EngineGauges, Scrape, Scraper
from simulator.peers import BoundedHashRouter, KvCostRouter, PrefixScoreRouter
from simulator.prefix_index import PrefixIndex
from simulator.routing import Ask, RouterSetup
from simulator.run import SimConfig, simulate

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
SETUP = RouterSetup(block_size=16, index_blocks=1000)
PROMPT = list(range(100, 112))  # 12 chained blocks: 192 tokens


class _Metrics:
    """Scrapes set by hand, all taken at t = 0."""

    def __init__(self, **by_engine: tuple[int, float]) -> None:
        self.values = {address: by_engine.get(name, (0, 0.0))
                       for name, address in (("a", A), ("b", B), ("c", C))}

    def scrape(self, address: str, now: float) -> Scrape | None:
        waiting, usage = self.values[address]
        return Scrape(0.0, EngineFigures.of(running=0, waiting=waiting, kv_usage=usage))


def _scrape(at: float, running: int, waiting: int, kv_usage: float) -> Scrape:
    return Scrape(at, EngineFigures.of(running=running, waiting=waiting, kv_usage=kv_usage))


def _ask(session: str = "s", hashes: list[int] = PROMPT) -> Ask:
    tokens = 16 * len(hashes)
    return Ask(session, tokens, tokens, hashes)


def _route(router: object, ask: Ask, now: float = 0.0) -> str | None:
    return asyncio.run(router.route(ask, now))  # type: ignore[attr-defined]


def test_prefix_index_matches_the_leading_blocks_and_forgets_least_recent_first() -> None:
    index = PrefixIndex(capacity_blocks=20)
    index.record(A, PROMPT)
    assert index.match(A, PROMPT) == 12
    assert index.match(A, [*PROMPT[:5], 999, *PROMPT[6:]]) == 5
    assert index.match(B, PROMPT) == 0
    index.record(A, list(range(500, 515)))  # 15 more blocks: 7 of the first prompt's go
    # What is left of the first prompt is still a prefix of it (its last blocks went first).
    assert index.match(A, PROMPT) == 5
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(0)


def test_prefix_score_prefers_the_cached_engine_and_records_where_it_sent() -> None:
    router = PrefixScoreRouter([A, B, C], SETUP, _Metrics())
    router.EXPLORATION = 0.0
    router.index.record(B, PROMPT)
    # B: 3 × 1.0 prefix + 2 × 1 queue + 2 × 1 kv = 7; the others 4.
    assert _route(router, _ask()) == B
    other = list(range(300, 312))
    chosen = _route(router, _ask("t", other))
    assert router.index.match(chosen, other) == 12


def test_prefix_score_weighs_queue_and_kv_usage_against_the_prefix() -> None:
    # B holds the prompt but has the longest queue and a full cache: 3 + 0 + 0.2 = 3.2 against
    # C's 0 + 2 + 2 = 4 (the affinity filter keeps B alone unless its TTFT penalty is too big).
    router = PrefixScoreRouter([A, B, C], SETUP, _Metrics(a=(4, 0.0), b=(4, 0.9), c=(0, 0.0)))
    router.EXPLORATION = 0.0
    router.index.record(B, PROMPT)
    assert _route(router, _ask()) == B  # sticky: B is the only endpoint left by the filter
    # B's in-flight uncached tokens put its TTFT 6 s above C's: the filter opens, scores decide.
    router.inflight.add(B, 30_000, finish=100.0)
    assert _route(router, _ask()) == C


def test_kv_cost_is_prefill_blocks_to_compute_plus_active_blocks() -> None:
    router = KvCostRouter([A, B], SETUP, _Metrics())
    router.index.record(A, PROMPT[:10])
    assert _route(router, _ask()) == A  # A: 2 + 0 + 12 = 14; B: 12 + 0 + 12 = 24
    # Now A holds all 12 (it was sent them); 13 active blocks there: 0 + 13 + 12 = 25 > 24.
    router.inflight.add(A, 13.0, finish=50.0)
    assert _route(router, _ask(), now=1.0) == B
    router.inflight.advance(60.0)  # A's request has finished: its blocks are no longer active
    assert router.inflight.amount[A] == 0 and router.inflight.requests[A] == 0


def test_bounded_hash_walks_past_an_engine_at_its_bound() -> None:
    router = BoundedHashRouter([A, B, C], SETUP, _Metrics(), c=1.25)
    walk = list(EnvoyRing([(a, 1) for a in (A, B, C)]).walk(session_hash(b"s")))
    assert _route(router, _ask("s")) == walk[0]
    for _ in range(2):  # 2 in flight on the first: bound = ceil(1.25 × 3 / 3) = 2
        router.inflight.add(walk[0], 0.0, finish=10.0)
    assert _route(router, _ask("s"), now=1.0) == walk[1]
    assert _route(router, _ask("s"), now=11.0) == walk[0]


def test_scrapes_show_the_gauges_as_of_the_last_tick() -> None:
    gauges = [EngineGauges()]
    scraper = Scraper([A], gauges, lambda e, at: 0.5, refresh_s=1.0)
    gauges[0].arrived(0.2)
    gauges[0].admitted(prefill_start=0.2, finish=5.0)
    gauges[0].arrived(0.4)
    gauges[0].admitted(prefill_start=3.0, finish=6.0)  # waits for the first's prefill
    assert scraper.scrape(A, 0.9) == _scrape(0.0, 0, 0, 0.5)  # the tick at 0: nothing yet
    assert scraper.scrape(A, 1.5) == _scrape(1.0, 1, 1, 0.5)
    assert scraper.scrape(A, 3.2) == _scrape(3.0, 2, 0, 0.5)
    assert scraper.scrape(A, 5.5) == _scrape(5.0, 1, 0, 0.5)
    assert scraper.scrape("nowhere:1", 5.5) is None


def test_prompt_estimates_are_exact_at_zero_and_steady_per_session() -> None:
    assert PromptEstimate(0.0).tokens("s", 12_345) == 12_345
    estimate = PromptEstimate(0.25)
    first = estimate.tokens("s", 10_000)
    assert first != 10_000 and estimate.tokens("s", 10_000) == first  # same request, same error
    ratios = [estimate.tokens(f"s{i}", 10_000) / 10_000 for i in range(400)]
    assert 0.9 < sorted(ratios)[200] < 1.1  # unbiased in the median
    assert sum(abs(r - 1) > 0.2 for r in ratios) > 100  # but a quarter off is common
    with pytest.raises(ValueError, match="must be >= 0"):
        PromptEstimate(-1.0)


def test_the_load_gate_beats_static_stickiness_on_an_overloaded_fleet() -> None:
    workload = small_bank(sessions=100, context=6000)
    config = SimConfig(EmulatorOptions(instances=4, block_size=16))
    sticky = simulate(workload, RoutingMode.STICKY_DDR, config).stats.figures()
    gated = simulate(workload, RoutingMode.AFFINITY_DDR, config).stats.figures()
    assert gated["errors"] == sticky["errors"] == 0
    assert gated["ttft_p99_s"] < 0.85 * sticky["ttft_p99_s"]
    assert gated["hit_rate"] >= 0.98 * sticky["hit_rate"]
