"""ext_proc's stream for colocated routes with the prefix step on (`placement.load_gate.
prefix_placement`): the body is read only for the requests whose decision weighs the prompt.

The route sends request headers only, as every colocated route does. A sticky turn is answered
from its headers and the stream ends: no body travels. A request the pipeline cannot decide
without its prompt (a new session, one whose engine left, a move for load: kvgate.routing.
pipeline's `prompt`) is answered "continue, and send me the body" (`mode_override`: the request
body BUFFERED, which the filter honours with `allow_mode_override` and the one mode it allows:
control_plane.resources.listener); Envoy holds the request until the body's answer, which
carries the destination in dynamic metadata as the headers' answer would have. The prompt is
hashed in blocks (kvgate.routing.prompt_blocks) and the pipeline asked again with them.

Only a body Envoy can hold is asked for: one whose `content-length` is at most
`session.body_limit` (the listener's buffer fits it, as for the session filters); a larger or
unsized one, or a request with no body, is decided without its prompt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import Counter

from ext_proc.answers import Answers, pinned, protobuf_answer
from ext_proc.server import decision_inputs, pool_of
from kvgate.routing.handler import RequestHandler
from kvgate.routing.prompt_blocks import PromptBlocks

Context = grpc.aio.ServicerContext[pb.ProcessingRequest, bytes]
_Mode = processing_mode_pb2.ProcessingMode


def body_mode() -> processing_mode_pb2.ProcessingMode:
    """The mode a request is switched to when its body is wanted: the request body buffered,
    nothing else (the filter allows exactly this override)."""
    return _Mode(request_header_mode=_Mode.SEND, response_header_mode=_Mode.SKIP,
                 request_body_mode=_Mode.BUFFERED, response_body_mode=_Mode.NONE,
                 request_trailer_mode=_Mode.SKIP, response_trailer_mode=_Mode.SKIP)


def _ask_body() -> bytes:
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse()),
        mode_override=body_mode())
    answer: bytes = response.SerializeToString()
    return answer


def body_answer(destination: str | None) -> bytes:
    """The answer to the request's body: unchanged, with the destination (if any) in dynamic
    metadata, as the headers' answer carries it otherwise."""
    return pinned(pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=pb.CommonResponse())), destination)


class PromptProcessor:
    """Serves a prefix-step route's stream: headers (and the body, when wanted) → the answer."""

    def __init__(self, handler: RequestHandler, blocks: PromptBlocks, body_limit: int,
                 read: Counter) -> None:
        self._handler = handler
        self._blocks = blocks
        self._body_limit = body_limit
        self._answers = Answers(protobuf_answer)
        self._body_answers = Answers(body_answer)
        self._ask = _ask_body()
        self._read = read  # bodies asked for

    async def process(self, requests: AsyncIterator[pb.ProcessingRequest],
                      context: Context) -> AsyncIterator[bytes]:
        first = await anext(requests, None)
        if first is None or not first.HasField("request_headers"):
            return
        headers, fields = decision_inputs(first)
        pool = pool_of(context)
        readable = not first.request_headers.end_of_stream and self._fits(headers)
        decision = await self._handler.decide(pool, headers, fields, prompt=readable)
        if not decision.wants_prompt:
            yield self._answers.of(decision)
            return
        self._read.inc()
        yield self._ask
        message = await anext(requests, None)
        if message is None or not message.HasField("request_body"):
            return  # Envoy gave up on the request
        blocks = self._blocks.of_body(message.request_body.body)
        decision = await self._handler.decide(pool, headers, fields, blocks=blocks)
        yield self._body_answers.of(decision)

    def _fits(self, headers: dict[str, bytes]) -> bool:
        """A sized body Envoy can hold whole (at most `session.body_limit`)."""
        length = headers.get("content-length")
        return length is not None and length.isdigit() and int(length) <= self._body_limit
