"""The ext_proc HTTP transport: Envoy's ext_proc filter with `http_service` POSTs each
ProcessingRequest as JSON to a plain HTTP/1.1 server; the answer is a ProcessingResponse in JSON.

A minimal asyncio server on purpose: one task per connection (Envoy keeps a few open and sends
one request at a time on each), no framework, answers pre-serialized (`answers`). Header values
arrive base64-encoded in `raw_value`. The pool comes in a request header the route sets after
the gateway stripped any client-sent copy (see control_plane.resources.listener).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any

import structlog

from ext_proc.answers import Answers, json_answer
from kvgate.contract.envoy import DECISIONS_HEALTH_PATH, POOL_HEADER
from kvgate.routing.handler import RequestHandler
from kvgate.session import BODY_METADATA_NAMESPACE

log = structlog.get_logger("kvgate.ext_proc")

# Bigger than any ProcessingRequest the filter sends (the session headers and a few metadata
# fields); a larger one is refused rather than buffered.
MAX_REQUEST_BYTES = 256 * 1024
_HEAD_LIMIT = 16 * 1024


class HttpProcessor:
    """Serves ext_proc's `http_service` protocol on one listening socket."""

    def __init__(self, handler: RequestHandler,
                 ready: Callable[[], bool] = lambda: True) -> None:
        self._handler = handler
        self._ready = ready  # answers Envoy's health check (ext_proc.readiness)
        self._answers = Answers(json_answer)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def serve(self, sock: socket.socket) -> None:
        """Starts serving on an already bound socket (bound early: a busy port fails the
        start before anything else happens)."""
        self._server = await asyncio.start_server(self._serve, sock=sock, limit=_HEAD_LIMIT)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                try:
                    body = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except (ValueError, asyncio.LimitOverrunError) as exc:
                    log.warning("http_transport_bad_request", error=str(exc))
                    writer.write(_BAD_REQUEST)
                    return
                if isinstance(body, str):  # GET: a health check (Envoy's asks for decisions)
                    ready = body != DECISIONS_HEALTH_PATH or self._ready()
                    writer.write(_ok(b"{}") if ready else _UNAVAILABLE)
                    continue
                writer.write(_ok(await self._answer(body)))
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, body: bytes) -> bytes:
        try:
            request = json.loads(body)
            phase = request["request_headers"]
            headers = _headers(phase)
            session = request.get("metadata_context", {}).get("filter_metadata", {}).get(
                BODY_METADATA_NAMESPACE)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Not a request-headers message: nothing else is asked for; "continue".
            log.warning("http_transport_unexpected_message", error=str(exc))
            return self._answers.of_nothing()
        # The body's session fields as the core takes them, name -> text; a field of another
        # kind reads as empty text (names no session), as over gRPC.
        body_fields = None
        if isinstance(session, dict) and session:
            body_fields = {name: text if isinstance(text, str) else ""
                           for name, text in session.items()}
        pool = headers.pop(POOL_HEADER, None)
        decision = await self._handler.decide(
            None if pool is None else pool.decode(errors="replace"), headers, body_fields
        )
        return self._answers.of(decision)


def _headers(phase: dict[str, Any]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for header in phase.get("headers", {}).get("headers", ()):
        raw = header.get("raw_value")
        try:
            found[header["key"]] = (base64.b64decode(raw) if raw is not None
                                    else header.get("value", "").encode())
        except binascii.Error as exc:
            raise ValueError(f"header {header.get('key')!r}: raw_value is not base64") from exc
    return found


async def _read_request(reader: asyncio.StreamReader) -> bytes | str:
    """A POST's body, or a GET's path."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, _, rest = lines[0].partition(b" ")
    length = 0
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    if method == b"GET":
        return rest.split(b" ", 1)[0].decode(errors="replace")
    if method != b"POST":
        raise ValueError(f"method {method.decode(errors='replace')!r}: only POST and GET")
    if chunked:
        return await _read_chunked(reader)
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {length} bytes, more than {MAX_REQUEST_BYTES}")
    return await reader.readexactly(length)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # the empty trailer section
            return b"".join(parts)
        total += size
        if total > MAX_REQUEST_BYTES:
            raise ValueError(f"chunked request past {MAX_REQUEST_BYTES} bytes")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
_BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
