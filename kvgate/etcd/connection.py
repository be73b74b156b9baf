"""One etcd endpoint at a time: the gRPC channel and its stubs, every call's deadline, failover
to the next endpoint on UNAVAILABLE, and each failure classified and reported. The operations
are in ``kvgate.etcd.client``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import grpc
from aetcd.rpc import rpc_pb2_grpc as stubs

from kvgate.etcd.errors import EtcdError, EtcdUnavailable, from_rpc_error
from kvgate.etcd.replies import R, Rpc
from kvgate.etcd.security import EtcdSecurity, open_channel

# Every prefix read comes in pages of at most this many keys, so no reply grows with the
# prefix (kvgate's values are < 200 B: a page of bindings is ~150 KB).
DEFAULT_PAGE_SIZE = 1000
# The largest message this client accepts, set deliberately: pages are ~150 KB; the largest
# watch reply kvgate's own writes make is one shard lease expiring (~600 KB at a million
# sessions), or, to a watcher that fell behind, etcd's batch of up to 1,000 revisions of batched
# transactions (100 bindings each: ~16 MB). Anything beyond is met by relisting in pages rather
# than by parsing more in the event loop. (gRPC's default, 4 MiB, is what a 28,000-key listing
# used to hit.)
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class EtcdConnection:
    """The channel ``EtcdClient`` calls through (see its docstring for the arguments)."""

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 2.0,
        on_error: Callable[[EtcdError], None] | None = None,
        security: EtcdSecurity | None = None,
        *, page_size: int = DEFAULT_PAGE_SIZE,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        if page_size < 1 or max_message_bytes < 4096:
            raise ValueError("page_size must be >= 1 and max_message_bytes >= 4096")
        self.page_size = page_size
        self._max_message_bytes = max_message_bytes
        self._endpoints = list(endpoints)
        self._index = 0
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None  # opened on first use, inside the loop
        self.on_error = on_error
        self.security = security

    @property
    def endpoint(self) -> str:
        return self._endpoints[self._index]

    def _connect(self) -> None:
        self._channel = open_channel(
            self.endpoint,
            options=[
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2_000),
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", self._max_message_bytes),
            ],
            security=self.security,
        )
        self._kv = stubs.KVStub(self._channel)
        self._watch = stubs.WatchStub(self._channel)
        self._lease = stubs.LeaseStub(self._channel)
        self._maintenance = stubs.MaintenanceStub(self._channel)

    async def _rotate(self) -> None:
        if len(self._endpoints) == 1 or self._channel is None:
            return
        old = self._channel
        self._index = (self._index + 1) % len(self._endpoints)
        self._connect()
        await old.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _stubs(self) -> None:
        if self._channel is None:
            self._connect()

    async def _call(self, rpc: Rpc[R], request: object, limit_s: float | None = None) -> R:
        self._stubs()
        method = getattr(getattr(self, rpc.stub), rpc.method)
        async with self._classified(rpc.method):
            reply: R = await method(request, timeout=limit_s or self._timeout)
        return reply

    @asynccontextmanager
    async def _classified(self, operation: str) -> AsyncIterator[None]:
        """Around a call on the current channel: gRPC's failures raised as classified
        EtcdErrors (:meth:`_failed`), a cancellation as what it means (:meth:`_closed_under`)."""
        channel = self._channel
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise await self._failed(exc, operation, channel) from None
        except asyncio.CancelledError:
            raise self._closed_under(operation, channel) from None

    async def _failed(self, exc: grpc.aio.AioRpcError, operation: str,
                      channel: grpc.aio.Channel | None) -> EtcdError:
        """Classifies a failed call, reports it, and moves on to the next endpoint if this one
        is unreachable. ``channel`` is the one the call went out on: if another failure has
        rotated away from it already (closing it cancels every call still on it), this one says
        nothing about the current endpoint and rotates nothing. Without that, each call the
        close cancelled rotated again, closing the channel the previous rotation had just
        opened (tests/chaos: an etcd leader killed under traffic)."""
        error = from_rpc_error(exc, operation, self.endpoint)
        if isinstance(error, EtcdUnavailable) and channel is self._channel:
            await self._rotate()
        self._report(error)
        return error

    def _closed_under(self, operation: str, channel: grpc.aio.Channel | None) -> BaseException:
        """What a call raises when gRPC cancelled it: ``CancelledError`` again if its task is
        being cancelled, else the channel it went out on was closed under it (a rotation, or
        :meth:`close`), which is an unreachable endpoint to the caller, not the end of its task.
        Letting that ``CancelledError`` through ended the supervised task that made the call
        for good (the degraded-mode flush, tests/chaos: bindings placed after an etcd leader
        change never reached etcd)."""
        task = asyncio.current_task()
        if channel is self._channel or (task is not None and task.cancelling()):
            return asyncio.CancelledError()
        error = EtcdUnavailable("call cancelled: its channel was closed by a failover",
                                operation=operation, endpoint=self.endpoint)
        self._report(error)
        return error

    def _report(self, error: EtcdError) -> None:
        if self.on_error is not None:
            self.on_error(error)
