"""Bindings in etcd, mirrored in memory; writes queue up while etcd is away.

Keys: `{prefix}bindings/{pool}/{session}` → {"endpoint": "ip:port"}, attached to a lease.
Idle expiry without a write per request: leases are granted per epoch (idle_ttl/4); `touch` only
marks a session as used, and once per epoch the sessions used in it are re-attached to the newest
lease. A binding is kept at least idle_ttl after its last use and gone by 1.75 × idle_ttl.

Its background tasks (the mirror, lease refresh, re-attach, the degraded-mode flush) run under the
service's supervisor; an etcd failure of any kind only pauses them, named in the log.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import structlog

from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding, binding_key
from kvgate.etcd import EtcdClient, EtcdError, KeyValue, PrefixMirror
from kvgate.etcd.client import WatchEvent
from kvgate.etcd.errors import EtcdLeaseNotFound
from kvgate.runtime.supervisor import Supervisor

log = structlog.get_logger("kvgate.bindings")


@dataclass(frozen=True, slots=True)
class _Pending:
    binding: Binding
    expected_revision: int  # 0: create if absent; else: replace only if still at this revision


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
    ) -> None:
        self._client = client
        self._bindings = BindingMirror(prefix)
        self._prefix = self._bindings.prefix
        self._epoch = max(1.0, idle_ttl / 4)
        # An epoch's lease outlives its last possible use by idle_ttl
        # (refreshes skip sessions already on the previous epoch's lease).
        self._lease_ttl = math.ceil(idle_ttl + 2 * self._epoch)
        self._index = self._bindings.index  # the same object, one attribute nearer the hot path
        self._touched: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._lease = 0
        self._degraded = False
        self._flush_interval = flush_interval
        # Hot-path writes must finish well inside Envoy's ext_proc message timeout; a slower
        # etcd is treated as away (the write is queued and flushed in the background).
        self._write_limit_s = write_limit_s
        self._on_etcd_error = on_etcd_error
        self._mirror = PrefixMirror(client, self._prefix, self)
        self._supervisor = supervisor
        self._flush_wanted = asyncio.Event()
        self._reattach_wanted = asyncio.Event()
        self._previous_lease = 0
        # Each background failure's latest error, by log event: logged once per change of kind.
        self._failures: dict[str, EtcdError] = {}

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, sync_timeout: float = 5.0) -> None:
        try:
            self._lease = await self._client.grant_lease(self._lease_ttl)
        except EtcdError as exc:
            self._set_degraded(exc)
        for name, run in self._background().items():
            self._supervisor.spawn(name, run)
        try:
            await asyncio.wait_for(self._mirror.synced.wait(), sync_timeout)
        except TimeoutError:
            error = self._mirror.last_error
            log.warning("bindings_start_unsynced", serving="degraded",
                        kind=None if error is None else str(error.kind),
                        reason="no answer from etcd" if error is None else str(error))

    def _background(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "bindings-mirror": self._mirror.run,
            "bindings-refresh": self._refresh_loop,
            "bindings-reattach": self._reattach_loop,
            "bindings-flush": self._flush_loop,
        }

    async def close(self) -> None:
        await self._supervisor.stop(self._background())

    @property
    def mirror(self) -> PrefixMirror:
        return self._mirror

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- reads (hot path: memory only) -----------------------------------------------------

    def get(self, pool: str, session: str) -> Binding | None:
        return self._index.get(binding_key(pool, session))

    def touch(self, binding: Binding) -> None:
        self._touched.add(binding.key)

    def load(self, pool: str) -> Mapping[str, int]:
        return self._index.load(pool)

    def bindings(self, pool: str | None = None) -> Iterator[Binding]:
        return self._index.bindings(pool)

    def __len__(self) -> int:
        return len(self._index)

    # -- writes ----------------------------------------------------------------------------

    async def create(self, binding: Binding) -> Binding:
        existing = self._index.get(binding.key)
        if existing is not None:
            return existing
        return await self._write(_Pending(binding, 0))

    async def move(self, current: Binding, endpoint: str) -> Binding:
        return await self._write(_Pending(replace(current, endpoint=endpoint), current.revision))

    async def _write(self, op: _Pending) -> Binding:
        if self._degraded or op.binding.key in self._pending:
            return self._queue(op)
        try:
            return await self._commit(op, self._write_limit_s)
        except EtcdError as exc:  # whatever etcd's trouble, the request is answered from memory
            self._set_degraded(exc)
            return self._queue(op)

    def _queue(self, op: _Pending) -> Binding:
        earlier = self._pending.get(op.binding.key)
        if earlier is not None:
            # Keep the first expectation: it is what etcd must still hold for the move to apply.
            op = _Pending(op.binding, earlier.expected_revision)
        self._pending[op.binding.key] = op
        local = replace(op.binding, revision=0)
        self._index.put(local)
        self._flush_wanted.set()
        return local

    async def _commit(self, op: _Pending, limit_s: float | None = None) -> Binding:
        key = self._key(op.binding.key)
        value = op.binding.encode()
        current: KeyValue | None = None
        for attempt in range(2):
            try:
                if op.expected_revision == 0:
                    _, current = await self._client.create(key, value, self._lease, limit_s)
                else:
                    _, current = await self._client.replace(
                        key, value, op.expected_revision, self._lease, limit_s
                    )
                break
            except EtcdLeaseNotFound:
                # The epoch lease expired while etcd was away: take a new one and retry once.
                if attempt:
                    raise
                self._lease = await self._client.grant_lease(self._lease_ttl)
        if current is None:  # the expected key vanished (expired): create it afresh
            return await self._commit(_Pending(op.binding, 0))
        stored = Binding.decode(op.binding.key, current.value, current.mod_revision)
        self._bindings.put(stored, current.lease)
        return stored

    # -- mirror handler --------------------------------------------------------------------

    def reset(self, kvs: list[KeyValue]) -> None:
        self._bindings.reset(kvs)
        for op in self._pending.values():
            self._index.put(replace(op.binding, revision=0))

    def apply(self, event: WatchEvent) -> None:
        key = self._bindings.key_of(event.kv.key)
        if key is None or key in self._pending:
            return  # a queued local write stands until it is flushed
        if self._bindings.apply(event) and event.deleted:
            self._touched.discard(key)

    # -- background ------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            try:
                await self._flush()
            except EtcdError as exc:
                self._background_failed("bindings_flush_failed", exc)
                await asyncio.sleep(self._flush_interval)
                continue
            self._flush_wanted.clear()

    async def _flush(self) -> None:
        if self._degraded:
            await self._client.get(self._prefix)  # raises while etcd is still away
        while self._pending:
            key, op = next(iter(self._pending.items()))
            stored = await self._commit(op)
            del self._pending[key]
            if stored.endpoint != op.binding.endpoint:
                log.info("binding_reconciled", binding=key, kept=stored.endpoint,
                         dropped=op.binding.endpoint)
            self._index.put(stored)
        if self._degraded:
            self._degraded = False
            self._failures.pop("bindings_flush_failed", None)
            log.info("etcd_recovered", flushed=True)

    async def _refresh_loop(self) -> None:
        """A new lease every epoch; the re-attach task then moves the sessions used onto it."""
        while True:
            await asyncio.sleep(self._epoch)
            try:
                lease = await self._client.grant_lease(self._lease_ttl)
            except EtcdError as exc:
                # The touched set keeps growing; the next epoch's lease catches up.
                self._background_failed("bindings_lease_refresh_failed", exc)
                continue
            self._background_ok("bindings_lease_refresh_failed")
            self._previous_lease, self._lease = self._lease, lease
            self._reattach_wanted.set()

    async def _reattach_loop(self) -> None:
        while True:
            await self._reattach_wanted.wait()
            self._reattach_wanted.clear()
            lease, previous = self._lease, self._previous_lease
            touched, self._touched = self._touched, set()
            stale = [s for s in touched if self._bindings.leases.get(s) not in (lease, previous)]
            try:
                await self._reattach(stale, lease)
            except BaseException:
                self._touched.update(stale)  # not lost: the next epoch re-attaches them
                raise

    async def _reattach(self, keys: list[str], lease: int) -> None:
        limit = asyncio.Semaphore(32)

        async def one(key: str) -> None:
            binding = self._index.get(key)
            if binding is None or binding.revision == 0:
                return
            async with limit:
                try:
                    done, current = await self._client.replace(
                        self._key(key), binding.encode(), binding.revision, lease
                    )
                except EtcdError as exc:
                    self._touched.add(key)  # retried next epoch
                    self._background_failed("bindings_reattach_failed", exc)
                    return
            if done and current is not None:
                self._bindings.put(replace(binding, revision=current.mod_revision), lease)
            self._background_ok("bindings_reattach_failed")

        await asyncio.gather(*(one(key) for key in keys))

    # -- helpers ---------------------------------------------------------------------------

    def _key(self, binding_key: str) -> bytes:
        return self._prefix + binding_key.encode()

    def _set_degraded(self, error: EtcdError) -> None:
        if not self._degraded:
            log.warning("etcd_degraded", kind=str(error.kind), reason=str(error),
                        pending=len(self._pending))
        self._degraded = True
        if self._on_etcd_error is not None:
            self._on_etcd_error()

    def _background_failed(self, event: str, error: EtcdError) -> None:
        """Logs a background etcd failure once per change of kind, not once per retry."""
        before = self._failures.get(event)
        if before is None or before.kind != error.kind:
            log.warning(event, kind=str(error.kind), error=str(error), pending=len(self._pending))
        self._failures[event] = error

    def _background_ok(self, event: str) -> None:
        before = self._failures.pop(event, None)
        if before is not None:
            log.info("bindings_etcd_recovered", after=event, kind=str(before.kind))
