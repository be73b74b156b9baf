"""ext_proc's gRPC transport as Envoy calls it: a bidirectional `Process` stream per request,
served by a unary handler (one message in; the answer and the OK status out in one batch)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from ext_proc.server import ExternalProcessor
from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE, POOL_METADATA_KEY
from kvgate.routing import Decision, Outcome


class RecordingHandler:
    """Stands in for RequestHandler: records the pool and headers, answers a fixed pick."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, dict[str, bytes]]] = []

    async def decide(self, pool: str | None, headers: Mapping[str, bytes],
                     body: struct_pb2.Struct | None) -> Decision:
        self.calls.append((pool, dict(headers)))
        return Decision(Outcome.STICKY, ("10.0.0.1:8000", "10.0.0.2:8000"))


@pytest.fixture
async def stub() -> AsyncIterator[tuple[RecordingHandler, pb_grpc.ExternalProcessorStub]]:
    handler = RecordingHandler()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (ExternalProcessor(handler).generic_handler(),)  # type: ignore[arg-type]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
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
