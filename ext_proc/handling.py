"""One request-headers decision, apart from any transport: find the session, ask the Decider,
count it. Every failure maps to "no pin" here, so both transports answer alike."""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog
from google.protobuf import struct_pb2

from ext_proc.decide import Decider, Decision, DecisionError, Outcome
from ext_proc.metrics import ExtProcMetrics
from ext_proc.sources import SessionSources, Source
from kvgate.contract.states import MoveReason

log = structlog.get_logger("kvgate.ext_proc")


class RequestHandler:
    """Shared by the gRPC and the HTTP transport: (pool, headers, body metadata) → Decision."""

    def __init__(
        self,
        decider: Decider,
        sources: SessionSources,
        metrics: ExtProcMetrics,
        default_pool: str | None,
        *, bytes_per_token: float | None = None,
    ) -> None:
        self._decider = decider
        self._sources = sources
        self._metrics = metrics
        self.default_pool = default_pool
        # With the load gate on: the request's Content-Length over this estimates its prompt.
        self._tokens_per_byte = 0.0 if not bytes_per_token else 1.0 / bytes_per_token
        self._outcome_counters = {o: metrics.decisions.labels(o.value) for o in Outcome}
        self._source_counters = {s: metrics.session_sources.labels(s.value) for s in Source}
        self._rebind_counters = {r: metrics.rebinds.labels(r.value) for r in MoveReason}

    async def decide(
        self,
        pool: str | None,
        headers: Mapping[str, bytes],
        body: struct_pb2.Struct | None,
    ) -> Decision:
        """`headers`: the forwarded request headers; `body`: metadata namespace kvgate.session."""
        started = time.perf_counter()
        pool = pool or self.default_pool
        try:
            if pool is None:
                raise DecisionError("route carries no pool and more than one pool is configured")
            found = self._sources.pick(headers, body)
            self._source_counters[found.source].inc()
            decision = await self._decider.decide(pool, found.raw or None,
                                                  self._prompt_tokens(headers))
        except DecisionError as exc:
            log.warning("decision_failed", pool=pool, error=str(exc))
            decision = Decision(Outcome.ERROR)
        except Exception:
            log.exception("decision_crashed", pool=pool)
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
