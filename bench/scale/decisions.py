"""ext_proc asked as Envoy asks it, for the scale benchmark: its fill and its probe."""

from __future__ import annotations

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE, POOL_METADATA_KEY

HEADER = "x-session-id"


class Decisions:
    """ext_proc's gRPC interface as Envoy uses it: one Process stream per request, the session
    header in the request headers, the route's pool in the stream's metadata."""

    def __init__(self, address: str, pool: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)
        self._metadata = ((POOL_METADATA_KEY, pool),)

    async def close(self) -> None:
        await self._channel.close()

    async def decide(self, session: str, limit_s: float = 2.0) -> str:
        """The endpoint(s) ext_proc picked ('' when it left the request to Envoy's ring)."""
        request = pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(
                key=HEADER, raw_value=session.encode())]),
            end_of_stream=True))
        call = self._stub.Process(metadata=self._metadata, timeout=limit_s)
        try:
            await call.write(request)
            reply = await call.read()
            await call.done_writing()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise ConnectionError("ext_proc closed the stream without answering")
        lb = reply.dynamic_metadata.fields.get(LB_NAMESPACE)
        return "" if lb is None else lb.struct_value.fields[DESTINATION_KEY].string_value
