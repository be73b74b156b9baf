"""A control-plane leader deposed unawares (its lease gone during a pause or a partition, a
follower leading since) cannot act: its health verdicts and failover moves carry a fence (its
election key still on its lease), and a real etcd refuses them. The new leader's go through; the
old one steps down at its next round."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from control_plane.leader import LeaderElection
from kvgate.endpoints.records import EndpointRecord, record_key
from kvgate.endpoints.store import EndpointRecords
from kvgate.etcd import EtcdClient
from kvgate.etcd.client import GuardedPut
from kvgate.etcd.errors import EtcdFenced

ADDRESS = "10.0.0.1:8000"


@pytest.fixture
async def client(etcd) -> AsyncIterator[EtcdClient]:
    made = EtcdClient([etcd.endpoint])
    yield made
    await made.close()


async def test_a_deposed_leaders_writes_are_refused_and_the_new_leaders_land(
        client: EtcdClient, prefix: str) -> None:
    key = f"{prefix}leader".encode()
    old, new = LeaderElection(client, key, "cp-old"), LeaderElection(client, key, "cp-new")
    await old._round()
    await new._round()
    assert (old.leading, new.leading, new.leader) == (True, False, "cp-old")
    fence = old.fence()
    assert fence is not None and new.fence() is None

    # Its lease runs out while it is paused (revoked here, as etcd's expiry would), and the
    # follower takes over; the old leader has not run a round since, so it still thinks it leads.
    await client.revoke_lease(fence.lease)
    await new._round()
    assert new.leading and old.leading

    records = EndpointRecords(client, prefix)
    record_at = record_key(prefix, "p", ADDRESS)
    await client.put(record_at, EndpointRecord("p", ADDRESS, "kv").encode())
    with pytest.raises(EtcdFenced):
        await records.update("p", ADDRESS, lambda r: replace(r, healthy=False), fence=fence)
    stored = await client.get(record_at)
    assert stored is not None and EndpointRecord.decode("p", ADDRESS, stored.value).healthy

    binding_at = f"{prefix}bindings/p/s".encode()
    with pytest.raises(EtcdFenced):  # a failover move: the whole batch refused
        await client.put_each([GuardedPut(binding_at, b'{"endpoint": "x"}', 0, 0)],
                              read_refused=False, fence=fence)
    assert await client.get(binding_at) is None

    # The new leader's own verdict and move go through under its fence.
    updated = await records.update("p", ADDRESS, lambda r: replace(r, healthy=False),
                                   fence=new.fence())
    assert not updated.healthy
    results, _ = await client.put_each([GuardedPut(binding_at, b'{"endpoint": "x"}', 0, 0)],
                                       read_refused=False, fence=new.fence())
    assert results[0].done

    await old._round()  # its keep-alive finds the lease gone: it steps down and follows
    assert (old.leading, old.leader, old.fence()) == (False, "cp-new", None)
