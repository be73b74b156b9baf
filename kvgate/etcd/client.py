"""The etcd operations kvgate needs, with deadlines and endpoint failover.

Built on aetcd's generated etcd v3 stubs rather than its client class so that every call has an
explicit deadline, watches surface stream loss as an exception, and several endpoints are tried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from aetcd.rpc import kv_pb2
from aetcd.rpc import rpc_pb2 as rpc
from aetcd.rpc import rpc_pb2_grpc as stubs


class EtcdUnavailable(Exception):
    """etcd could not be reached or did not answer in time."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    deleted: bool
    kv: KeyValue


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive range end covering every key that starts with `prefix`."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _kv(kv: object) -> KeyValue:
    return KeyValue(kv.key, kv.value, kv.mod_revision, kv.lease)  # type: ignore[attr-defined]


class EtcdClient:
    """One gRPC channel to the first reachable endpoint; rotates on UNAVAILABLE."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self._endpoints = list(endpoints)
        self._index = 0
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None  # opened on first use, inside the loop

    @property
    def endpoint(self) -> str:
        return self._endpoints[self._index]

    def _connect(self) -> None:
        self._channel = grpc.aio.insecure_channel(
            self.endpoint,
            options=[
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2_000),
            ],
        )
        self._kv = stubs.KVStub(self._channel)
        self._watch = stubs.WatchStub(self._channel)
        self._lease = stubs.LeaseStub(self._channel)

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

    async def _call(
        self, name: str, service: str, request: object, limit_s: float | None = None
    ) -> object:
        self._stubs()
        method = getattr(getattr(self, service), name)
        try:
            return await method(request, timeout=limit_s or self._timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                await self._rotate()
                raise EtcdUnavailable(f"etcd {self.endpoint}: {exc.code().name}") from None
            raise

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the store revision they were read at."""
        reply = await self._call(
            "Range", "_kv", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        )
        return [_kv(kv) for kv in reply.kvs], reply.header.revision  # type: ignore[attr-defined]

    async def get(self, key: bytes) -> KeyValue | None:
        reply = await self._call("Range", "_kv", rpc.RangeRequest(key=key))
        kvs = reply.kvs  # type: ignore[attr-defined]
        return _kv(kvs[0]) if kvs else None

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        reply = await self._call("Put", "_kv", rpc.PutRequest(key=key, value=value, lease=lease))
        return reply.header.revision  # type: ignore[attr-defined]

    async def delete(self, key: bytes) -> bool:
        reply = await self._call("DeleteRange", "_kv", rpc.DeleteRangeRequest(key=key))
        return reply.deleted > 0  # type: ignore[attr-defined]

    async def delete_prefix(self, prefix: bytes) -> int:
        request = rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix))
        reply = await self._call("DeleteRange", "_kv", request)
        return reply.deleted  # type: ignore[attr-defined]

    async def create(
        self, key: bytes, value: bytes, lease: int = 0, limit_s: float | None = None
    ) -> tuple[bool, KeyValue]:
        """Create `key` only if absent. Returns (created, the key's value now)."""
        return await self._put_if(
            rpc.Compare(
                key=key,
                target=rpc.Compare.CREATE,
                result=rpc.Compare.EQUAL,
                create_revision=0,
            ),
            key, value, lease, limit_s,
        )

    async def replace(
        self, key: bytes, value: bytes, mod_revision: int, lease: int = 0,
        limit_s: float | None = None,
    ) -> tuple[bool, KeyValue | None]:
        """Put only if the key still has `mod_revision`. Returns (replaced, the value now)."""
        return await self._put_if(
            rpc.Compare(
                key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=mod_revision
            ),
            key, value, lease, limit_s,
        )

    async def _put_if(
        self, compare: rpc.Compare, key: bytes, value: bytes, lease: int, limit_s: float | None
    ) -> tuple[bool, KeyValue]:
        request = rpc.TxnRequest(
            compare=[compare],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        reply = await self._call("Txn", "_kv", request, limit_s)
        if reply.succeeded:  # type: ignore[attr-defined]
            revision = reply.header.revision  # type: ignore[attr-defined]
            return True, KeyValue(key, value, revision, lease)
        kvs = reply.responses[0].response_range.kvs  # type: ignore[attr-defined]
        return False, _kv(kvs[0]) if kvs else None  # type: ignore[return-value]

    async def grant_lease(self, ttl: int) -> int:
        reply = await self._call("LeaseGrant", "_lease", rpc.LeaseGrantRequest(TTL=ttl))
        return reply.ID  # type: ignore[attr-defined]

    async def revoke_lease(self, lease: int) -> None:
        await self._call("LeaseRevoke", "_lease", rpc.LeaseRevokeRequest(ID=lease))

    async def keep_alive_once(self, lease: int) -> int:
        """Refreshes a lease; returns its new TTL (0 if it had already expired)."""
        self._stubs()
        call = self._lease.LeaseKeepAlive(timeout=self._timeout)
        try:
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
            reply = await call.read()
            await call.done_writing()
        except grpc.aio.AioRpcError as exc:
            await self._rotate()
            raise EtcdUnavailable(f"etcd {self.endpoint}: {exc.code().name}") from None
        finally:
            call.cancel()
        return 0 if reply is grpc.aio.EOF else reply.TTL

    async def watch_prefix(
        self, prefix: bytes, start_revision: int
    ) -> AsyncIterator[tuple[list[WatchEvent], int]]:
        """Event batches from `start_revision` on; raises EtcdUnavailable when the stream ends."""
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_end(prefix), start_revision=start_revision,
                progress_notify=True,
            )
        )
        self._stubs()
        call = self._watch.Watch()
        try:
            await call.write(create)
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    raise EtcdUnavailable("etcd watch stream ended")
                if reply.compact_revision:
                    raise EtcdUnavailable(f"watch compacted at {reply.compact_revision}")
                if reply.canceled:
                    raise EtcdUnavailable(f"watch canceled: {reply.cancel_reason}")
                events = [
                    WatchEvent(event.type == kv_pb2.Event.DELETE, _kv(event.kv))
                    for event in reply.events
                ]
                yield events, reply.header.revision
        except grpc.aio.AioRpcError as exc:
            await self._rotate()
            raise EtcdUnavailable(f"etcd watch: {exc.code().name}") from None
        finally:
            call.cancel()


async def wait_until_ready(client: EtcdClient, deadline: float) -> None:
    """Polls etcd until it answers or `deadline` (loop time) passes."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await client.get(b"/")
            return
        except EtcdUnavailable:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
