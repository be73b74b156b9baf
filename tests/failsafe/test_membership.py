"""Who writes endpoint membership, and how: compare-and-set under a generation key, so a
concurrent drain survives and a replica started with a stale file overwrites nothing.
A real etcd throughout."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import kvgate.endpoints.membership as membership
from kvgate.config import Config
from kvgate.config.dump import to_dict
from kvgate.config.load import load_text
from kvgate.endpoints import EndpointRecords, MembershipConflict, sync_membership
from kvgate.endpoints.membership import read_membership
from kvgate.endpoints.records import endpoints_prefix
from kvgate.etcd import EtcdClient, KeyValue
from tests.failsafe.failsafe_helpers import (
    control_plane_config,
    running_control_plane,
    with_endpoints,
    write_config,
)
from tests.support.polling import eventually
from tests.support.ports import free_ports

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


class DrainsWhileWriting(EtcdClient):
    """Drains A right after the membership writer has read the records: the classic race."""

    def __init__(self, endpoint: str, prefix: str) -> None:
        super().__init__([endpoint])
        self._prefix = prefix
        self.drained = False

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        found = await super().get_prefix(prefix)
        if prefix == endpoints_prefix(self._prefix) and not self.drained:
            self.drained = True
            records = EndpointRecords(self, self._prefix)
            await records.update("coder", A, lambda r: replace(r, admin="draining"))
        return found


async def _states(client: EtcdClient, prefix: str) -> dict[str, str]:
    return {r.address: r.admin for r in await EndpointRecords(client, prefix).list()}


async def test_a_concurrent_drain_survives_a_membership_write(etcd, prefix: str) -> None:
    config = control_plane_config([A, B], etcd.endpoint, prefix)
    client = DrainsWhileWriting(etcd.endpoint, prefix)
    try:
        client.drained = True  # not while writing the first membership
        await sync_membership(client, config, "first", claim=False)
        client.drained = False
        # The new file changes A's own record (its weight) while an operator drains A.
        newer = with_endpoints(config, [{"address": A, "weight": 2}, B, C])
        state = await sync_membership(client, newer, "reloaded", claim=True)
        assert client.drained and state.in_sync and state.stored is not None
        assert state.stored.generation == 2 and state.stored.by == "reloaded"
        assert await _states(client, prefix) == {A: "draining", B: "active", C: "active"}
        [record] = [r for r in await EndpointRecords(client, prefix).list() if r.address == A]
        assert record.weight == 2
    finally:
        await client.close()


async def test_a_start_never_overwrites_a_different_membership_a_reload_does(
    etcd, prefix: str
) -> None:
    client = EtcdClient([etcd.endpoint])
    try:
        old = control_plane_config([A, B], etcd.endpoint, prefix)
        new = with_endpoints(old, [A, B, C])
        first = await sync_membership(client, old, "one", claim=False)  # the first ever: writes
        assert first.in_sync and first.stored is not None and first.stored.generation == 1
        reloaded = await sync_membership(client, new, "two", claim=True)
        assert reloaded.stored is not None and reloaded.stored.generation == 2
        stale = await sync_membership(client, old, "three", claim=False)  # started, stale file
        assert not stale.in_sync and stale.changed == 0
        assert set(await _states(client, prefix)) == {A, B, C}
        again = await sync_membership(client, new, "four", claim=False)  # same file: nothing
        assert again.in_sync and again.changed == 0 and again.stored == reloaded.stored
    finally:
        await client.close()


async def test_a_newer_generation_written_meanwhile_is_never_overwritten(
    etcd, prefix: str
) -> None:
    client = EtcdClient([etcd.endpoint])
    config = control_plane_config([A, B], etcd.endpoint, prefix)
    await sync_membership(client, config, "one", claim=False)

    class Overtaken(EtcdClient):
        """Another replica reloads between this writer's read and its transaction."""

        async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
            found = await super().get_prefix(prefix)
            await sync_membership(client, with_endpoints(config, [A, C]), "other", claim=True)
            return found

    slow = Overtaken([etcd.endpoint])
    try:
        with pytest.raises(MembershipConflict, match="other wrote membership generation 2"):
            await sync_membership(slow, with_endpoints(config, [B, C]), "slow", claim=True)
        stored = await read_membership(client, prefix)
        assert stored is not None and stored.by == "other" and stored.generation == 2
        assert set(await _states(client, prefix)) == {A, C}
    finally:
        await slow.close()
        await client.close()


async def test_a_large_membership_is_written_in_guarded_chunks(
    etcd, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(membership, "CHUNK", 3)
    endpoints = [f"10.0.1.{i}:8000" for i in range(1, 11)]
    client = EtcdClient([etcd.endpoint])
    try:
        config = control_plane_config(endpoints, etcd.endpoint, prefix)
        state = await sync_membership(client, config, "one", claim=False)
        assert state.changed == 10 and set(await _states(client, prefix)) == set(endpoints)
        fewer = await sync_membership(client, with_endpoints(config, endpoints[:4]), "two",
                                      claim=True)
        assert fewer.changed == 6 and set(await _states(client, prefix)) == set(endpoints[:4])
    finally:
        await client.close()


def _second_replica(config: Config) -> Config:
    data = to_dict(config)
    xds, admin = free_ports(2)
    data["control_plane"] = {"xds": f"127.0.0.1:{xds}", "admin": f"127.0.0.1:{admin}"}
    return load_text(yaml.safe_dump(data))


async def test_a_replica_started_with_a_stale_file_writes_nothing_until_reloaded(
    etcd, prefix: str, tmp_path: Path, upstreams
) -> None:
    a, b, c = (u.address for u in await upstreams(3))
    old = control_plane_config([a, b], etcd.endpoint, prefix)
    new = with_endpoints(old, [a, b, c])
    client = EtcdClient([etcd.endpoint])
    first_path = write_config(tmp_path / "first.yaml", old)
    # Reloads only when this test asks, so each is the operator's one act.
    async with running_control_plane(old, first_path, identity="first",
                                     watch_file=False) as first:
        write_config(first_path, new)
        assert await first.reload()  # the operator updates the first replica's file
        assert set(await _states(client, prefix)) == {a, b, c}
        stale = _second_replica(old)
        second_path = write_config(tmp_path / "second.yaml", stale)
        async with running_control_plane(stale, second_path, identity="second",
                                         watch_file=False) as second:
            assert set(await _states(client, prefix)) == {a, b, c}  # nothing overwritten
            warning = second.status().membership_warning
            assert warning is not None and "written by first" in warning
            assert first.status().membership_warning is None
            assert second.status().membership_generation == 2
            assert c in second.directory.states()["coder"]  # it serves etcd's membership
            # A reload is the operator's word that this file is now the newest.
            assert await second.reload()
            assert set(await _states(client, prefix)) == {a, b}
            await eventually(lambda: first.status().membership_warning is not None)
            assert second.status().membership_warning is None
            assert second.status().membership_generation == 3
    await client.close()
