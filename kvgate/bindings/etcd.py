"""Bindings in etcd, mirrored in memory; writes queue up (bounded) while etcd is away.

Keys: `{prefix}bindings/{pool}/{session}` → {"endpoint": "ip:port"}, attached to a lease.
Idle expiry without a write per request: one lease per epoch (idle_ttl/4), shared by every
replica (kvgate.bindings.leases); `touch` only flags a session as used in this epoch, and at the
next epoch the sessions used are re-attached to the newest lease, in batched transactions paced
over half an epoch, skipping those already on the newest or the previous lease. So a session is
rewritten at most once per epoch however many replicas serve it (in steady use, once every two).
A binding is kept at least idle_ttl after its last use and gone by 1.75 × idle_ttl.

Nothing here holds the event loop for long: the listing is applied page by page, watch events
and re-attachment in slices, and the degraded-mode queue is flushed in batched transactions
(kvgate.bindings.flush).

Its background tasks (the mirror, lease refresh, re-attach, the degraded-mode flush) run under the
service's supervisor; an etcd failure of any kind only pauses them, named in the log.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace

import structlog

from kvgate.bindings.failures import BackgroundFailures
from kvgate.bindings.flush import PendingFlush
from kvgate.bindings.index import SessionKey, session_key, session_of
from kvgate.bindings.leases import EpochLeases, EpochLeaseSet
from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding, MoveEstimate, binding_key
from kvgate.bindings.pending import PendingWrite, PendingWrites
from kvgate.bindings.reattach import Reattachment
from kvgate.contract.states import MoveReason
from kvgate.etcd import EtcdClient, EtcdError, KeyValue, PrefixMirror
from kvgate.etcd.client import WatchEvent
from kvgate.etcd.errors import EtcdDeadline, EtcdLeaseNotFound, EtcdUnavailable
from kvgate.etcd.mirror import MirrorState
from kvgate.runtime.tasks.supervisor import Supervisor

log = structlog.get_logger("kvgate.bindings")

DEFAULT_MAX_PENDING = 100_000
SLOW_WRITES_TO_DEGRADE = 3  # hot-path writes past the deadline in a row: etcd counts as away


def _time_left(limit_s: float | None) -> Callable[[], float | None]:
    """What remains of `limit_s` from now, each time it is asked (None: no limit)."""
    if limit_s is None:
        return lambda: None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    return lambda: max(0.001, deadline - loop.time())


# After this replica was apart from etcd, new sessions stay on Envoy's ring this long: a peer
# that lost etcd too placed its new sessions there and may still be flushing them (it retries
# every half second), and a session it placed can reach this replica meanwhile (Envoy's ext_proc
# ring changes as replicas come back); placed by load, it would move once when the peer's write
# lands (docs/faults.md). Apart: a degraded spell, its copy of the bindings listed again after
# its watch was lost (it stepped aside with no write failing), or a hot-path write not landed.
RING_AFTER_RECOVERY_S = 3.0


class EtcdBindingStore:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        idle_ttl: float,
        *,
        supervisor: Supervisor,
        on_etcd_error: Callable[[], None] | None = None,
        flush_interval: float = 0.5,
        write_limit_s: float = 0.1,
        write_budget_s: float | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self._client = client
        self._bindings = BindingMirror(prefix)
        self._prefix = self._bindings.prefix
        epoch = max(1.0, idle_ttl / 4)
        self._index = self._bindings.index  # the same object, one attribute nearer the hot path
        self._pending = PendingWrites(max_pending)
        self._failures = BackgroundFailures(lambda: len(self._pending))
        # An epoch's lease outlives its last possible use by idle_ttl
        # (re-attachment skips sessions already on the previous epoch's lease).
        self.reattachment = Reattachment(
            client, EpochLeases(client, prefix, epoch, math.ceil(idle_ttl + 2 * epoch)),
            self._index, self._session_etcd_key, self._failures)
        self._degraded = False
        self._recovered_at = -math.inf  # monotonic: when it was last apart from etcd (above)
        self._slow_writes = 0
        # Hot-path writes must finish well inside Envoy's ext_proc message timeout; a slower
        # etcd is treated as away (the write is queued and flushed in the background).
        self._write_limit_s = write_limit_s
        # A hot-path write that misses its deadline, or whose member is gone, is tried once
        # more (on the next member) within this: answered from a queued binding the other
        # replicas cannot read, a session's next turn at a peer is placed anew (docs/faults.md).
        self._write_budget_s = max(write_limit_s, write_budget_s or 0.0)
        self._on_etcd_error = on_etcd_error
        self._mirror = PrefixMirror(client, self._prefix, self, name="bindings")
        self._supervisor = supervisor
        self.flush = PendingFlush(client, self._pending, self._bindings, self.reattachment,
                                  self._failures, interval=flush_interval,
                                  degraded=lambda: self._degraded, recovered=self._recovered)
        self._writes = 0  # bindings created or moved by this store

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, sync_timeout: float = 5.0) -> None:
        try:
            await self.reattachment.renew()
        except EtcdError as exc:
            self._set_degraded(exc)
        for name, run in self._background().items():
            self._supervisor.spawn(name, run)
        try:
            await asyncio.wait_for(self._mirror.synced.wait(), sync_timeout)
        except TimeoutError:
            error = self._mirror.last_error
            log.warning("bindings_start_unsynced", serving="degraded",
                        state=str(self._mirror.state), loaded=len(self._index),
                        kind=None if error is None else str(error.kind),
                        reason="still listing" if error is None else str(error))

    def _background(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "bindings-mirror": self._mirror.run,
            "bindings-refresh": self.reattachment.refresh_loop,
            "bindings-reattach": self.reattachment.reattach_loop,
            "bindings-flush": self.flush.run,
        }

    async def close(self) -> None:
        await self._supervisor.stop(self._background())
        await self.reattachment.stop()

    @property
    def mirror(self) -> PrefixMirror:
        return self._mirror

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def places_on_ring(self) -> bool:
        return self._degraded or time.monotonic() - self._recovered_at < RING_AFTER_RECOVERY_S

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def epoch_leases(self) -> EpochLeaseSet:
        """The leases new and re-attached bindings go on now (one per shard)."""
        return self.reattachment.lease

    @property
    def writes(self) -> int:
        """Bindings this store wrote to etcd: created, moved, flushed and re-attached."""
        return self._writes + self.flush.writes + self.reattachment.writes

    @property
    def synced(self) -> bool:
        return self._mirror.state == MirrorState.SYNCED

    # -- reads (hot path: memory only) -----------------------------------------------------

    def get(self, pool: str, session: str) -> Binding | None:
        return self._index.find(pool, session)

    def touch(self, binding: Binding) -> None:
        self.reattachment.touch(binding.pool, session_key(binding.session))

    def load(self, pool: str) -> Mapping[str, int]:
        return self._index.load(pool)

    def count(self, pool: str) -> int:
        return self._index.count(pool)

    def bindings(self, pool: str | None = None) -> Iterator[Binding]:
        return self._index.bindings(pool)

    def __len__(self) -> int:
        return len(self._index)

    async def fetch(self, pool: str, session: str) -> Binding | None:
        """One etcd read for a session memory does not hold while the mirror is not synced
        (loading, or its watch lost): another replica may have bound it."""
        if self._degraded:
            return None  # etcd is away: placing anew is all that can be done
        key = binding_key(pool, session)
        try:
            kv = await self._client.get(self._key(key), limit_s=self._write_limit_s)
        except EtcdError as exc:
            # etcd does not answer a read in time: a write would not fare better, and the
            # request has spent its etcd deadline already. Queue until etcd is back.
            self._set_degraded(exc)
            return None
        if kv is None:
            return None
        try:
            found = Binding.decode(key, kv.value, kv.mod_revision)
        except (ValueError, KeyError, TypeError):
            return None
        if key not in self._pending:
            self._bindings.put(found, kv.lease)
        return self._index.find(pool, session) or found

    # -- writes ----------------------------------------------------------------------------

    async def create(self, binding: Binding) -> Binding:
        existing = self._index.find(binding.pool, binding.session)
        if existing is not None:
            return existing
        return await self._write(PendingWrite(binding, 0))

    async def move(self, current: Binding, endpoint: str,
                   reason: MoveReason | None = None, *, optional: bool = False,
                   estimate: MoveEstimate | None = None) -> Binding:
        return await self._write(PendingWrite(current.moved_to(endpoint, reason,
                                                               estimate=estimate),
                                              current.revision),
                                 unless_written=current if optional else None)

    async def _write(self, op: PendingWrite, unless_written: Binding | None = None) -> Binding:
        """`unless_written`: what to answer, queueing nothing, if the write does not land now."""
        if self._degraded or op.binding.key in self._pending:
            return self._queue(op) if unless_written is None else unless_written
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._write_budget_s
        first = outcome = await self._attempt(op, self._write_limit_s)
        if isinstance(first, EtcdDeadline):
            self._slow_write(first)  # counted now: a cut etcd degrades as soon as before
        retry_s = give_up - loop.time()
        if isinstance(first, EtcdUnavailable) and retry_s > 0 and not self._degraded:
            # Once more, on the member the client moved to (a deadline moves it too); a create
            # that landed meanwhile is what the retry's compare finds and returns. With one
            # member it is the same one: a slow etcd then holds a new session's answer for the
            # whole budget (1 s under the suite's 5 s message_timeout), which spares the split
            # a queued binding risks (docs/journal/ext-proc-grpc.md, 2026-12-07).
            outcome = await self._attempt(op, retry_s)
        if isinstance(outcome, Binding):
            self._slow_writes = 0
            return outcome
        # Whatever etcd's trouble, the request is answered from memory: the write is queued.
        if not isinstance(outcome, EtcdDeadline):
            self._set_degraded(outcome)
        elif not isinstance(first, EtcdDeadline):  # one slow write counts once
            self._slow_write(outcome)
        self._recovered_at = time.monotonic()  # apart from etcd, degraded or not
        if not self._degraded:
            log.info("binding_write_queued", binding=op.binding.key, reason=str(outcome))
        # A try that timed out or lost its member may have landed (pending.py).
        landed = isinstance(first, EtcdUnavailable) or isinstance(outcome, EtcdUnavailable)
        tried = op.binding.encode() if landed else None
        return self._queue(op, tried) if unless_written is None else unless_written

    async def _attempt(self, op: PendingWrite, limit_s: float) -> Binding | EtcdError:
        try:
            return await self._commit(op, limit_s)
        except EtcdError as exc:
            return exc

    def _slow_write(self, error: EtcdError) -> None:
        # One slow write queues only itself; several in a row mean etcd is away for now.
        self._slow_writes += 1
        if self._slow_writes >= SLOW_WRITES_TO_DEGRADE:
            self._set_degraded(error)
        elif self._on_etcd_error is not None:
            self._on_etcd_error()

    def _queue(self, op: PendingWrite, tried: bytes | None = None) -> Binding:
        self._pending.add(op, tried)  # raises Unbound when full
        local = replace(op.binding, revision=0)
        self._index.put(local)
        self.flush.wanted.set()
        return local

    async def _commit(self, op: PendingWrite, limit_s: float | None = None) -> Binding:
        """`limit_s`: for all of it, a lease renewal included."""
        key = self._key(op.binding.key)
        value = op.binding.encode()
        shard_key = session_key(op.binding.session)
        current: KeyValue | None = None
        left = _time_left(limit_s)
        for attempt in range(2):
            lease = self.reattachment.lease.of(shard_key)
            try:
                if not lease:
                    raise EtcdLeaseNotFound("no lease for this epoch yet", operation="Txn")
                if op.expected_revision == 0:
                    _, current = await self._client.create(key, value, lease, left())
                else:
                    _, current = await self._client.replace(
                        key, value, op.expected_revision, lease, left()
                    )
                break
            except EtcdLeaseNotFound:
                # The epoch lease expired while etcd was away: take a new one and retry once.
                if attempt:
                    raise
                await self._renew_lease(left())
        self._writes += 1
        if current is None:  # the expected key vanished (expired): create it afresh
            return await self._commit(PendingWrite(op.binding, 0), left())
        stored = Binding.decode(op.binding.key, current.value, current.mod_revision)
        self._bindings.put(stored, current.lease)
        return stored

    async def _renew_lease(self, limit_s: float | None = None) -> None:
        """A new epoch lease, waited for at most `limit_s` (a hot-path write's deadline: the
        renewal's reads and grants, 2 s each, held a new session's answer past Envoy's
        message_timeout); past it the renewal goes on and the write is queued."""
        if limit_s is None:
            await self.reattachment.renew()
            return
        try:
            await asyncio.wait_for(self.reattachment.renew(), limit_s)
        except TimeoutError:
            raise EtcdDeadline(f"no epoch lease within {limit_s:g}s",
                               operation="LeaseGrant") from None

    # -- mirror handler --------------------------------------------------------------------

    def begin_listing(self) -> None:
        self._bindings.begin_listing()

    def listed(self, kvs: list[KeyValue]) -> None:
        if self._pending:  # a queued local write stands until it is flushed
            kvs = [kv for kv in kvs if self._bindings.key_of(kv.key) not in self._pending]
        self._bindings.listed(kvs)

    async def end_listing(self, revision: int) -> int:
        kept = await self._bindings.end_listing(revision)
        if self._mirror.relists:  # listed again after its watch was lost: apart until now
            self._recovered_at = time.monotonic()
        return kept

    def reset(self, kvs: list[KeyValue]) -> None:
        self._bindings.reset([kv for kv in kvs
                              if self._bindings.key_of(kv.key) not in self._pending])
        for op in self._pending:
            self._index.put(replace(op.binding, revision=0))
        if self._mirror.relists:
            self._recovered_at = time.monotonic()

    def apply(self, event: WatchEvent) -> None:
        if self._pending and self._bindings.key_of(event.kv.key) in self._pending:
            return  # a queued local write stands until it is flushed
        self._bindings.apply(event)

    # -- helpers ---------------------------------------------------------------------------

    def _key(self, binding_key: str) -> bytes:
        return self._prefix + binding_key.encode()

    def _session_etcd_key(self, pool: str, key: SessionKey) -> bytes:
        return self._key(binding_key(pool, session_of(key)))

    def _recovered(self) -> None:
        """The flush emptied the queue: etcd is back."""
        self._degraded = False
        self._recovered_at = time.monotonic()
        self._slow_writes = 0

    def _set_degraded(self, error: EtcdError) -> None:
        if not self._degraded:
            log.warning("etcd_degraded", kind=str(error.kind), reason=str(error),
                        pending=len(self._pending))
        self._degraded = True
        if self._on_etcd_error is not None:
            self._on_etcd_error()
