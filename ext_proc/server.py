"""The ext_proc gRPC loop: find the session (header, body field or implicit key, see
`sources`), ask the Decider, answer with metadata.

Thin on purpose: all the choosing happens in `decide`; every failure maps to one answer here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from ext_proc.decide import Decider, Decision, DecisionError, Outcome
from ext_proc.metrics import ExtProcMetrics
from ext_proc.sources import SessionSources, Source
from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE, POOL_METADATA_KEY
from kvgate.session import BODY_METADATA_NAMESPACE

log = structlog.get_logger("kvgate.ext_proc")

_CONTINUE = pb.ProcessingResponse(
    request_headers=pb.HeadersResponse(response=pb.CommonResponse())
)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        decider: Decider,
        sources: SessionSources,
        metrics: ExtProcMetrics,
        default_pool: str | None,
    ) -> None:
        self._decider = decider
        self._sources = sources
        self._metrics = metrics
        self._default_pool = default_pool
        self._outcome_counters = {o: metrics.decisions.labels(o.value) for o in Outcome}
        self._source_counters = {s: metrics.session_sources.labels(s.value) for s in Source}

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        pool = self._pool(context)
        async for request in request_iterator:
            if request.HasField("request_headers"):
                yield await self._on_request_headers(request, pool)
            else:
                # Only request headers are asked for; answer anything else with "continue".
                yield _continue_for(request)

    async def _on_request_headers(
        self, request: pb.ProcessingRequest, pool: str | None
    ) -> pb.ProcessingResponse:
        started = time.perf_counter()
        try:
            if pool is None:
                raise DecisionError("route carries no pool and more than one pool is configured")
            decision = await self._decider.decide(pool, self._session_value(request))
        except DecisionError as exc:
            log.warning("decision_failed", pool=pool, error=str(exc))
            decision = Decision(Outcome.ERROR)
        except Exception:
            log.exception("decision_crashed", pool=pool)
            decision = Decision(Outcome.ERROR)
        self._outcome_counters[decision.outcome].inc()
        self._metrics.latency.observe(time.perf_counter() - started)
        return _answer(decision)

    def _session_value(self, request: pb.ProcessingRequest) -> bytes | None:
        values: dict[str, bytes] = {}
        for header in request.request_headers.headers.headers:
            values[header.key] = header.raw_value or header.value.encode()
        body = request.metadata_context.filter_metadata.get(BODY_METADATA_NAMESPACE)
        found = self._sources.pick(values, body)
        self._source_counters[found.source].inc()
        return found.raw or None

    def _pool(self, context: grpc.aio.ServicerContext) -> str | None:
        for key, value in context.invocation_metadata() or ():
            if key == POOL_METADATA_KEY:
                return value if isinstance(value, str) else value.decode()
        return self._default_pool


def _answer(decision: Decision) -> pb.ProcessingResponse:
    if not decision.endpoints:
        return _CONTINUE  # no pin: Envoy's ring_hash fallback places the request
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse())
    )
    lb = struct_pb2.Struct()
    lb.fields[DESTINATION_KEY].string_value = ",".join(decision.endpoints)
    response.dynamic_metadata.fields[LB_NAMESPACE].struct_value.CopyFrom(lb)
    return response


def _continue_for(request: pb.ProcessingRequest) -> pb.ProcessingResponse:
    phase = request.WhichOneof("request")
    if phase == "response_headers":
        return pb.ProcessingResponse(
            response_headers=pb.HeadersResponse(response=pb.CommonResponse())
        )
    if phase == "request_body":
        return pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse()))
    if phase == "response_body":
        return pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse()))
    if phase == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
