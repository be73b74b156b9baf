"""A minimal HTTP/1.1 GET client for the engines' metrics pages: one kept-alive connection per
engine, stdlib asyncio only, GETs sent a round at a time.

Why not aiohttp: a scrape of vLLM's filtered page is 566 bytes, and a general client's
per-request machinery (URL, request and response objects, header multidicts, its pool, a task
and a timer per request) costs several times what reading those bytes does; the collector makes
10,000 scrapes a second at 1,000 engines. Why a Protocol and not asyncio streams: a stream
reader and a task per GET were half of what was left (bench/engine_state_cost.py measures this
client against aiohttp in one run). So a round (`get_each`) writes every request at once, each
connection's `data_received` parses its reply, and one deadline covers the round.

What it reads: a status line, headers, and a body framed by Content-Length or
`Transfer-Encoding: chunked`. Anything else (a body that runs to the connection's close, another
transfer or content coding, a malformed head or chunk, a body over `max_body`, bytes past the
reply) fails that GET with `PageError`; a connection that closes or breaks mid-reply fails it
with `PageError` or the OSError. Whatever goes wrong, that engine's connection is closed and its
next GET opens a new one. A reply other than 200 is handed over with its status and no body and
its connection closed: those are rare (a 404 sends the scraper to the whole page once) and not
worth framing.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from kvgate.config.address import HostPort

# Heads (and chunk-size lines) are a few hundred bytes; a larger one is not a metrics page.
HEAD_LIMIT = 64 * 1024
# vLLM's whole /metrics is ~55 KB; a page far past that is not worth reading every 100 ms.
MAX_BODY = 8 * 1024 * 1024
# A connection unused this long (its engine left the active set) is closed. Engines' servers
# close idle ones too (uvicorn after 5 s), which `_Connection.reusable` notices before reuse.
IDLE_S = 30.0
_HEX = b"0123456789abcdefABCDEF"
# Each header line: a name that neither starts nor ends with blanks, a colon, a value; no CR or
# LF inside a line (RFC 9112 5: a recipient may reject them).
_FIELD_LINES = re.compile(rb"(?:\r\n[^ \t:\r\n][^:\r\n]*(?<![ \t]):[^\r\n]*)*")
# The status line: a version this client speaks, three digits, then a reason or nothing.
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: .*)?", re.DOTALL)
# The headers that frame the body or the connection (whatever their case); the rest are unread.
_FRAMING = re.compile(
    rb"\r\n(connection|content-encoding|content-length|transfer-encoding):([^\r\n]*)",
    re.IGNORECASE)


class PageError(Exception):
    """The reply could not be read as HTTP/1.1 this client accepts, or its connection closed."""


@dataclass(frozen=True, slots=True)
class Page:
    """One reply: its status and, for a 200, its body (empty otherwise)."""

    status: int
    body: bytes


OnReply = Callable[[int, Page | Exception], None]  # the request's index, its reply or failure
Done = Callable[[Page | Exception], None]  # one GET's reply or failure, from its connection


class KeepAliveClient:
    """GETs from `host:port` addresses (IPv6 hosts in brackets, as in a URL), each engine's
    connection kept open between rounds. Use as an async context manager, or `close()` it."""

    def __init__(self, max_body: int = MAX_BODY, idle_s: float = IDLE_S) -> None:
        self._max_body = max_body
        self._idle_s = idle_s
        self._idle: dict[str, _Connection] = {}  # address → its open connection, not in use
        self._swept = 0.0  # the loop's clock at the last sweep of idle connections
        self.opened = 0  # connections opened so far (tests and benches count reuse by it)

    async def __aenter__(self) -> KeepAliveClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes every idle connection (none is in use between rounds)."""
        idle, self._idle = list(self._idle.values()), {}
        for connection in idle:
            connection.close()
        # Let the transports finish closing (one loop turn), so none outlives the client.
        await asyncio.sleep(0)

    async def get_each(self, wanted: Sequence[tuple[str, str]], timeout_s: float,
                       on_reply: OnReply) -> None:
        """GETs each `(address, path)` in `wanted` at once; `on_reply(index, reply)` is called
        as each reply arrives, with the Page, or with the PageError, OSError or TimeoutError
        that ended it. Returns when every one has been handed over: at the latest `timeout_s`
        after the call (connecting included), when those still out get TimeoutError. An
        exception raised by `on_reply` is raised from here once the round is over."""
        loop = asyncio.get_running_loop()
        in_flight: dict[int, _Connection] = {}  # request index → its connection, until answered
        connecting: list[asyncio.Task[None]] = []  # also keeps them from being collected
        raised: list[BaseException] = []
        over = loop.create_future()

        def hand_over(index: int, reply: Page | Exception) -> None:
            try:
                on_reply(index, reply)
            except Exception as exc:
                raised.append(exc)  # the other replies are still handed over

        # Called by the connection itself as its reply completes or fails: no future, task or
        # timer per GET (what a GET cost in CPU was mostly those).
        def arrived(index: int, address: str, connection: _Connection,
                    reply: Page | Exception) -> None:
            if in_flight.pop(index, None) is None:
                return  # the deadline passed first: already handed over
            self._release(address, connection, isinstance(reply, Page), loop.time())
            hand_over(index, reply)
            if not in_flight and not over.done():
                over.set_result(None)

        for index, (address, path) in enumerate(wanted):
            request = _get_request(address, path)
            connection, fresh = self._take(address)
            in_flight[index] = connection
            done = functools.partial(arrived, index, address, connection)
            if fresh:
                connecting.append(loop.create_task(
                    self._connect(connection, address, request, done)))
            else:
                connection.request(request, done)
        try:
            if in_flight:
                async with asyncio.timeout(timeout_s):
                    await over
        except TimeoutError:
            for index, connection in list(in_flight.items()):
                del in_flight[index]
                connection.close()  # a reply may still come: the stream is out of step
                hand_over(index, TimeoutError(f"no reply in {timeout_s} s"))
        finally:
            for connection in in_flight.values():  # cancelled: nobody waits for these
                connection.close()
            in_flight.clear()
            for task in connecting:
                task.cancel()
        now = loop.time()
        if now - self._swept > self._idle_s:
            self._sweep(now)
        if raised:
            raise raised[0]

    def _take(self, address: str) -> tuple[_Connection, bool]:
        """`address`'s idle connection if it can carry another request, else a new one; True
        when that new one is still to be connected."""
        connection = self._idle.pop(address, None)
        if connection is not None and connection.reusable():
            return connection, False
        if connection is not None:
            connection.close()  # the engine closed it while idle: no failed scrape
        return _Connection(self._max_body), True

    def _release(self, address: str, connection: _Connection, whole: bool, now: float) -> None:
        """After its reply: kept idle for `address`'s next GET if the reply was `whole` and the
        connection can carry another (and no other is kept for it), else closed."""
        if whole and connection.reusable() and address not in self._idle:
            connection.used = now
            self._idle[address] = connection
        else:
            connection.close()

    async def _connect(self, connection: _Connection, address: str, request: bytes,
                       done: Done) -> None:
        try:
            try:
                at = HostPort.parse(address)  # an IPv6 host bracketed, as in a URL
            except ValueError as exc:
                raise PageError(str(exc)) from None
            # An IP literal connects without a lookup; a name is resolved off the loop
            # (asyncio's getaddrinfo runs in its executor).
            await asyncio.get_running_loop().create_connection(lambda: connection, at.host,
                                                               at.port)
        except (PageError, OSError) as exc:
            done(exc)
            return
        self.opened += 1
        connection.request(request, done)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for address, connection in list(self._idle.items()):
            if now - connection.used > self._idle_s:
                del self._idle[address]
                connection.close()


