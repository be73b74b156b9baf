"""When a replica places new sessions on Envoy's ring for a moment although it is not degraded
(kvgate/bindings/etcd.py ``RING_AFTER_RECOVERY_S``): after its copy of the bindings was listed
again, and after one of its own writes did not land. A peer may hold placements etcd has not
seen yet then; placed by load, such a session moves once when the peer's write lands (issue 41,
item 3: sessions answered by two engines under leader kills)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from kvgate.bindings.etcd import RING_AFTER_RECOVERY_S, EtcdBindingStore
from kvgate.bindings.model import Binding
from kvgate.bindings.pending import PendingWrite
from kvgate.etcd import EtcdClient
from kvgate.etcd.errors import EtcdDeadline
from kvgate.runtime.tasks.supervisor import Supervisor


@pytest.fixture
async def store() -> AsyncIterator[EtcdBindingStore]:
    client = EtcdClient(["127.0.0.1:1"])  # never called: the tests drive the store alone
    try:
        yield EtcdBindingStore(client, "/kvgate/t/", 60.0, write_limit_s=0.01,
                               write_budget_s=0.02,
                               supervisor=Supervisor("t", CollectorRegistry()))
    finally:
        await client.close()


async def _list(store: EtcdBindingStore) -> None:
    store.begin_listing()
    store.listed([])
    await store.end_listing(7)


async def test_the_first_listing_keeps_placement_by_load(store: EtcdBindingStore) -> None:
    await _list(store)
    assert not store.places_on_ring


async def test_a_copy_listed_again_places_on_the_ring_for_a_moment(
        store: EtcdBindingStore) -> None:
    """Its watch was lost (the leader it watched through was killed): it stepped aside with no
    write failing, so no degraded spell started the window."""
    store.mirror.relists = 1
    await _list(store)
    assert store.places_on_ring and not store.degraded
    store._recovered_at = time.monotonic() - RING_AFTER_RECOVERY_S
    assert not store.places_on_ring


async def test_a_write_that_did_not_land_places_on_the_ring_for_a_moment(
        store: EtcdBindingStore) -> None:
    """Both tries missed their deadline (an election): queued, not degraded (one slow write)."""
    async def no_leader(op: PendingWrite, limit_s: float | None = None) -> Binding:
        raise EtcdDeadline("no leader yet", operation="Txn")

    store._commit = no_leader  # type: ignore[method-assign]
    queued = await store.create(Binding("s", "p", "10.0.0.1:8000"))
    assert queued.revision == 0 and store.pending == 1
    assert store.places_on_ring and not store.degraded
