"""The pipeline's entry: one request's headers → its session (`sources`) and prompt estimate →
the decision (`pipeline`) → counted. Every failure maps to "no pin" here, so ext_proc's two
transports, which call this and nothing else, answer alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from structlog.typing import FilteringBoundLogger

from kvgate.contract.states import MoveReason
from kvgate.routing.decision import Decision, DecisionError, Outcome
from kvgate.routing.pipeline import Pipeline
from kvgate.routing.sources import BodyFields, SessionSources, Source


class DecisionMetrics:
    """The decisions' Prometheus metrics, named after the service that decides
    (`kvgate_{service}_*`: ext_proc's are `kvgate_ext_proc_decisions_total`, ...), in a registry
    owned by the caller (no global state)."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        prefix = f"kvgate_{service}"
        self.decisions = Counter(
            f"{prefix}_decisions", "Routing decisions by outcome",
            ["outcome"], registry=self.registry,
        )
        self.session_sources = Counter(
            f"{prefix}_session_sources", "Where each request's session id came from",
            ["source"], registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_decision_seconds", "Time to decide one request",
            buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
            registry=self.registry,
        )
        self.rebinds = Counter(
            f"{prefix}_rebinds", "Sessions this replica moved to another endpoint, by "
            "reason (failed, drained: their endpoint left; load: the load gate found a DDR-pool "
            "sibling that answers sooner; manual is the control plane's)", ["reason"],
            registry=self.registry,
        )
        for reason in MoveReason:
            self.rebinds.labels(reason.value)
        for outcome in Outcome:
            self.decisions.labels(outcome.value)
        for source in Source:
            self.session_sources.labels(source.value)


class RequestHandler:
    """Called by ext_proc's gRPC and HTTP transports: (pool, headers, body session fields) →
    Decision. Plain input: each transport converts its wire message (protobuf, JSON). The
    service that runs it names its metrics (`metrics`) and passes its logger (`log`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        sources: SessionSources,
        metrics: DecisionMetrics,
        default_pool: str | None,
        *, bytes_per_token: float | None = None,
        log: FilteringBoundLogger | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._log: FilteringBoundLogger = log or structlog.get_logger("kvgate.routing")
        self._sources = sources
        self._metrics = metrics
        self.default_pool = default_pool
        # With the load gate on: the request's Content-Length over this estimates its prompt.
        self._tokens_per_byte = 0.0 if not bytes_per_token else 1.0 / bytes_per_token
        self._outcome_counters = {o: metrics.decisions.labels(o.value) for o in Outcome}
        self._source_counters = {s: metrics.session_sources.labels(s.value) for s in Source}
        self._rebind_counters = {r: metrics.rebinds.labels(r.value) for r in MoveReason}
        self.last_decided = float("-inf")  # time.perf_counter() of the last decision's start

    async def decide(
        self,
        pool: str | None,
        headers: Mapping[str, bytes],
        body: BodyFields | None,
        *, prompt: bool = False, blocks: Sequence[int] = (),
    ) -> Decision:
        """`headers`: the forwarded request headers, name -> value; `body`: the session fields
        Envoy found in the body (metadata namespace kvgate.session), None if it found none.
        `prompt`: the transport can read the request's prompt; a decision that would weigh it
        answers `wants_prompt` (not counted), and is asked again with its `blocks`."""
        self.last_decided = started = time.perf_counter()
        pool = pool or self.default_pool
        try:
            if pool is None:
                raise DecisionError("route carries no pool and more than one pool is configured")
            found = self._sources.pick(headers, body)
            if not prompt:
                self._source_counters[found.source].inc()
            if prompt or blocks:
                decision = await self._pipeline.decide(
                    pool, found.raw or None, self._prompt_tokens(headers), ring=found.ring,
                    blocks=blocks, prompt=prompt)
            else:  # the path of every request that cannot give its prompt, sticky turns first
                decision = await self._pipeline.decide(pool, found.raw or None,
                                                      self._prompt_tokens(headers),
                                                      ring=found.ring)
            if decision.wants_prompt:
                return decision  # counted when asked again, with the prompt
            if prompt:
                self._source_counters[found.source].inc()
        except asyncio.CancelledError:
            self._outcome_counters[Outcome.ABANDONED].inc()
            raise
        except DecisionError as exc:
            self._log.warning("decision_failed", pool=pool, error=str(exc))
            decision = Decision(Outcome.ERROR)
        except Exception:
            self._log.exception("decision_crashed", pool=pool)
            decision = Decision(Outcome.ERROR)
        self._outcome_counters[decision.outcome].inc()
        if decision.reason is not None:
            self._rebind_counters[decision.reason].inc()
        self._metrics.latency.observe(time.perf_counter() - started)
        return decision

    def _prompt_tokens(self, headers: Mapping[str, bytes]) -> int:
        """The prompt's size in tokens as its body's size suggests (0: unknown, or gate off)."""
        if not self._tokens_per_byte:
            return 0
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            return 0
        return int(int(length) * self._tokens_per_byte)
