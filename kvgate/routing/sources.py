"""Where a request's session id comes from, in order: the configured headers, then the body
fields Envoy copied into metadata (`session.body_fields`, in their configured order), then the
implicit conversation key Envoy's Lua filter computed (`session.implicit`)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

from google.protobuf import struct_pb2

from kvgate.config.model import Session
from kvgate.session import COLON_IMPLICIT_KEY, IMPLICIT_KEY

# Never equal to an explicit id a client could send by accident: the implicit key is hashed
# in its own space.
IMPLICIT_PREFIX = b"kvgate-implicit\x00"


class Source(StrEnum):
    HEADER = "header"
    BODY = "body"
    IMPLICIT = "implicit"
    NONE = "none"


class Found(NamedTuple):
    raw: bytes  # what is normalized into the session UUID
    source: Source


NOT_FOUND = Found(b"", Source.NONE)


class SessionSources:
    """Picks the session value of one request from its headers and forwarded metadata."""

    def __init__(self, session: Session) -> None:
        self._headers = session.headers
        self._fields = session.body_fields
        self._implicit = session.implicit

    def pick(self, headers: Mapping[str, bytes], body: struct_pb2.Struct | None) -> Found:
        """`headers`: the request's (forwarded) headers; `body`: metadata namespace
        `kvgate.session`, or None when Envoy found nothing in the body."""
        for name in self._headers:
            value = headers.get(name)
            if value and value.strip():
                return Found(value, Source.HEADER)
        if body is None:
            return NOT_FOUND
        fields = body.fields
        for name in self._fields:
            if name in fields:
                text = fields[name].string_value
                if text.strip():
                    return Found(text.encode(), Source.BODY)
        if self._implicit:
            key = IMPLICIT_KEY if IMPLICIT_KEY in fields else COLON_IMPLICIT_KEY
            if key in fields and (text := fields[key].string_value):
                return Found(IMPLICIT_PREFIX + text.encode(), Source.IMPLICIT)
        return NOT_FOUND
