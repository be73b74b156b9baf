"""The scrapes' HTTP client (kvgate.fleet.keepalive) against a real server on a local port: it
reads Content-Length and chunked bodies (whole or a byte at a time), keeps one connection per
engine across rounds, reopens one the engine closed, hands a 404 over as a status, gives up on
a hung engine at the deadline without holding back the others' replies, and refuses replies it
cannot frame, reopening the connection next round."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from kvgate.config.address import HostPort
from kvgate.fleet.keepalive import KeepAliveClient, Page, PageError
from kvgate.fleet.scrape import (
    LOAD_PATH,
    EngineFigures,
    EngineScrapeMetrics,
    ScrapeRounds,
)

PAGE = (b'vllm:num_requests_waiting{engine="0"} 3.0\n'
        b'vllm:num_requests_running{engine="0"} 2.0\n'
        b'vllm:kv_cache_usage_perc{engine="0"} 0.5\n')


def sized(body: bytes = PAGE, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def chunked(body: bytes = PAGE) -> bytes:
    half = len(body) // 2
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{half:x};ext=1\r\n".encode() + body[:half] + b"\r\n"
            + f"{len(body) - half:X}\r\n".encode() + body[half:] + b"\r\n"
            + b"0\r\nX-Trailer: yes\r\n\r\n")


Reply = Callable[[int], bytes | None]  # the request's number (from 0) → what to send (None: hang)


class Server:
    """Answers each request with what `reply` says, then closes the connection if told to;
    counts connections and records the requests' heads."""

    def __init__(self, reply: Reply, close_after: bool = False, drip: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self.drip = drip  # send a byte at a time
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # set each time this side has closed a connection
        self.address = ""
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                data = self.reply(len(self.requests) - 1)
                if data is None:
                    await asyncio.Event().wait()  # hangs until cancelled
                    return
                for piece in ([data[i:i + 1] for i in range(len(data))] if self.drip
                              else [data]):
                    writer.write(piece)
                    await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.closed.set()


@contextlib.asynccontextmanager
async def serving(server: Server, host: str = "127.0.0.1") -> AsyncIterator[Server]:
    listener = await asyncio.start_server(server.handle, host, 0)
    port = listener.sockets[0].getsockname()[1]
    server.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        yield server
    finally:
        listener.close()
        for task in server.handlers:  # a hung one too
            task.cancel()
        await asyncio.gather(*server.handlers, return_exceptions=True)


async def one_round(client: KeepAliveClient, wanted: list[tuple[str, str]],
                    timeout_s: float = 5.0) -> list[Page | Exception]:
    replies: dict[int, Page | Exception] = {}
    await client.get_each(wanted, timeout_s, replies.__setitem__)
    assert sorted(replies) == list(range(len(wanted)))  # each handed over exactly once
    return [replies[i] for i in range(len(wanted))]


async def test_content_length_pages_come_over_one_connection_round_after_round() -> None:
    async with serving(Server(lambda n: sized())) as server, KeepAliveClient() as client:
        for _ in range(5):
            assert await one_round(client, [(server.address, LOAD_PATH)]) == [Page(200, PAGE)]
    assert (server.connections, client.opened, len(server.requests)) == (1, 1, 5)
    head = server.requests[0].decode()
    assert head.startswith(f"GET {LOAD_PATH} HTTP/1.1\r\n")
    assert f"\r\nHost: {server.address}\r\n" in head
    assert "\r\nAccept-Encoding: identity\r\n" in head


@pytest.mark.parametrize("drip", [False, True], ids=["whole", "a-byte-at-a-time"])
@pytest.mark.parametrize("reply", [sized, chunked], ids=["content-length", "chunked"])
async def test_a_body_is_read_whatever_its_framing_and_however_it_arrives(
        reply: Callable[[], bytes], drip: bool) -> None:
    async with serving(Server(lambda n: reply(), drip=drip)) as server, \
            KeepAliveClient() as client:
        for _ in range(3):
            assert await one_round(client, [(server.address, "/metrics")]) == [Page(200, PAGE)]
    assert server.connections == 1


async def test_a_connection_the_engine_closes_is_reopened_without_a_failed_scrape() -> None:
    said_so = Server(lambda n: sized(extra=b"Connection: close\r\n"), close_after=True)
    silently = Server(lambda n: sized(), close_after=True)
    async with serving(said_so), serving(silently), KeepAliveClient() as client:
        for _ in range(3):
            said_so.closed.clear()
            silently.closed.clear()
            replies = await one_round(client, [(said_so.address, "/m"), (silently.address, "/m")])
            assert replies == [Page(200, PAGE), Page(200, PAGE)]
            # The engines' side is closed before the next round asks (the client reads the EOF
            # while the loop turns to get here).
            await asyncio.wait_for(said_so.closed.wait(), 5)
            await asyncio.wait_for(silently.closed.wait(), 5)
    assert (said_so.connections, silently.connections, client.opened) == (3, 3, 6)


async def test_a_connection_broken_mid_reply_fails_that_scrape_and_is_reopened() -> None:
    # The first reply is cut short by the close.
    server = Server(lambda n: sized()[:-10] if n == 0 else sized(), close_after=True)
    async with serving(server), KeepAliveClient() as client:
        first = await one_round(client, [(server.address, "/m")])
        server.close_after = False
        second = await one_round(client, [(server.address, "/m")])
        third = await one_round(client, [(server.address, "/m")])
    assert isinstance(first[0], PageError)
    assert second == third == [Page(200, PAGE)]
    assert server.connections == 2


async def test_a_404_is_handed_over_as_a_status_and_its_connection_not_kept() -> None:
    def reply(n: int) -> bytes:
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot here\n" if n == 0 \
            else sized()

    async with serving(Server(reply)) as server, KeepAliveClient() as client:
        assert await one_round(client, [(server.address, LOAD_PATH)]) == [Page(404, b"")]
        assert await one_round(client, [(server.address, "/metrics")]) == [Page(200, PAGE)]
    assert server.connections == 2


async def test_a_hung_engine_times_out_alone_and_counts_as_one_failed_scrape() -> None:
    hung = Server(lambda n: None if n == 0 else sized())
    fine = Server(lambda n: sized())
    read: list[tuple[str, EngineFigures, float]] = []
    registry = CollectorRegistry()
    async with serving(hung), serving(fine), KeepAliveClient() as client:
        rounds = ScrapeRounds(lambda: [hung.address, fine.address],
                              lambda *args: read.append(args), 0.1, 0.3,
                              EngineScrapeMetrics(registry, "ext_proc"), clock=time.monotonic)
        started = time.monotonic()
        spent = await rounds.timed_round(client)
        assert 0.3 <= spent < 3
        # The engine that answered was read as its reply came, not at the deadline.
        assert [(a, f) for a, f, _ in read] == [
            (fine.address, EngineFigures.of(waiting=3, running=2, kv_usage=0.5))]
        assert read[0][2] - started < 0.3
        await rounds.timed_round(client)  # the hung engine's connection was given up: a new one
    assert hung.connections == 2 and fine.connections == 1
    assert [a for a, _, _ in read] == [fine.address, hung.address, fine.address] or \
        [a for a, _, _ in read] == [fine.address, fine.address, hung.address]
    failed = registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total",
                                       {"result": "failed"})
    assert failed == 1


