"""ext_proc's gRPC transport as Envoy calls it: a bidirectional `Process` stream per request,
served by a unary handler (one message in; the answer and the OK status out in one batch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ext_proc.server import ExternalProcessor
from kvgate.config import load_text
from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE, POOL_METADATA_KEY
from kvgate.routing import Decision, Outcome
from kvgate.routing.handler import DecisionMetrics, RequestHandler
from kvgate.routing.sources import BodyFields, SessionSources
from kvgate.session import BODY_METADATA_NAMESPACE
from tests.support.polling import eventually


class RecordingHandler:
    """Stands in for RequestHandler: records the pool and headers, answers a fixed pick."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, dict[str, bytes]]] = []
        self.bodies: list[dict[str, str] | None] = []

    async def decide(self, pool: str | None, headers: Mapping[str, bytes],
                     body: BodyFields | None) -> Decision:
        self.calls.append((pool, dict(headers)))
        self.bodies.append(None if body is None else dict(body))
        return Decision(Outcome.STICKY, ("10.0.0.1:8000", "10.0.0.2:8000"))


class StalledPipeline:
    """Stands in for Pipeline: a decision that never finishes (an etcd call that hangs)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def decide(self, pool: str, raw_session: bytes | None,
                     prompt_tokens: int = 0, *, ring: bytes | None = None) -> Decision:
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def serve(handler: object) -> tuple[grpc.aio.Server, grpc.aio.Channel]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (ExternalProcessor(handler).generic_handler(),)  # type: ignore[arg-type]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


@pytest.fixture
async def stub() -> AsyncIterator[tuple[RecordingHandler, pb_grpc.ExternalProcessorStub]]:
    handler = RecordingHandler()
    server, channel = await serve(handler)
    try:
        yield handler, pb_grpc.ExternalProcessorStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_stream_gets_its_answer_and_ends_without_the_client_closing_its_side(
    stub: tuple[RecordingHandler, pb_grpc.ExternalProcessorStub],
) -> None:
    handler, client = stub
    call = client.Process(metadata=((POOL_METADATA_KEY, "coder"),), timeout=10)
    await call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key="x-session-id", raw_value=b"s-\xc3\xa9")]),
        end_of_stream=True)))
    answer = await call.read()  # as Envoy does: no done_writing() before reading
    assert isinstance(answer, pb.ProcessingResponse)
    assert answer.HasField("request_headers")
    lb = answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    assert lb.fields[DESTINATION_KEY].string_value == "10.0.0.1:8000,10.0.0.2:8000"
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert handler.calls == [("coder", {"x-session-id": b"s-\xc3\xa9"})]
    assert handler.bodies == [None]


async def test_the_body_session_fields_reach_the_core_as_text(
    stub: tuple[RecordingHandler, pb_grpc.ExternalProcessorStub],
) -> None:
    """The metadata Envoy forwards (a protobuf Struct) reaches the core as name -> text; a
    field of another kind reads as empty text, naming no session (as over HTTP)."""
    handler, client = stub
    request = pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True))
    session = request.metadata_context.filter_metadata[BODY_METADATA_NAMESPACE]
    session.fields["prompt_cache_key"].string_value = "conv-1"
    session.fields["user"].number_value = 7
    call = client.Process(timeout=10)
    await call.write(request)
    assert isinstance(await call.read(), pb.ProcessingResponse)
    assert handler.bodies == [{"prompt_cache_key": "conv-1", "user": ""}]


async def test_a_phase_not_asked_for_is_continued_in_kind_and_decides_nothing(
    stub: tuple[RecordingHandler, pb_grpc.ExternalProcessorStub],
) -> None:
    handler, client = stub
    call = client.Process(timeout=10)
    await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders()))
    answer = await call.read()
    assert isinstance(answer, pb.ProcessingResponse)
    assert answer.WhichOneof("response") == "response_headers"
    assert await call.code() == grpc.StatusCode.OK
    assert handler.calls == []


async def test_a_decision_envoy_stops_waiting_for_is_counted_abandoned() -> None:
    """Envoy cancels the stream when its message timeout passes (or the client leaves): the
    decision in flight is cancelled with it and counted, so the outcomes add up to the streams."""
    pipeline = StalledPipeline()
    metrics = DecisionMetrics("ext_proc")
    config = load_text("pools: [{name: p, endpoints: [10.0.0.1:1]}]\n")
    handler = RequestHandler(pipeline, SessionSources(config.session),  # type: ignore[arg-type]
                             metrics, "p")  # (a stand-in pipeline: only decide() is called)
    server, channel = await serve(handler)
    try:
        call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=10)
        await call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key="x-session-id", raw_value=b"s1")]),
            end_of_stream=True)))
        await asyncio.wait_for(pipeline.started.wait(), 10)
        call.cancel()

        def abandoned() -> float | None:
            return metrics.registry.get_sample_value(
                "kvgate_ext_proc_decisions_total", {"outcome": "abandoned"})

        assert await eventually(abandoned, what="the abandoned decision counted") == 1.0
        assert metrics.registry.get_sample_value(
            "kvgate_ext_proc_decisions_total", {"outcome": "error"}) == 0.0
    finally:
        await channel.close()
        await server.stop(None)
