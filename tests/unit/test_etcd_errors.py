"""One classification of etcd failures, from etcd's own status codes and messages."""

from __future__ import annotations

import grpc
import pytest

from kvgate.etcd.errors import (
    EtcdAuthError,
    EtcdDeadline,
    EtcdError,
    EtcdErrorKind,
    EtcdNoSpace,
    EtcdTooLarge,
    EtcdUnavailable,
    classify,
    from_message,
)

Code = grpc.StatusCode


@pytest.mark.parametrize(("code", "message", "kind"), [
    (Code.UNAVAILABLE, "connection refused", EtcdErrorKind.UNAVAILABLE),
    (Code.UNAVAILABLE, "etcdserver: leader changed", EtcdErrorKind.UNAVAILABLE),
    (Code.DEADLINE_EXCEEDED, "Deadline Exceeded", EtcdErrorKind.DEADLINE),
    (Code.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded",
     EtcdErrorKind.NO_SPACE),
    (Code.RESOURCE_EXHAUSTED, "Received message larger than max (5005660 vs. 4194304)",
     EtcdErrorKind.TOO_LARGE),
    (Code.INVALID_ARGUMENT, "etcdserver: request is too large", EtcdErrorKind.TOO_LARGE),
    (Code.RESOURCE_EXHAUSTED, "etcdserver: too many requests", EtcdErrorKind.UNAVAILABLE),
    (Code.INVALID_ARGUMENT, "etcdserver: user name is empty", EtcdErrorKind.AUTH),
    (Code.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password",
     EtcdErrorKind.AUTH),
    (Code.PERMISSION_DENIED, "etcdserver: permission denied", EtcdErrorKind.AUTH),
    (Code.UNAUTHENTICATED, "etcdserver: invalid auth token", EtcdErrorKind.AUTH),
    (Code.FAILED_PRECONDITION, "etcdserver: something new", EtcdErrorKind.OTHER),
    (Code.INTERNAL, "", EtcdErrorKind.OTHER),
])
def test_classify(code: grpc.StatusCode, message: str, kind: EtcdErrorKind) -> None:
    assert classify(code, message) == kind


def test_each_kind_is_its_own_exception_and_the_transient_ones_share_a_base() -> None:
    assert issubclass(EtcdDeadline, EtcdUnavailable)  # callers retry both the same way
    for error_type in (EtcdUnavailable, EtcdNoSpace, EtcdAuthError, EtcdTooLarge):
        assert issubclass(error_type, EtcdError)
    assert not issubclass(EtcdNoSpace, EtcdUnavailable)
    error = EtcdNoSpace("etcdserver: mvcc: database space exceeded", operation="Txn",
                        endpoint="127.0.0.1:2379")
    assert str(error) == ("etcd 127.0.0.1:2379 Txn: no_space: "
                          "etcdserver: mvcc: database space exceeded")


def test_a_watch_cancel_reason_is_classified_too() -> None:
    error = from_message("watch canceled: etcdserver: permission denied", "Watch")
    assert isinstance(error, EtcdAuthError) and error.kind == "auth"


async def test_a_call_cancelled_by_an_earlier_rotation_rotates_nothing() -> None:
    """Closing a channel on rotation cancels every call still on it; those failures say nothing
    of the endpoint now in use, so they must not rotate again (each would close the channel the
    previous rotation had just opened)."""
    from grpc import StatusCode
    from grpc.aio import AioRpcError, Metadata

    from kvgate.etcd.connection import EtcdConnection

    conn = EtcdConnection(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    conn._stubs()
    first = conn._channel
    lost = AioRpcError(StatusCode.UNAVAILABLE, Metadata(), Metadata(), "socket closed")
    await conn._failed(lost, "Watch", first)
    assert conn.endpoint == "127.0.0.1:2"
    cancelled = AioRpcError(StatusCode.CANCELLED, Metadata(), Metadata(),
                            "Locally cancelled by application!")
    await conn._failed(cancelled, "Range", first)  # a call that was on the closed channel
    assert conn.endpoint == "127.0.0.1:2"
    await conn._failed(lost, "Range", conn._channel)  # one on the current channel: moves on
    assert conn.endpoint == "127.0.0.1:3"
    await conn.close()


async def test_a_call_whose_channel_a_failover_closes_fails_as_unavailable() -> None:
    """gRPC answers a call cancelled by its channel's close with ``CancelledError``; to the
    caller that is an endpoint lost, not its own cancellation. Raised as it was, it ended the
    supervised task that made the call (the degraded-mode flush, tests/chaos). A task really
    cancelled still ends."""
    import asyncio

    from kvgate.etcd.client import EtcdClient

    reached = asyncio.Event()
    # Each connection's handler, closed and awaited at the end: left pending, its socket would
    # be collected after this test's loop closed, failing a later test with a ResourceWarning.
    handlers: list[tuple[asyncio.StreamWriter, asyncio.Task[object]]] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append((writer, task))
        reached.set()
        await reader.read()  # accepts and never answers: every call waits for its deadline
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EtcdClient([f"127.0.0.1:{port}", "127.0.0.1:1"], timeout=30.0)
    errors: list[EtcdError] = []
    client.on_error = errors.append
    try:
        flush = asyncio.create_task(client.get(b"/probe"))
        cancelled = asyncio.create_task(client.get(b"/other"))
        await asyncio.wait_for(reached.wait(), 10)  # the calls are out; no reply can come
        cancelled.cancel()
        await client._rotate()  # what an UNAVAILABLE on another call does
        with pytest.raises(EtcdUnavailable, match="closed by a failover"):
            await flush
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert [e.operation for e in errors] == ["Range"]
    finally:
        await client.close()
        server.close()
        for writer, _ in handlers:
            writer.close()
        await asyncio.wait_for(asyncio.gather(*(task for _, task in handlers),
                                              return_exceptions=True), 10)
        await server.wait_closed()
