"""Write economy: sessions used through three replicas at once are rewritten at most once per
epoch (one lease per epoch shared by every replica, re-attachment by compare-and-set), counted
in etcd itself. A real etcd, epochs of one second."""

from __future__ import annotations

import asyncio
from collections import Counter

from prometheus_client import CollectorRegistry

from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.index import session_key
from kvgate.etcd import EtcdClient
from kvgate.runtime.supervisor import Supervisor
from tests.scale.scale_helpers import A, B, bind, sessions
from tests.support.polling import eventually

IDLE_TTL = 4.0  # an epoch (idle_ttl / 4) per second
EPOCHS = 5


async def test_three_replicas_rewrite_a_used_session_at_most_once_per_epoch(
    etcd, prefix: str
) -> None:
    clients = [EtcdClient([etcd.endpoint]) for _ in range(4)]
    watcher = clients[3]
    replicas = [EtcdBindingStore(c, prefix, IDLE_TTL, write_limit_s=2.0,
                                 supervisor=Supervisor("ext_proc", CollectorRegistry()))
                for c in clients[:3]]
    names = sessions(300)
    rewrites: Counter[bytes] = Counter()
    stop = asyncio.Event()
    try:
        for replica in replicas:
            await replica.start()
        leases = replicas[0].epoch_leases  # as the replicas write them: on the epoch's leases
        await bind(watcher, prefix, names, lambda b: leases.of(session_key(b.session)))
        await eventually(lambda: all(len(r) == len(names) for r in replicas))
        _, start = await watcher.get_prefix(f"{prefix}bindings/".encode())

        async def count() -> None:
            async for events, _ in watcher.watch_prefix(f"{prefix}bindings/".encode(), start + 1):
                for event in events:
                    if not event.deleted:
                        rewrites[event.kv.key] += 1

        async def use(replica: EtcdBindingStore) -> None:  # every session, through every replica
            while not stop.is_set():
                for name in names:
                    binding = replica.get("coder", name)
                    if binding is not None:
                        replica.touch(binding)
                await asyncio.sleep(0.1)

        counting = asyncio.create_task(count())
        users = [asyncio.create_task(use(r)) for r in replicas]
        await asyncio.sleep(EPOCHS * IDLE_TTL / 4)  # let the epochs pass: this is the measurement
        stop.set()
        await asyncio.gather(*users)
        counting.cancel()
        per_session_per_epoch = sum(rewrites.values()) / len(names) / EPOCHS
        print(f"rewrites per used session per epoch, 3 replicas: {per_session_per_epoch:.2f}")
        assert per_session_per_epoch <= 1.1, (per_session_per_epoch, max(rewrites.values()))
        assert rewrites and len(rewrites) == len(names)  # yet every used session was kept alive
        for replica in replicas:  # all still held, none expired
            assert len(replica) == len(names)
        assert all(b.endpoint in (A, B) for b in replicas[0].bindings())
    finally:
        stop.set()
        for replica in replicas:
            await replica.close()
        for client in clients:
            await client.close()
