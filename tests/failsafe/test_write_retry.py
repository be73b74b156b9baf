"""A binding write whose etcd member stops answering is tried once more, on the next member,
within the write's budget: the request is answered from a binding the other replicas can read,
not from a queued one (which let a peer place the session's next turn elsewhere: docs/faults.md,
one replica's slow write). A move that may as well not happen (the load gate's) and cannot be
stored is not made at all. Real etcd; its members are behind proxies the test cuts."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.leases import EpochLeaseSet
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import eventually

WRITE_LIMIT_S = 0.2  # each try's deadline
WRITE_BUDGET_S = 5.0  # both tries; generous for a busy machine, the test waits on no clock


async def _written_across_a_cut(etcd, prefix: str, budget_s: float | None) -> tuple[
        Binding, EtcdBindingStore]:
    async with FaultProxy(etcd.endpoint) as proxy:
        # The same etcd twice: through the proxy first (the member that goes silent), then direct.
        client = EtcdClient([proxy.address, etcd.endpoint])
        store = EtcdBindingStore(client, prefix, 3600, supervisor=Supervisor(
            "ext_proc", CollectorRegistry()), write_limit_s=WRITE_LIMIT_S,
            write_budget_s=budget_s)
        try:
            await store.start()
            assert store.synced and client.endpoint == proxy.address
            proxy.cut()  # holds every byte: the write misses its deadline
            stored = await store.create(Binding("s", "p", "10.0.0.1:1"))
            return stored, store
        finally:
            await store.close()
            await client.close()


async def test_a_write_past_its_deadline_is_tried_again_on_the_next_member(
    etcd, prefix: str
) -> None:
    stored, store = await _written_across_a_cut(etcd, prefix, WRITE_BUDGET_S)
    assert stored.revision > 0, "answered from a queued binding the other replicas cannot read"
    assert store.pending == 0 and not store.degraded
    reader = EtcdClient([etcd.endpoint])
    try:
        kv = await reader.get(f"{prefix}bindings/p/s".encode())
    finally:
        await reader.close()
    assert kv is not None and kv.mod_revision == stored.revision


async def test_without_a_budget_the_slow_write_is_queued(etcd, prefix: str) -> None:
    stored, store = await _written_across_a_cut(etcd, prefix, None)
    assert stored.revision == 0 and store.pending == 1


async def test_an_optional_move_that_cannot_be_stored_is_not_made(etcd, prefix: str) -> None:
    async with FaultProxy(etcd.endpoint) as proxy:
        client = EtcdClient([proxy.address])  # one member, silent once cut: both tries miss
        store = EtcdBindingStore(client, prefix, 3600, supervisor=Supervisor(
            "ext_proc", CollectorRegistry()), write_limit_s=WRITE_LIMIT_S,
            write_budget_s=2 * WRITE_LIMIT_S)
        try:
            await store.start()
            bound = await store.create(Binding("s", "p", "10.0.0.1:1"))
            assert bound.revision > 0
            proxy.cut()
            kept = await store.move(bound, "10.0.0.2:1", optional=True)
            assert kept == bound and store.get("p", "s") == bound and store.pending == 0
            queued = await store.move(bound, "10.0.0.2:1")  # a move that must happen is queued
            assert (queued.endpoint, queued.revision, store.pending) == ("10.0.0.2:1", 0, 1)
        finally:
            await store.close()
            await client.close()


async def test_a_lease_renewal_on_a_write_waits_no_longer_than_the_writes_budget(
    etcd, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch's leases expired (revoked here): a write renews them within its own deadline
    and budget. A renewal etcd does not answer (held here until released) no longer holds the
    answer (its calls took 2 s each, past Envoy's message_timeout): the writes are queued,
    share the one renewal, and reach etcd once it is done."""
    client = EtcdClient([etcd.endpoint])
    store = EtcdBindingStore(client, prefix, 3600, supervisor=Supervisor(
        "ext_proc", CollectorRegistry()), write_limit_s=WRITE_LIMIT_S,
        write_budget_s=2 * WRITE_LIMIT_S)
    leases = store.reattachment._leases
    granting, release = [], asyncio.Event()
    granted = leases.leases_for

    async def held(epoch: int) -> EpochLeaseSet:
        granting.append(epoch)
        await release.wait()
        return await granted(epoch)

    try:
        await store.start()
        for lease in set(store.epoch_leases.ids):
            await client.revoke_lease(lease)
        monkeypatch.setattr(leases, "leases_for", held)
        # A liveness guard, not a timing: before the fix these waited for the renewal forever.
        stored = await asyncio.wait_for(asyncio.gather(
            store.create(Binding("s1", "p", "10.0.0.1:1")),
            store.create(Binding("s2", "p", "10.0.0.1:1"))), 60)
        assert [s.revision for s in stored] == [0, 0] and store.pending == 2
        assert len(granting) == 1, "each write granted the epoch's leases again"
        release.set()
        await eventually(lambda: store.pending == 0, within=30)
        assert {s: b.revision > 0 for s in ("s1", "s2")
                if (b := store.get("p", s)) is not None} == {"s1": True, "s2": True}
    finally:
        release.set()
        await store.close()
        await client.close()
