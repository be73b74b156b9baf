"""The scale benchmark's measurements made with binding stores in this process (the same code
ext_proc runs): the degraded-mode flush rate after an etcd stall, and etcd writes per active
session per epoch with 1 and 3 replicas."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

from prometheus_client import CollectorRegistry

from bench.scale.measure import until
from kvgate.bindings.bulk import write_bindings
from kvgate.bindings.etcd import DEFAULT_MAX_PENDING, EtcdBindingStore
from kvgate.bindings.index import session_key
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.runtime.tasks.supervisor import Supervisor


class _Replica:
    """A binding store on its own etcd client, as in one ext_proc process."""

    def __init__(self, endpoint: str, prefix: str, idle_ttl: float, *, write_limit_s: float,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.client = EtcdClient([endpoint])
        self.store = EtcdBindingStore(self.client, prefix, idle_ttl,
                                      supervisor=Supervisor("ext_proc", CollectorRegistry()),
                                      write_limit_s=write_limit_s, max_pending=max_pending)

    async def close(self) -> None:
        await self.store.close()
        await self.client.close()


async def flush_rate(endpoint: str, etcd_pid: int, prefix: str, count: int) -> dict[str, float]:
    """etcd stops answering (SIGSTOP) while `count` new sessions arrive: every binding is queued
    (the queue holds them all); etcd comes back: how fast the batched flush writes them."""
    replica = _Replica(endpoint, prefix, 3600, max_pending=count + 10, write_limit_s=0.1)
    store = replica.store
    await store.start()
    try:
        os.kill(etcd_pid, signal.SIGSTOP)
        try:
            for i in range(count):
                await store.create(Binding(f"flush-{i}", "bench", "10.0.0.1:8000"))
            queued = store.pending
        finally:
            os.kill(etcd_pid, signal.SIGCONT)
        started = time.perf_counter()
        await until(lambda: not (store.pending or store.degraded), 0.01)
        seconds = time.perf_counter() - started
    finally:
        await replica.close()
    return {"queued": queued, "flush_s": seconds, "bindings_per_s": queued / seconds}


async def writes_per_epoch(endpoint: str, prefix: str, replicas: int, sessions: int,
                           epochs: int = 5, idle_ttl: float = 8.0) -> dict[str, float]:
    """`sessions` sessions in use through every one of `replicas` stores (each touches each
    session every 0.1 s) for `epochs` epochs; etcd's own count of rewrites per session per
    epoch (creation not counted)."""
    made = [_Replica(endpoint, prefix, idle_ttl, write_limit_s=2.0) for _ in range(replicas)]
    stores = [r.store for r in made]
    watcher = EtcdClient([endpoint])
    names = [f"{i:08x}-0000-4000-8000-{i * 7919:012x}" for i in range(sessions)]
    rewrites: Counter[bytes] = Counter()
    stop = asyncio.Event()
    try:
        for store in stores:
            await store.start()
        leases = stores[0].epoch_leases
        await write_bindings(watcher, prefix, (Binding(s, "bench", "10.0.0.1:8000")
                                               for s in names),
                             lambda b: leases.of(session_key(b.session)))
        await until(lambda: all(len(s) == sessions for s in stores))
        _, start = await watcher.get_prefix(f"{prefix}bindings/".encode())

        async def count() -> None:
            async for events, _ in watcher.watch_prefix(f"{prefix}bindings/".encode(), start + 1):
                for event in events:
                    if not event.deleted:
                        rewrites[event.kv.key] += 1

        async def use(store: EtcdBindingStore) -> None:
            while not stop.is_set():
                for name in names:
                    binding = store.get("bench", name)
                    if binding is not None:
                        store.touch(binding)
                await asyncio.sleep(0.1)

        counting = asyncio.create_task(count())
        users = [asyncio.create_task(use(s)) for s in stores]
        await asyncio.sleep(epochs * idle_ttl / 4)  # the measurement window
        stop.set()
        await asyncio.gather(*users)
        counting.cancel()
        held = min(len(s) for s in stores)
    finally:
        stop.set()
        for replica in made:
            await replica.close()
        await watcher.close()
    return {"replicas": replicas, "sessions": sessions, "epochs": epochs,
            "writes_per_session_per_epoch": sum(rewrites.values()) / sessions / epochs,
            "sessions_rewritten": len(rewrites), "still_held": held}
