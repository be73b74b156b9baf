"""What ext_proc answers Envoy, serialized once per distinct endpoint list: the same few
answers repeat for every request, so neither transport builds a message per decision."""

from __future__ import annotations

import json
from collections.abc import Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE
from kvgate.routing import Decision

# Distinct (primary, fallback) pairs are at most endpoints², but bounded anyway.
_MAX_CACHED = 4096


class Answers:
    """Bytes of the request-headers answer for a decision, cached by its endpoint list."""

    def __init__(self, encode: Callable[[str | None], bytes]) -> None:
        self._encode = encode
        self._continue = encode(None)
        self._cache: dict[tuple[str, ...], bytes] = {}

    def of_nothing(self) -> bytes:
        """"Continue", with no pin."""
        return self._continue

    def of(self, decision: Decision) -> bytes:
        endpoints = decision.endpoints
        if not endpoints:
            return self._continue  # no pin: Envoy's ring_hash fallback places the request
        answer = self._cache.get(endpoints)
        if answer is None:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            answer = self._cache[endpoints] = self._encode(",".join(endpoints))
        return answer


def protobuf_answer(destination: str | None) -> bytes:
    """A ProcessingResponse to request headers, for the gRPC transport."""
    return pinned(pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse())), destination)


def pinned(response: pb.ProcessingResponse, destination: str | None) -> bytes:
    """`response` serialized, with `destination` (if any) in the dynamic metadata Envoy's
    override_host reads."""
    if destination is not None:
        lb = struct_pb2.Struct()
        lb.fields[DESTINATION_KEY].string_value = destination
        response.dynamic_metadata.fields[LB_NAMESPACE].struct_value.CopyFrom(lb)
    answer: bytes = response.SerializeToString()  # envoy's modules are untyped
    return answer


def json_answer(destination: str | None) -> bytes:
    """The same ProcessingResponse in protobuf's JSON mapping, for the HTTP transport."""
    response: dict[str, object] = {"request_headers": {"response": {}}}
    if destination is not None:
        response["dynamic_metadata"] = {LB_NAMESPACE: {DESTINATION_KEY: destination}}
    return json.dumps(response, separators=(",", ":")).encode()