MALFORMED = {
    "not http/1.x": b"HTTP/2 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "status not three digits": b"HTTP/1.1 20 OK\r\nContent-Length: 1\r\n\r\nx",
    "header without a colon": b"HTTP/1.1 200 OK\r\nContent-Length 1\r\n\r\nx",
    "a header name ending in a blank": b"HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx",
    "a bare CR in a header": b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 1\r\n\r\nx",
    "body to the close": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nx",
    "another transfer coding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "a content coding": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1"
                        b"\r\n\r\nx",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
    "length and chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    "chunk size not hex": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"0x1\r\nx\r\n0\r\n\r\n",
    "chunk without crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"1\r\nxy0\r\n\r\n",
    "negative length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
}


@pytest.mark.parametrize("bad", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_a_reply_it_cannot_frame_fails_and_the_next_round_reconnects(bad: bytes) -> None:
    # The bad reply's connection is closed by the server too (as a body "to the close" needs).
    server = Server(lambda n: bad if n == 0 else sized(), close_after=True)
    async with serving(server), KeepAliveClient() as client:
        first = await one_round(client, [(server.address, "/m")])
        second = await one_round(client, [(server.address, "/m")])
    assert isinstance(first[0], PageError), first
    assert second == [Page(200, PAGE)]


async def test_bytes_past_the_reply_close_the_connection() -> None:
    server = Server(lambda n: sized() + b"HTTP/1.1 200 OK\r\n" if n == 0 else sized())
    async with serving(server), KeepAliveClient() as client:
        for _ in range(2):
            assert await one_round(client, [(server.address, "/m")]) == [Page(200, PAGE)]
    assert server.connections == 2  # the first was out of step: not reused


async def test_a_refused_connection_and_a_bad_address_fail_alone() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening
        async with serving(Server(lambda n: sized())) as server, KeepAliveClient() as client:
            replies = await one_round(client, [(refused, "/m"), ("no-port", "/m"),
                                               (server.address, "/m")])
    assert isinstance(replies[0], OSError) and isinstance(replies[1], PageError)
    assert replies[2] == Page(200, PAGE)


def ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_addresses_parse_as_they_print_ipv6_in_brackets() -> None:
    """What the IPv6 test below checks against a socket, without one (it runs everywhere)."""
    for address, host, port in (("[::1]:8000", "::1", 8000), ("10.0.0.1:80", "10.0.0.1", 80),
                                ("engine-0:9", "engine-0", 9)):
        parsed = HostPort.parse(address)
        assert (parsed.host, parsed.port, str(parsed)) == (host, port, address)
    for bad in ("no-port", ":80", "host:", "host:8o"):
        with pytest.raises(ValueError, match="not host:port"):
            HostPort.parse(bad)


# Skipped only where the host has no IPv6 loopback at all (containers started with IPv6
# disabled): no ::1 to serve on. The machine this project is tested on has one, so it runs
# there (and in CI); the parsing it relies on is checked above without a socket.
@pytest.mark.skipif(not ipv6(), reason="no IPv6 loopback here")
async def test_an_ipv6_engine_is_addressed_in_brackets() -> None:
    async with serving(Server(lambda n: sized()), host="::1") as server, \
            KeepAliveClient() as client:
        assert await one_round(client, [(server.address, "/m")]) == [Page(200, PAGE)]
    assert server.address.startswith("[::1]:")
    assert f"\r\nHost: {server.address}\r\n".encode() in server.requests[0]
