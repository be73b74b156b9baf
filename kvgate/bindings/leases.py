"""Leases per epoch, shared by every ext_proc replica, in SHARDS shards.

Epochs are numbered from the wall clock (`unix time // epoch`), so replicas agree on them
without talking. The first replica to need epoch N's leases grants them and records them under
`{prefix}leases/{N}/{shard}` (create-if-absent, each key attached to its own lease, so it goes
when the lease does); the others read them there. A session is therefore re-attached at most
once per epoch whichever replicas serve it: once one replica has moved it to the newest lease,
the others see that lease in their mirror and leave it.

Why shards: every binding on a lease is deleted in one etcd revision when the lease expires, and
etcd sends a revision to a watcher as one message. At a million sessions one lease per epoch
would make messages of tens of MB (and etcd splits a message above ~2 MiB into fragments in
time quadratic in its events: 37 s for one 2 MiB fragment of deletes, measured); 64 shards keep
every expiry under ~600 KB even when half a million sessions go idle together. Their TTLs are
spread over half an epoch, so they expire one after another and a watcher is never sent
several of them in one message.
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from collections.abc import Callable, Sequence

from kvgate.bindings.index import SessionKey
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.client import GuardedPut

SHARDS = 64


def shard_of(key: SessionKey) -> int:
    """The same shard on every replica (a UUID's low bits are random enough)."""
    if isinstance(key, int):
        return key & (SHARDS - 1)
    return zlib.crc32(key.encode()) & (SHARDS - 1)


class EpochLeaseSet:
    """One epoch's leases, one per shard."""

    def __init__(self, epoch: int, ids: Sequence[int]) -> None:
        self.epoch = epoch
        self.ids = tuple(ids)

    def of(self, key: SessionKey) -> int:
        return self.ids[shard_of(key)]

    def __contains__(self, lease: object) -> bool:
        return lease in self.ids


NO_LEASES = EpochLeaseSet(-1, (0,) * SHARDS)


class EpochLeases:
    def __init__(
        self, client: EtcdClient, prefix: str, epoch_s: float, ttl: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._keys = f"{prefix}leases/"
        self.epoch_s = epoch_s
        self._ttl = ttl
        self._clock = clock

    def epoch_now(self) -> int:
        return int(self._clock() // self.epoch_s)

    def seconds_to_next(self) -> float:
        return (self.epoch_now() + 1) * self.epoch_s - self._clock()

    def ttl(self, shard: int) -> int:
        """A shard's lease TTL: the base, plus its share of half an epoch."""
        return self._ttl + math.ceil(shard * self.epoch_s / 2 / SHARDS)

    def _key(self, epoch: int, shard: int) -> bytes:
        return f"{self._keys}{epoch}/{shard:02d}".encode()

    async def leases_for(self, epoch: int) -> EpochLeaseSet:
        """`epoch`'s leases: those recorded, and new ones for the shards not recorded yet (a
        concurrent replica's records win; ours are then revoked)."""
        kvs, _ = await self._client.get_prefix(f"{self._keys}{epoch}/".encode())
        ids = [0] * SHARDS
        for kv in kvs:
            name = kv.key.rsplit(b"/", 1)[-1]
            if name.isdigit() and int(name) < SHARDS and kv.lease:
                ids[int(name)] = kv.lease
        missing = [shard for shard, lease in enumerate(ids) if not lease]
        if not missing:
            return EpochLeaseSet(epoch, ids)
        granted = await asyncio.gather(*(self._client.grant_lease(self.ttl(s)) for s in missing))
        results, _ = await self._client.put_each([
            GuardedPut(self._key(epoch, shard), str(lease).encode(), lease, 0)
            for shard, lease in zip(missing, granted, strict=True)
        ])
        unused = []
        for shard, lease, result in zip(missing, granted, results, strict=True):
            if result.done or result.current is None or not result.current.lease:
                ids[shard] = lease
            else:
                ids[shard] = result.current.lease  # another replica's came first
                unused.append(lease)
        for lease in unused:
            try:
                await self._client.revoke_lease(lease)
            except EtcdError:
                break  # unused, they expire by themselves
        return EpochLeaseSet(epoch, ids)
