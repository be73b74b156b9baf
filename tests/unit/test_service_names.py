"""What the service that runs the core tells it: the name its metrics carry (ext_proc's page
keeps the names dashboards, docs and tests read) and the logger it logs through."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from ext_proc.metrics import SERVICE, ExtProcMetrics
from kvgate.config import load_text
from kvgate.fleet.feed import FleetFeedMetrics
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.fleet.scrape import EngineScrapeMetrics
from kvgate.routing import Decision, DecisionError, Outcome
from kvgate.routing.handler import DecisionMetrics, RequestHandler
from kvgate.routing.sources import SessionSources

# ext_proc's page as it was when the core named these itself (main fc98b76), families only.
EXT_PROC = {f"kvgate_ext_proc_{name}" for name in (
    "bindings", "decision_seconds", "decisions", "degraded", "engine_scrape_round_seconds",
    "engine_scrapes", "etcd_errors", "fleet_collector_reachable", "fleet_state_age_seconds",
    "fleet_state_oldest_figure_seconds", "fleet_state_replaced_age_seconds",
    "fleet_state_rounds", "hbm_eviction_rates", "hbm_residency_pairs", "pending_writes",
    "rebinds", "session_sources", "unbound",
    "prompts_read",  # since: the prefix step's body reads (issue 42)
)}


def families(registry: CollectorRegistry) -> set[str]:
    return {family.name for family in registry.collect()}


def test_the_core_names_its_metrics_after_the_service_that_runs_it() -> None:
    registry = CollectorRegistry()
    DecisionMetrics("bench", registry)
    FleetFeedMetrics(registry, "bench", HbmBoard())
    EngineScrapeMetrics(registry, "bench")
    names = families(registry)
    assert len(names) == 13
    assert all(name.startswith("kvgate_bench_") for name in names), names


def test_ext_proc_keeps_its_names() -> None:
    metrics = ExtProcMetrics()
    FleetFeedMetrics(metrics.registry, SERVICE, HbmBoard())  # as ext_proc's service makes them
    EngineScrapeMetrics(metrics.registry, SERVICE)
    assert families(metrics.registry) == EXT_PROC


class Failing:
    """Stands in for Pipeline: every decision fails."""

    async def decide(self, pool: str, raw_session: bytes | None,
                     prompt_tokens: int = 0, *, ring: bytes | None = None) -> Decision:
        raise DecisionError("no such pool")


class Recorder:
    """Stands in for the service's logger."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def exception(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


async def test_the_handler_logs_through_the_services_logger() -> None:
    log = Recorder()
    config = load_text("pools: [{name: p, endpoints: [10.0.0.1:1]}]\n")
    handler = RequestHandler(Failing(), SessionSources(config.session),  # type: ignore[arg-type]
                             DecisionMetrics(SERVICE), "p", log=log)  # type: ignore[arg-type]
    decision = await handler.decide(None, {"x-session-id": b"s1"}, None)
    assert decision.outcome is Outcome.ERROR
    assert log.events == [("decision_failed", {"pool": "p", "error": "no such pool"})]
