"""The degraded-mode flush: bindings queued while etcd was away (kvgate.bindings.pending) written
in batched transactions, `FLUSH_PARALLEL` in flight, once etcd answers again.

Each queued write is guarded by what it expects etcd to hold (`PendingWrite.expected_revision`):
a peer's binding found there is kept and the queued one dropped; this replica's own try, landed
after it gave up, is replaced by the binding queued since (pending.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace

import structlog

from kvgate.bindings.failures import BackgroundFailures
from kvgate.bindings.index import session_key
from kvgate.bindings.leases import NO_LEASES
from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding
from kvgate.bindings.pending import PendingWrite, PendingWrites
from kvgate.bindings.reattach import Reattachment
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.client import MAX_TXN_OPS, GuardedPut
from kvgate.etcd.errors import EtcdLeaseNotFound

log = structlog.get_logger("kvgate.bindings")

FLUSH_PARALLEL = 8  # batched flush transactions in flight at once
FLUSH_FAILED = "bindings_flush_failed"


@dataclass(eq=False)  # one per store: compared by identity
class PendingFlush:
    """Flushes `pending` to etcd when asked (`wanted`), retrying every `interval` seconds while
    etcd is away. `degraded`: whether the store counts etcd as away (etcd is probed first);
    `recovered`: told once a flush empties the queue after that."""

    client: EtcdClient
    pending: PendingWrites
    bindings: BindingMirror
    reattachment: Reattachment
    failures: BackgroundFailures
    _: KW_ONLY
    interval: float
    degraded: Callable[[], bool]
    recovered: Callable[[], None]
    wanted: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    writes: int = field(default=0, init=False)  # bindings flushed to etcd

    async def run(self) -> None:
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            try:
                await self.flush()
            except EtcdError as exc:
                self.failures.failed(FLUSH_FAILED, exc)
                self.wanted.set()
                await asyncio.sleep(self.interval)
            except BaseException:
                self.wanted.set()  # the restarted loop flushes what is left
                raise

    async def flush(self) -> None:
        if self.degraded():
            await self.client.get(self.bindings.prefix)  # raises while etcd is still away
        if self.pending and self.reattachment.lease is NO_LEASES:
            await self.reattachment.renew()  # etcd was away since the start
        while self.pending:
            ops = self.pending.oldest(MAX_TXN_OPS * FLUSH_PARALLEL)
            batches = [ops[i:i + MAX_TXN_OPS] for i in range(0, len(ops), MAX_TXN_OPS)]
            results = await asyncio.gather(*(self._batch(b) for b in batches),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        if self.degraded():
            self.recovered()
            self.failures.forget(FLUSH_FAILED)
            log.info("etcd_recovered", flushed=True)
        self.failures.ok(FLUSH_FAILED)

    async def _batch(self, ops: list[PendingWrite]) -> None:
        def puts() -> list[GuardedPut]:
            prefix, lease = self.bindings.prefix, self.reattachment.lease
            return [GuardedPut(prefix + op.binding.key.encode(), op.binding.encode(),
                               lease.of(session_key(op.binding.session)),
                               op.expected_revision) for op in ops]

        try:
            results, _ = await self.client.put_each(puts())
        except EtcdLeaseNotFound:
            await self.reattachment.renew()
            results, _ = await self.client.put_each(puts())
        for op, result in zip(ops, results, strict=True):
            current = result.current
            if current is None:  # replacing a binding that expired meanwhile: create it
                self.pending.retry_as_create(op)
                continue
            if result.done:  # etcd holds what was sent
                self.writes += 1
                stored = replace(op.binding, revision=current.mod_revision)
            else:
                stored = Binding.decode(op.binding.key, current.value, current.mod_revision)
                if (stored.endpoint != op.binding.endpoint
                        and self.pending.landed_try(op, current.value)):
                    # Its own try landed late: the queued binding, answered from since, stands.
                    self.pending.replace_landed(op, current.mod_revision)
                    log.info("binding_late_write_replaced", binding=op.binding.key,
                             landed=stored.endpoint, kept=op.binding.endpoint)
                    continue
            self.pending.written(op, current.mod_revision)
            if op.binding.key not in self.pending:
                self.bindings.put(stored, current.lease)
            if stored.endpoint != op.binding.endpoint:
                log.info("binding_reconciled", binding=op.binding.key, kept=stored.endpoint,
                         dropped=op.binding.endpoint)
