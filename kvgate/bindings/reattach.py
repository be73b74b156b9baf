"""Write economy: the epoch's shared leases, and the sessions used in an epoch moved onto the
next epoch's lease, in batched transactions paced over half an epoch.

A request only flags its session as used in memory (one of two bits, by epoch parity); at the
start of an epoch the sessions flagged in the one that ended, and not already on this epoch's or
the previous epoch's lease, are re-attached with compare-and-set (MAX_TXN_OPS per transaction,
keeping the stored value). A session another replica re-attached first fails its guard and
costs no write, so however many replicas serve a session it is rewritten at most once per epoch,
and in steady use once every two. Memory stays bounded: the index is scanned in slices over a
snapshot of its keys (8 B each), one batch at a time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from kvgate.bindings.failures import BackgroundFailures
from kvgate.bindings.index import TOUCHED, BindingIndex, SessionKey, lease_of, revision_of
from kvgate.bindings.leases import NO_LEASES, EpochLeases, EpochLeaseSet
from kvgate.bindings.mirror import SLICE
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.client import MAX_TXN_OPS, GuardedPut


class Reattachment:
    def __init__(
        self, client: EtcdClient, leases: EpochLeases, index: BindingIndex,
        key_of: Callable[[str, SessionKey], bytes], failures: BackgroundFailures,
    ) -> None:
        self._client = client
        self._leases = leases
        self._index = index
        self._key_of = key_of  # pool, session → its etcd key
        self._failures = failures
        self.lease = NO_LEASES  # this epoch's leases: new and re-attached bindings go on them
        self.previous = NO_LEASES
        self.epoch = leases.epoch_now()
        self._touched_since = [0, 0]  # sessions flagged as used, per epoch parity
        self._wanted = asyncio.Event()
        self._renewal: asyncio.Future[None] | None = None  # the renewal under way, shared
        self.writes = 0

    def touch(self, pool: str, key: SessionKey) -> None:
        """Flags a session as used in this epoch (memory only: the hot path)."""
        flag = TOUCHED[self.epoch & 1]
        packed = self._index.packed(pool, key)
        if packed is not None and not packed & flag:
            self._index.touch(pool, key, flag)
            self._touched_since[self.epoch & 1] += 1

    async def renew(self) -> None:
        """This epoch's leases, read or granted now (at start, or after they expired). Callers
        at the same time share one renewal (every new session's write finds an expired lease
        at once: each would grant SHARDS leases), which goes on if a caller stops waiting."""
        renewal = self._renewal
        if renewal is None:
            renewal = self._renewal = asyncio.ensure_future(self._renew())
            renewal.add_done_callback(self._renewed)
        await asyncio.shield(renewal)

    async def stop(self) -> None:
        """Ends a renewal under way that no caller waits for any more (the store closes)."""
        renewal = self._renewal
        if renewal is not None:
            renewal.cancel()
            await asyncio.gather(renewal, return_exceptions=True)

    async def _renew(self) -> None:
        self.lease = await self._leases.leases_for(self._leases.epoch_now())

    def _renewed(self, renewal: asyncio.Future[None]) -> None:
        self._renewal = None
        if not renewal.cancelled():
            renewal.exception()  # retrieved: its callers have it, or have stopped waiting

    async def refresh_loop(self) -> None:
        """The shared leases of every new epoch; then the sessions used in the epoch that ended
        move onto them (reattach_loop)."""
        while True:
            jitter = random.uniform(0, 0.01) * self._leases.epoch_s  # not all replicas at once
            await asyncio.sleep(self._leases.seconds_to_next() + jitter)
            epoch = self._leases.epoch_now()
            lease = await self._lease_of(epoch)
            if lease is None:
                continue  # sessions stay flagged as used; a later epoch's lease catches up
            if lease.ids != self.lease.ids:
                self.previous, self.lease = self.lease, lease
            self.epoch = epoch
            self._wanted.set()

    async def _lease_of(self, epoch: int) -> EpochLeaseSet | None:
        """`epoch`'s leases, retried with backoff while that epoch lasts."""
        backoff = 0.5
        while self._leases.epoch_now() == epoch:
            try:
                lease = await self._leases.leases_for(epoch)
            except EtcdError as exc:
                self._failures.failed("bindings_lease_refresh_failed", exc)
                await asyncio.sleep(min(backoff, max(0.0, self._leases.seconds_to_next())))
                backoff = min(backoff * 2, 10.0)
                continue
            self._failures.ok("bindings_lease_refresh_failed")
            return lease
        return None

    async def reattach_loop(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.reattach_epoch((self.epoch - 1) & 1, self.lease, self.previous)

    async def reattach_epoch(
        self, parity: int, lease: EpochLeaseSet, previous: EpochLeaseSet
    ) -> None:
        """Moves the sessions flagged as used in the epoch that ended (`parity`) and not on
        `lease` or `previous` onto `lease`: scanned in slices, written in batches of
        MAX_TXN_OPS, paced to spread over half an epoch."""
        flag = TOUCHED[parity]
        expected = max(self._touched_since[parity], 1)
        self._touched_since[parity] = 0
        loop = asyncio.get_running_loop()
        started, spread, sent = loop.time(), self._leases.epoch_s / 2, 0
        for pool in self._index.pools():
            keys = self._index.keys(pool)
            if keys:  # replicas start at different places: fewer of them race for one key
                offset = random.randrange(len(keys))
                keys = keys[offset:] + keys[:offset]
            batch: list[tuple[SessionKey, int, int]] = []
            for start in range(0, len(keys), SLICE):
                for key in keys[start:start + SLICE]:
                    packed = self._index.untouch(pool, key, flag)
                    if packed is None or not packed & flag:
                        continue
                    revision, on, newest = revision_of(packed), lease_of(packed), lease.of(key)
                    if revision == 0 or on == newest or on == previous.of(key):
                        continue  # queued (written with the newest lease), or recent enough
                    batch.append((key, revision, newest))
                    if len(batch) == MAX_TXN_OPS:
                        await asyncio.sleep(max(0.0, started + spread * sent / expected
                                                - loop.time()))
                        await self.reattach(pool, batch)
                        sent += len(batch)
                        batch = []
                await asyncio.sleep(0)
            if batch:
                await self.reattach(pool, batch)

    async def reattach(self, pool: str, batch: list[tuple[SessionKey, int, int]]) -> None:
        """One transaction: each session (key, revision, lease) moves to its lease if still at
        the revision seen (a session another replica moved first is left alone); its value is
        kept as stored."""
        puts = [GuardedPut(self._key_of(pool, key), None, lease, revision)
                for key, revision, lease in batch]
        again = TOUCHED[self.epoch & 1]
        try:
            results, revision = await self._client.put_each(puts, read_refused=False)
        except EtcdError as exc:
            for key, _, _ in batch:
                self._index.touch(pool, key, again)  # retried next epoch
            self._failures.failed("bindings_reattach_failed", exc)
            return
        except BaseException:
            for key, _, _ in batch:
                self._index.touch(pool, key, again)  # not lost: the next epoch re-attaches them
            raise
        for (key, _, lease), result in zip(batch, results, strict=True):
            if not result.done:
                continue  # moved or re-attached by someone else: the watch brings it
            self.writes += 1
            packed = self._index.packed(pool, key)
            if packed is not None and revision_of(packed) < revision:
                self._index.put_key(pool, key, self._index.endpoint_of(packed), revision, lease)
        self._failures.ok("bindings_reattach_failed")
