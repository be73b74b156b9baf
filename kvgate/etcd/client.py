"""The etcd operations kvgate needs, with deadlines and endpoint failover.

Built on aetcd's generated etcd v3 stubs rather than its client class so that every call has an
explicit deadline, watches surface stream loss as an exception, and several endpoints are tried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
from aetcd.rpc import kv_pb2
from aetcd.rpc import rpc_pb2 as rpc

from kvgate.etcd.connection import EtcdConnection
from kvgate.etcd.errors import (
    EtcdError,
    EtcdErrorKind,
    EtcdFenced,
    EtcdUnavailable,
    from_message,
)
from kvgate.etcd.records import (
    Fence,
    Guard,
    GuardedPut,
    KeyValue,
    PutResult,
    WatchEvent,
    Write,
    key_value,
    prefix_end,
)
from kvgate.etcd.replies import (
    ALARM,
    COMPACT,
    DEFRAGMENT,
    DELETE_RANGE,
    LEASE_GRANT,
    LEASE_REVOKE,
    PUT,
    RANGE,
    STATUS,
    TXN,
    LeaseKeepAliveReply,
    WatchReply,
)

# etcd refuses a transaction of more than --max-txn-ops (128 by default) operations.
MAX_TXN_OPS = 100


class EtcdClient(EtcdConnection):
    """One gRPC channel to the first reachable endpoint; rotates on UNAVAILABLE.

    Every failure is raised as a classified `EtcdError` (kvgate.etcd.errors) and also passed to
    `on_error`, which services use to count and show them. `security` (kvgate.etcd.security):
    TLS and an etcd user for every channel; None: plaintext, no user.
    """

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the store revision they were read at (read in pages,
        all at that revision). For small prefixes; large ones are read with `pages`."""
        found: list[KeyValue] = []
        revision = 0
        async for page, at in self.pages(prefix):
            found.extend(page)
            revision = at
        return found, revision

    async def pages(
        self, prefix: bytes, *, start: bytes | None = None, page_size: int | None = None,
        revision: int = 0,
    ) -> AsyncIterator[tuple[list[KeyValue], int]]:
        """The keys under `prefix` (from `start` on, when given) in pages of at most
        `page_size`, in key order, each with the revision they were all read at (the first
        page's, or `revision`). Raises EtcdCompacted when etcd compacted that revision away
        between two pages: read again."""
        end = prefix_end(prefix)
        key = start if start is not None and start > prefix else prefix
        while True:
            kvs, more, revision = await self.range_page(key, end, page_size, revision)
            yield kvs, revision
            if not more or not kvs:
                return
            key = kvs[-1].key + b"\0"  # continue right after the last key read

    async def range_page(
        self, key: bytes, range_end: bytes, limit: int | None = None, revision: int = 0
    ) -> tuple[list[KeyValue], bool, int]:
        """One page of [key, range_end): (keys, whether more follow, the revision read at)."""
        reply = await self._call(RANGE, rpc.RangeRequest(
            key=key, range_end=range_end, limit=limit or self.page_size, revision=revision,
        ))
        return ([key_value(kv) for kv in reply.kvs], reply.more,
                reply.header.revision if not revision else revision)

    async def count_prefix(self, prefix: bytes) -> int:
        """How many keys are under `prefix` (etcd counts; nothing is transferred)."""
        count, _ = await self.count_range(prefix, prefix_end(prefix))
        return count

    async def count_range(
        self, key: bytes, range_end: bytes, revision: int = 0
    ) -> tuple[int, int]:
        """(keys in [key, range_end) at `revision` or now, the revision counted at)."""
        reply = await self._call(RANGE, rpc.RangeRequest(
            key=key, range_end=range_end, count_only=True, revision=revision))
        return (int(reply.count),
                revision or reply.header.revision)

    async def get(self, key: bytes, limit_s: float | None = None) -> KeyValue | None:
        reply = await self._call(RANGE, rpc.RangeRequest(key=key), limit_s)
        kvs = reply.kvs
        return key_value(kvs[0]) if kvs else None

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        reply = await self._call(PUT, rpc.PutRequest(key=key, value=value, lease=lease))
        return reply.header.revision

    async def delete(self, key: bytes) -> bool:
        reply = await self._call(DELETE_RANGE, rpc.DeleteRangeRequest(key=key))
        return reply.deleted > 0

    async def delete_prefix(self, prefix: bytes) -> int:
        request = rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix))
        reply = await self._call(DELETE_RANGE, request)
        return reply.deleted

    async def create(
        self, key: bytes, value: bytes, lease: int = 0, limit_s: float | None = None
    ) -> tuple[bool, KeyValue]:
        """Create `key` only if absent. Returns (created, the key's value now)."""
        created, now = await self._put_if(
            rpc.Compare(
                key=key,
                target=rpc.Compare.CREATE,
                result=rpc.Compare.EQUAL,
                create_revision=0,
            ),
            key, value, lease, limit_s,
        )
        assert now is not None  # refused only when the key exists: the same transaction read it
        return created, now

    async def replace(
        self, key: bytes, value: bytes, mod_revision: int, lease: int = 0,
        limit_s: float | None = None, fence: Fence | None = None,
    ) -> tuple[bool, KeyValue | None]:
        """Put only if the key still has `mod_revision`. Returns (replaced, the value now).
        `fence`: only while that election key is on that lease, else EtcdFenced."""
        return await self._put_if(
            rpc.Compare(
                key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=mod_revision
            ),
            key, value, lease, limit_s, fence,
        )

    async def _put_if(
        self, compare: rpc.Compare, key: bytes, value: bytes, lease: int, limit_s: float | None,
        fence: Fence | None = None,
    ) -> tuple[bool, KeyValue | None]:
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=key))]
        if fence is not None:
            failure.append(rpc.RequestOp(request_range=rpc.RangeRequest(key=fence.key)))
        request = rpc.TxnRequest(
            compare=[compare, *_fenced(fence)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            ],
            failure=failure,
        )
        reply = await self._call(TXN, request, limit_s)
        if reply.succeeded:
            revision = reply.header.revision
            return True, KeyValue(key, value, revision, lease)
        if fence is not None:
            holder = reply.responses[1].response_range.kvs
            if not holder or holder[0].lease != fence.lease:
                raise EtcdFenced("this replica's election key is gone: another leads now",
                                 operation="Txn")
        kvs = reply.responses[0].response_range.kvs
        return False, key_value(kvs[0]) if kvs else None

    async def commit(self, guards: Sequence[Guard], writes: Sequence[Write]) -> int | None:
        """Applies every write in one transaction if every guard holds; returns the store's
        revision after it, or None when a guard failed (someone wrote meanwhile)."""
        compare = [
            rpc.Compare(key=g.key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                        create_revision=0) if g.mod_revision == 0
            else rpc.Compare(key=g.key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                             mod_revision=g.mod_revision)
            for g in guards
        ]
        success = [
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=w.key))
            if w.value is None
            else rpc.RequestOp(request_put=rpc.PutRequest(key=w.key, value=w.value))
            for w in writes
        ]
        reply = await self._call(TXN, rpc.TxnRequest(compare=compare, success=success))
        if not reply.succeeded:
            return None
        return reply.header.revision

    async def put_each(
        self, puts: Sequence[GuardedPut], limit_s: float | None = None,
        read_refused: bool = True, fence: Fence | None = None,
    ) -> tuple[list[PutResult], int]:
        """Each put under its own guard, all in one transaction (one etcd write for the batch:
        nested transactions, etcd >= 3.3): a guard that fails skips only its own key, whose
        value now is read in the same transaction unless `read_refused` is False. At most
        MAX_TXN_OPS puts. Returns each put's result, in order, and the revision after them.
        `fence`: nothing is written unless that election key is on that lease (EtcdFenced)."""
        if len(puts) > MAX_TXN_OPS:
            raise ValueError(f"at most {MAX_TXN_OPS} puts per transaction, got {len(puts)}")
        ops = []
        for p in puts:
            compare = (
                rpc.Compare(key=p.key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                            create_revision=0) if p.mod_revision == 0
                else rpc.Compare(key=p.key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                                 mod_revision=p.mod_revision)
            )
            put = (rpc.PutRequest(key=p.key, value=p.value, lease=p.lease) if p.value is not None
                   else rpc.PutRequest(key=p.key, lease=p.lease, ignore_value=True))
            ops.append(rpc.RequestOp(request_txn=rpc.TxnRequest(
                compare=[compare], success=[rpc.RequestOp(request_put=put)],
                failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=p.key))]
                if read_refused else [],
            )))
        reply = await self._call(TXN, rpc.TxnRequest(compare=_fenced(fence),
                                                              success=ops), limit_s)
        if not reply.succeeded:  # only a fence can fail here
            raise EtcdFenced("this replica's election key is gone: another leads now",
                             operation="Txn")
        revision = reply.header.revision
        results = []
        for p, response in zip(puts, reply.responses, strict=True):
            nested = response.response_txn
            if nested.succeeded:
                # ignore_value keeps the stored value, which the caller did not send: unknown
                results.append(PutResult(True, KeyValue(p.key, p.value or b"", revision, p.lease)))
            elif not read_refused:
                results.append(PutResult(False, None))
            else:
                kvs = nested.responses[0].response_range.kvs
                results.append(PutResult(False, key_value(kvs[0]) if kvs else None))
        return results, revision

    async def grant_lease(self, ttl: int) -> int:
        reply = await self._call(LEASE_GRANT, rpc.LeaseGrantRequest(TTL=ttl))
        return reply.ID

    async def revoke_lease(self, lease: int) -> None:
        await self._call(LEASE_REVOKE, rpc.LeaseRevokeRequest(ID=lease))

    async def keep_alive_once(self, lease: int) -> int:
        """Refreshes a lease; returns its new TTL (0 if it had already expired)."""
        self._stubs()
        call = self._lease.LeaseKeepAlive(timeout=self._timeout)
        try:
            async with self._classified("LeaseKeepAlive"):
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
                reply = await call.read()
                await call.done_writing()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            return 0
        alive: LeaseKeepAliveReply = reply
        return alive.TTL

    async def watch_prefix(
        self, prefix: bytes, start_revision: int
    ) -> AsyncIterator[tuple[list[WatchEvent], int]]:
        """Event batches from `start_revision` on; raises a classified EtcdError when the stream
        ends (EtcdUnavailable when it was lost or compacted away: relist and watch again;
        EtcdTooLarge when one reply was more than this client accepts: relist in pages).

        Each batch comes with the revision it completes (0 for a fragment that more of the same
        revision follow, should a server send fragments). Fragmentation is not asked for: etcd
        (3.5 and later) splits a reply in time quadratic in its events, 37 s for one 2 MiB
        fragment of deletes measured here, against 0.05 s for the whole 2 MB reply; so a reply
        too large for this client is better met by relisting in pages (seconds), and kvgate
        keeps its own replies small instead (sharded leases, kvgate.bindings.leases)."""
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_end(prefix), start_revision=start_revision,
                progress_notify=True,
            )
        )
        self._stubs()
        call = self._watch.Watch()
        try:
            async with self._classified("Watch"):
                await call.write(create)
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        raise self._watch_lost("watch stream ended")
                    reply: WatchReply = message
                    if reply.compact_revision:
                        raise self._watch_lost(f"watch compacted at {reply.compact_revision}")
                    if reply.canceled:
                        error = from_message(f"watch canceled: {reply.cancel_reason}", "Watch",
                                             self.endpoint)
                        self._report(error)
                        raise error
                    events = [
                        WatchEvent(event.type == kv_pb2.Event.DELETE, key_value(event.kv))
                        for event in reply.events
                    ]
                    yield events, 0 if reply.fragment else reply.header.revision
        finally:
            call.cancel()

    def _watch_lost(self, detail: str) -> EtcdUnavailable:
        error = EtcdUnavailable(detail, operation="Watch", endpoint=self.endpoint)
        self._report(error)
        return error

    # -- maintenance: what an operator does with etcdctl after a NOSPACE alarm -------------

    async def alarms(self) -> list[str]:
        """The active alarms, e.g. ["NOSPACE"] (`etcdctl alarm list`)."""
        reply = await self._call(ALARM,
                                 rpc.AlarmRequest(action=rpc.AlarmRequest.GET))
        return sorted({rpc.AlarmType.Name(a.alarm) for a in reply.alarms})

    async def disarm_alarms(self) -> int:
        """Deactivates every active alarm (`etcdctl alarm disarm`); returns how many."""
        reply = await self._call(ALARM,
                                 rpc.AlarmRequest(action=rpc.AlarmRequest.GET))
        alarms = list(reply.alarms)
        for alarm in alarms:
            await self._call(ALARM, rpc.AlarmRequest(
                action=rpc.AlarmRequest.DEACTIVATE, memberID=alarm.memberID, alarm=alarm.alarm,
            ))
        return len(alarms)

    async def compact(self, revision: int | None = None) -> int:
        """Drops history before `revision` (default: now) (`etcdctl compact`); returns it."""
        if revision is None:
            reply = await self._call(RANGE, rpc.RangeRequest(key=b"\0", limit=1))
            revision = reply.header.revision
        await self._call(COMPACT,
                         rpc.CompactionRequest(revision=revision, physical=True))
        return revision

    async def db_size(self) -> tuple[int, int]:
        """(bytes of the connected member's database file, of which in use): its quota
        (--quota-backend-bytes) counts the file; defragmenting returns the rest."""
        reply = await self._call(STATUS, rpc.StatusRequest())
        return int(reply.dbSize), int(reply.dbSizeInUse)

    async def defragment(self, limit_s: float = 60.0) -> None:
        """Returns the compacted space to the file system on the connected member
        (`etcdctl defrag`)."""
        await self._call(DEFRAGMENT, rpc.DefragmentRequest(), limit_s)


async def wait_until_ready(client: EtcdClient, deadline: float, key: bytes = b"/") -> None:
    """Polls etcd until it answers or `deadline` (loop time) passes. Reads `key`: give one the
    etcd user may read (under etcd.prefix). Any other failure (refused credentials) is raised
    at once."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await client.get(key)
            return
        except EtcdUnavailable:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def _fenced(fence: Fence | None) -> list[rpc.Compare]:
    """The compare that holds while `fence`'s key is on its lease (none without a fence)."""
    if fence is None:
        return []
    return [rpc.Compare(key=fence.key, target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL,
                        lease=fence.lease)]


__all__ = ["EtcdClient", "EtcdError", "EtcdErrorKind", "EtcdUnavailable", "Fence", "Guard",
           "GuardedPut", "KeyValue", "PutResult", "WatchEvent", "Write", "prefix_end",
           "wait_until_ready"]

