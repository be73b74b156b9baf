"""Writing many bindings at once (MAX_TXN_OPS per transaction): for benchmarks, tests and
imports, not for the hot path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.etcd.client import MAX_TXN_OPS, GuardedPut


async def write_bindings(
    client: EtcdClient, prefix: str, bindings: Iterable[Binding],
    lease: int | Callable[[Binding], int] = 0, parallel: int = 4,
) -> int:
    """Creates each binding unless it exists (create-if-absent, like ext_proc), on `lease` (or
    the lease it returns for the binding), `parallel` transactions in flight; returns how many
    were created."""
    base = f"{prefix}bindings/"
    created = 0
    batch: list[GuardedPut] = []
    inflight: set[asyncio.Task[int]] = set()

    async def send(puts: list[GuardedPut]) -> int:
        results, _ = await client.put_each(puts)
        return sum(1 for r in results if r.done)

    for binding in bindings:
        on = lease(binding) if callable(lease) else lease
        batch.append(GuardedPut(f"{base}{binding.key}".encode(), binding.encode(), on, 0))
        if len(batch) == MAX_TXN_OPS:
            inflight.add(asyncio.ensure_future(send(batch)))
            batch = []
            if len(inflight) >= parallel:
                done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                created += sum(task.result() for task in done)
    if batch:
        inflight.add(asyncio.ensure_future(send(batch)))
    for task in inflight:
        created += await task
    return created
