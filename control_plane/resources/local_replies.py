"""What the gateway itself answers when it cannot pass a request on: OpenAI-style JSON,
`{"error": {"message", "type", "code"}}`, with the status that fits, so a client's OpenAI SDK
raises an error carrying the message and the status (Envoy's `local_reply_config`). An engine's
own answers, errors included, pass unchanged: only Envoy's local replies are rewritten.

| when | status | type | code |
|---|---|---|---|
| body over `max_request_bytes` | 413 | invalid_request_error | request_too_large |
| no healthy engine for the route | 503 | server_error | no_healthy_engine |
| engine refused or reset it before answering | 503 | server_error | engine_unreachable |
| too many requests waiting for the pool | 503 | server_error | gateway_overloaded |
| rate limited | 429 | rate_limit_error | rate_limited |
| the engine did not answer in the route's time | 504 | server_error | engine_timeout |
| a path the gateway does not serve | 404 | invalid_request_error | not_found |
| anything else Envoy answers | its own | gateway_error | Envoy's response code details |

The gateway's body-size limit (`max_request_bytes`) is Envoy's buffer filter: the whole body is
held before the request goes on (an engine parses the whole JSON before it starts anyway), and
one over the limit, sized or chunked, is answered 413 before any engine or ext_proc sees it.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2 as al
from envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from envoy.extensions.filters.http.buffer.v3 import buffer_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from google.protobuf import struct_pb2

from control_plane.resources import protos

BUFFER_FILTER = "envoy.filters.http.buffer"
_Mapper = hcm.ResponseMapper


def body_limit_filter(max_request_bytes: int) -> hcm.HttpFilter:
    """The gateway's body-size limit (413 past it)."""
    limit = buffer_pb2.Buffer(max_request_bytes=protos.u32(max_request_bytes))
    return hcm.HttpFilter(name=BUFFER_FILTER, typed_config=protos.pack(limit))


def local_reply_config(max_request_bytes: int) -> hcm.LocalReplyConfig:
    """JSON for every local reply; the mappers name the cases a client can act on."""
    too_large = (f"the request body is larger than this gateway accepts "
                 f"(max_request_bytes: {max_request_bytes} bytes)")
    return hcm.LocalReplyConfig(
        mappers=[
            _mapper(_status(413), "invalid_request_error", "request_too_large", too_large),
            _mapper(_flags("UH", "NR", "NC"), "server_error", "no_healthy_engine",
                    "no healthy engine can serve this request now; retry later "
                    "(%LOCAL_REPLY_BODY%)", status=503),
            _mapper(_flags("UO"), "server_error", "gateway_overloaded",
                    "too many requests are waiting for this pool; retry later "
                    "(%LOCAL_REPLY_BODY%)", status=503),
            _mapper(_flags("UF", "URX", "UC", "UR", "LR"), "server_error", "engine_unreachable",
                    "the engine did not answer this request (%LOCAL_REPLY_BODY%)", status=503),
            _mapper(_flags("UT"), "server_error", "engine_timeout",
                    "the engine did not answer in time (%LOCAL_REPLY_BODY%)", status=504),
            _mapper(_status(429), "rate_limit_error", "rate_limited", "%LOCAL_REPLY_BODY%"),
            _mapper(_status(404), "invalid_request_error", "not_found", "%LOCAL_REPLY_BODY%"),
        ],
        body_format=_json_error("gateway_error", "%RESPONSE_CODE_DETAILS%", "%LOCAL_REPLY_BODY%"),
    )


def _mapper(match: al.AccessLogFilter, kind: str, code: str, message: str,
            status: int | None = None) -> hcm.ResponseMapper:
    mapper = _Mapper(filter=match, body_format_override=_json_error(kind, code, message))
    if status is not None:
        mapper.status_code.value = status
    return mapper


def _json_error(kind: str, code: str, message: str
                ) -> substitution_format_string_pb2.SubstitutionFormatString:
    error = struct_pb2.Struct()
    error.update({"error": {"message": message, "type": kind, "code": code}})
    return substitution_format_string_pb2.SubstitutionFormatString(json_format=error)


def _status(code: int) -> al.AccessLogFilter:
    return al.AccessLogFilter(status_code_filter=al.StatusCodeFilter(
        comparison=al.ComparisonFilter(
            op=al.ComparisonFilter.EQ,
            value=base_pb2.RuntimeUInt32(default_value=code, runtime_key=f"kvgate.status.{code}"),
        )))


def _flags(*flags: str) -> al.AccessLogFilter:
    return al.AccessLogFilter(response_flag_filter=al.ResponseFlagFilter(flags=list(flags)))
