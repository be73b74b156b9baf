"""The ext_proc gRPC transport: one stream per HTTP request, answered and closed.

Thin on purpose: the decision is `handling.RequestHandler`'s; answers are pre-serialized
(`answers`), and the stream ends right after the request-headers answer, since nothing else is
asked for (the filter sends request headers only), so Envoy never waits on an idle stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.answers import Answers, protobuf_answer
from ext_proc.handling import RequestHandler
from kvgate.contract.envoy import POOL_METADATA_KEY
from kvgate.session import BODY_METADATA_NAMESPACE

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExternalProcessor:
    def __init__(self, handler: RequestHandler) -> None:
        self._handler = handler
        self._answers = Answers(protobuf_answer)

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """The service, registered with no response serializer: answers are already bytes."""
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Process": grpc.stream_stream_rpc_method_handler(
                self.Process,
                request_deserializer=pb.ProcessingRequest.FromString,
                response_serializer=None,
            ),
        })

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        async for request in request_iterator:
            if request.HasField("request_headers"):
                yield await self._on_request_headers(request, _pool(context))
                return  # the only phase asked for: close the stream now
            # Not asked for; answer "continue" in kind should Envoy send it anyway.
            yield _continue_for(request).SerializeToString()

    async def _on_request_headers(self, request: pb.ProcessingRequest, pool: str | None) -> bytes:
        headers: dict[str, bytes] = {}
        for header in request.request_headers.headers.headers:
            headers[header.key] = header.raw_value or header.value.encode()
        body = request.metadata_context.filter_metadata.get(BODY_METADATA_NAMESPACE)
        return self._answers.of(await self._handler.decide(pool, headers, body))


def _pool(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == POOL_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


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
