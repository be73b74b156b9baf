"""Where a request's session id comes from, in order: the configured headers, then the body
fields Envoy copied into metadata (`session.body_fields`, in their configured order), then the
implicit conversation key Envoy's Lua filter computed (`session.implicit`)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

from kvgate.config.model import Session
from kvgate.session import (
    COLON_IMPLICIT_KEY,
    IMPLICIT_KEY,
    IMPLICIT_PREFIX,
    SESSION_KEY_HEADER,
    uncarry_key,
)

# The session fields Envoy found in the request's body (its dynamic metadata namespace
# `kvgate.session`, forwarded): field name -> text, empty for a field that is not text. The
# transports convert their messages to it (ext_proc).
BodyFields = Mapping[str, str]


class Source(StrEnum):
    HEADER = "header"
    BODY = "body"
    IMPLICIT = "implicit"
    UNCARRIED = "uncarried"  # in the body, but too long for Envoy to carry: sessionless
    NONE = "none"


class Found(NamedTuple):
    raw: bytes  # what is normalized into the session UUID
    source: Source
    ring: bytes | None = None  # what Envoy's ring hashes, when not `raw` (the carried key)


NOT_FOUND = Found(b"", Source.NONE)


class SessionSources:
    """Picks the session value of one request from its headers and forwarded metadata."""

    def __init__(self, session: Session) -> None:
        self._headers = session.headers
        self._fields = session.body_fields
        self._implicit = session.implicit

    def pick(self, headers: Mapping[str, bytes], body: BodyFields | None) -> Found:
        """`headers`: the request's (forwarded) headers, name -> value; `body`: the body's
        session fields, or None when Envoy found nothing in the body."""
        for name in self._headers:
            value = headers.get(name)
            if value and value.strip():
                return Found(value, Source.HEADER)
        if wire := headers.get(SESSION_KEY_HEADER):
            return _carried(wire)
        if body is None:
            return NOT_FOUND
        for name in self._fields:
            if name in body:
                text = body[name]
                if text.strip():
                    return Found(text.encode(), Source.BODY)
        if self._implicit:
            key = IMPLICIT_KEY if IMPLICIT_KEY in body else COLON_IMPLICIT_KEY
            if key in body and (text := body[key]):
                return Found(IMPLICIT_PREFIX + text.encode(), Source.IMPLICIT)
        return NOT_FOUND


def _carried(wire: bytes) -> Found:
    """The key Envoy's Lua filter found in the body (kvgate.session.carry_key)."""
    raw = uncarry_key(wire)
    if raw is None:
        return Found(b"", Source.UNCARRIED)
    if raw.startswith(IMPLICIT_PREFIX):
        return Found(raw, Source.IMPLICIT, wire)
    return Found(raw, Source.BODY, wire)