class _Connection(asyncio.Protocol):
    """One engine's connection: one GET at a time, its reply parsed as it arrives."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._buffer = bytearray()
        self._done: Done | None = None  # who the reply being read goes to
        self.keep = False  # the last reply left the connection usable
        self.used = 0.0  # the loop's clock when it was last handed back
        # The reply being read: its status once its head is in (0 before), then its framing.
        self._status = 0
        self._length = 0
        self._chunked = False
        self._trailers = False  # the last chunk is in; its trailer section is not
        self._body = bytearray()

    def reusable(self) -> bool:
        # The engine may have closed it while idle (its keep-alive timeout, a restart): its EOF
        # has been read already, so this is known before a request is written to it.
        return (self.keep and not self._closed and self._done is None
                and self._transport is not None and not self._transport.is_closing())

    def request(self, data: bytes, done: Done) -> None:
        """Sends a GET; `done` gets its reply, or what ended it, once (unless closed first)."""
        assert self._transport is not None and self._done is None
        self._buffer.clear()
        self._status = self._length = 0
        self._chunked = self._trailers = self.keep = False
        self._body = bytearray()
        self._done = done
        self._transport.write(data)

    def close(self) -> None:
        self._closed = True
        self._done = None  # whoever waited has been answered or has given up
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._closed:  # given up on while connecting
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self._done is None:
            if not self._closed:
                self.close()  # bytes nobody asked for: the stream cannot be trusted
            return
        self._buffer += data
        try:
            page = self._parse()
        except PageError as exc:
            self._fail(exc)
            return
        if page is None:
            return
        done, self._done = self._done, None
        if self._buffer:
            self.keep = False  # more than the reply: the next one would be read out of step
        if not self.keep:
            self.close()
        done(page)

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost fails any pending GET

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if exc is not None else PageError("the connection closed"))
        self._closed = True

    def _fail(self, exc: Exception) -> None:
        done, self._done = self._done, None
        self.close()
        if done is not None:
            done(exc)

    def _parse(self) -> Page | None:
        """The reply, once all of it is in the buffer (None before)."""
        buffer = self._buffer
        if not self._status:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > HEAD_LIMIT:
                    raise PageError("a head over the limit")
                return None
            self._status, self.keep, headers = _head(bytes(buffer[:end]))
            del buffer[:end + 4]
            if self._status != 200:
                self.keep = False
                return Page(self._status, b"")
            if headers.get(b"content-encoding", b"identity").lower() != b"identity":
                raise PageError("a content coding was not asked for")
            coding, length = headers.get(b"transfer-encoding"), headers.get(b"content-length")
            if coding is not None:
                if coding.lower() != b"chunked" or length is not None:
                    raise PageError(f"transfer coding {coding!r}")
                self._chunked = True
            elif length is not None:
                if not length.isdigit() or int(length) > self._max_body:
                    raise PageError(f"content-length {length!r}")
                self._length = int(length)
            else:
                raise PageError("no Content-Length and not chunked")
        if self._chunked:
            return self._chunks()
        if len(buffer) < self._length:
            return None
        body = bytes(buffer[:self._length])
        del buffer[:self._length]
        return Page(200, body)

    def _chunks(self) -> Page | None:
        """Moves each complete chunk from the buffer to the body; the page after the last."""
        buffer = self._buffer
        while not self._trailers:
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > HEAD_LIMIT:
                    raise PageError("a chunk-size line over the limit")
                return None
            size = bytes(buffer[:end]).split(b";", 1)[0].strip()  # extensions are ignored
            # int(..., 16) alone would take "0x", "+" and "_": a chunk size is hex digits only.
            if not size or size.strip(_HEX):
                raise PageError(f"chunk size {bytes(buffer[:min(end, 80)])!r}")
            n = int(size, 16)
            if n == 0:
                del buffer[:end + 2]
                self._trailers = True
                break
            if len(self._body) + n > self._max_body:
                raise PageError("a chunked body over the limit")
            start = end + 2
            if len(buffer) < start + n + 2:
                return None
            if buffer[start + n:start + n + 2] != b"\r\n":
                raise PageError("a chunk not followed by CRLF")
            self._body += buffer[start:start + n]
            del buffer[:start + n + 2]
        # The trailer section (fields nothing here reads) ends with an empty line.
        if buffer[:2] == b"\r\n":
            del buffer[:2]
        else:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > HEAD_LIMIT:
                    raise PageError("trailers over the limit")
                return None
            del buffer[:end + 4]
        return Page(200, bytes(self._body))


def _get_request(address: str, path: str) -> bytes:
    # Accept-Encoding: without it any coding is acceptable (RFC 9110 12.5.3), and
    # prometheus_client would gzip a page this client does not inflate.
    return (f"GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: kvgate\r\n"
            "Accept-Encoding: identity\r\n\r\n").encode("latin-1")


def _head(head: bytes) -> tuple[int, bool, dict[bytes, bytes]]:
    """A reply's status line and headers (without the blank line): its status, whether the
    connection may be kept, and the headers that frame the body or the connection by their
    lowercased names (a repeated one's values joined, as RFC 9110 5.3 combines them)."""
    # Two regular expressions, not a loop over the lines: a head is read 10,000 times a second
    # at 1,000 engines, and a Python step per header line cost about a tenth of a scrape.
    status_end = head.find(b"\r\n")
    status_line, fields = (head, b"") if status_end < 0 else (head[:status_end],
                                                            head[status_end:])
    status = _STATUS_LINE.fullmatch(status_line)
    if status is None:
        raise PageError(f"status line {status_line[:80]!r}")
    if _FIELD_LINES.fullmatch(fields) is None:
        raise PageError(f"header line {_bad_field_line(fields)[:80]!r}")
    headers: dict[bytes, bytes] = {}
    for name, value in _FRAMING.findall(fields):
        name, value = name.lower(), value.strip()
        if name in headers:
            if name == b"content-length":
                if headers[name] != value:  # which length frames the body is unknowable
                    raise PageError("conflicting content-length headers")
                continue
            value = headers[name] + b", " + value
        headers[name] = value
    connection = headers.get(b"connection", b"").lower()
    # HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 only when told to.
    keep = b"close" not in connection if status[1] == b"1" else b"keep-alive" in connection
    return int(status[2]), keep, headers


def _bad_field_line(fields: bytes) -> bytes:
    """The first line `_FIELD_LINES` does not take (for the error)."""
    for line in fields.split(b"\r\n")[1:]:
        if _FIELD_LINES.fullmatch(b"\r\n" + line) is None:
            return line
    return fields
