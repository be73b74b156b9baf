"""ext_proc's HTTP transport as a server: what Envoy's http_service sends (JSON, header values
base64-encoded, chunked) in, the ProcessingResponse JSON out; bad requests refused."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import AsyncIterator, Mapping

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format

from ext_proc.http_server import HttpProcessor
from kvgate.routing import Decision, Outcome
from kvgate.routing.sources import BodyFields


class RecordingHandler:
    """Stands in for RequestHandler: records what the server extracted, answers a fixed pick."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, dict[str, bytes], dict[str, object] | None]] = []

    async def decide(self, pool: str | None, headers: Mapping[str, bytes],
                     body: BodyFields | None) -> Decision:
        self.calls.append((pool, dict(headers), None if body is None else dict(body)))
        if not headers:
            return Decision(Outcome.SESSIONLESS)
        return Decision(Outcome.STICKY, ("10.0.0.1:8000", "10.0.0.2:8000"))


@pytest.fixture
async def served() -> AsyncIterator[tuple[RecordingHandler, int]]:
    handler = RecordingHandler()
    server = HttpProcessor(handler)  # type: ignore[arg-type]
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.serve(sock)
    yield handler, sock.getsockname()[1]
    await server.stop()


def _processing_request(headers: dict[str, bytes], session: dict[str, object] | None) -> bytes:
    request = {"request_headers": {"headers": {"headers": [
        {"key": k, "raw_value": base64.b64encode(v).decode()} for k, v in headers.items()
    ]}, "end_of_stream": True}}
    if session is not None:
        request["metadata_context"] = {"filter_metadata": {"kvgate.session": session}}
    return json.dumps(request).encode()


async def _exchange(port: int, raw: bytes) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)
    finally:
        writer.close()


def _post(body: bytes, *, chunked: bool) -> bytes:
    if chunked:
        return (b"POST /process HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    return (b"POST /process HTTP/1.1\r\nhost: x\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.mark.parametrize("chunked", [True, False])
async def test_headers_pool_and_body_session_in_the_pick_out(
    served: tuple[RecordingHandler, int], chunked: bool
) -> None:
    handler, port = served
    body = _processing_request({"x-session-id": b"s-\xc3\xa9", "x-kvgate-pool": b"coder"},
                               {"prompt_cache_key": "conv-1"})
    head, answer = await _exchange(port, _post(body, chunked=chunked))
    assert head.startswith(b"HTTP/1.1 200")
    assert handler.calls == [("coder", {"x-session-id": b"s-\xc3\xa9"},
                              {"prompt_cache_key": "conv-1"})]
    # What Envoy will parse: a valid ProcessingResponse with the pick in envoy.lb.
    response = json_format.Parse(answer, pb.ProcessingResponse())
    assert response.HasField("request_headers")
    lb = response.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == \
        "10.0.0.1:8000,10.0.0.2:8000"


async def test_no_session_is_continue_without_a_pick(served: tuple[RecordingHandler, int]) -> None:
    handler, port = served
    _, answer = await _exchange(port, _post(_processing_request({}, None), chunked=True))
    response = json_format.Parse(answer, pb.ProcessingResponse())
    assert response.HasField("request_headers")
    assert not response.HasField("dynamic_metadata")
    assert handler.calls == [(None, {}, None)]


async def test_the_body_session_fields_reach_the_core_as_text(
    served: tuple[RecordingHandler, int]
) -> None:
    """The core takes the body's fields as name -> text: one of another kind reads as empty
    text, naming no session (as over gRPC); an empty namespace is no body session at all."""
    handler, port = served
    session = {"user": 7, "prompt_cache_key": "conv-1", "metadata": {"session_id": "m"}}
    await _exchange(port, _post(_processing_request({}, session), chunked=False))
    await _exchange(port, _post(_processing_request({}, {}), chunked=False))
    assert handler.calls == [
        (None, {}, {"user": "", "prompt_cache_key": "conv-1", "metadata": ""}), (None, {}, None)]


async def test_get_is_the_health_check_and_other_methods_are_refused(
    served: tuple[RecordingHandler, int]
) -> None:
    _, port = served
    head, _ = await _exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    head, _ = await _exchange(port, b"PUT /process HTTP/1.1\r\ncontent-length: 0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    head, _ = await _exchange(port, b"POST /p HTTP/1.1\r\ncontent-length: 999999999\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")


async def test_a_message_other_than_request_headers_is_continue(
    served: tuple[RecordingHandler, int]
) -> None:
    handler, port = served
    body = json.dumps({"response_headers": {"headers": {}}}).encode()
    _, answer = await _exchange(port, _post(body, chunked=False))
    assert json.loads(answer) == {"request_headers": {"response": {}}}
    assert handler.calls == []
