"""Reads and watches that scale, reproduced small (tests/scale/scale_helpers.py): a prefix
larger than any reply the client accepts is read in pages; a lease expiring thousands of
bindings at once is applied while decisions keep flowing, and when one revision is more than
the watch can carry, the mirror says why, relists in pages and resumes; a mirror that lost its
watch drops what went meanwhile (no phantoms)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.index import session_key
from kvgate.bindings.leases import EpochLeases
from kvgate.config import load_text
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, EtcdUnavailable
from kvgate.etcd.mirror import MirrorState
from kvgate.etcd.observed import MirrorMetrics
from kvgate.routing import Outcome, Pipeline
from tests.scale.scale_helpers import (
    LISTED_S,
    SMALL_MESSAGE,
    A,
    B,
    bind,
    keys_in_etcd,
    sessions,
    small_client,
    store_for,
)
from tests.support.polling import eventually

COUNT = 4000  # ~600 KB as one Range reply, ~330 KB of delete events in one revision


@pytest.fixture
async def writer(etcd) -> AsyncIterator[EtcdClient]:
    client = EtcdClient([etcd.endpoint])
    yield client
    await client.close()


async def test_a_prefix_larger_than_any_reply_is_read_in_pages(
    etcd, writer: EtcdClient, prefix: str
) -> None:
    reader = small_client(etcd.endpoint)
    try:
        await bind(writer, prefix, sessions(COUNT))
        kvs, revision = await reader.get_prefix(f"{prefix}bindings/".encode())
        assert sum(len(kv.key) + len(kv.value) for kv in kvs) > SMALL_MESSAGE  # one reply: refused
        assert [kv.key for kv in kvs] == sorted({kv.key for kv in kvs}) and len(kvs) == COUNT
        assert revision == max(kv.mod_revision for kv in kvs)
        assert await reader.count_prefix(f"{prefix}bindings/".encode()) == COUNT
    finally:
        await reader.close()


class Probe:
    """Decisions every 2 ms on a replica's store, for known sessions and new ones."""

    def __init__(self, store: EtcdBindingStore, known: list[str]) -> None:
        config = load_text(f"pools: [{{name: coder, endpoints: [{A}, {B}]}}]\n")
        self._decider = Pipeline(store, EndpointDirectory(config), 1.25)
        self._known = known
        self.outcomes: list[Outcome] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> Probe:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    async def stopped(self) -> list[Outcome]:
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.outcomes

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            raw = self._known[i % len(self._known)] if i % 2 else f"new-{i}"
            self.outcomes.append((await self._decider.decide("coder", raw.encode())).outcome)
            i += 1
            await asyncio.sleep(0.002)


async def _converged(store: EtcdBindingStore, writer: EtcdClient, prefix: str) -> bool:
    held = {f"coder/{b.session}" for b in store.bindings()}
    return held == await keys_in_etcd(writer, prefix)


async def test_its_own_leases_expiring_thousands_of_sessions_are_applied_while_deciding(
    etcd, writer: EtcdClient, prefix: str
) -> None:
    # As ext_proc writes them: each session on its shard's lease of the epoch.
    leases = await EpochLeases(writer, prefix, 900, 3600).leases_for(1)
    names = sessions(COUNT)
    await bind(writer, prefix, names, lambda b: leases.of(session_key(b.session)))
    client = small_client(etcd.endpoint)
    store = store_for(client, prefix)
    try:
        await store.start(sync_timeout=LISTED_S)
        assert len(store) == COUNT
        with Probe(store, names[:50]) as probe, capture_logs() as logs:
            await eventually(lambda: len(probe.outcomes) > 20)
            before = len(probe.outcomes)
            # The epoch's leases expire (every session idle), one shard after the other as
            # their spread TTLs make them.
            for lease in leases.ids:
                await writer.revoke_lease(lease)
                await eventually(lambda: _converged(store, writer, prefix), within=20)
            outcomes = await probe.stopped()
        assert len(outcomes) > before  # decisions went on while the deletes were applied
        assert Outcome.ERROR not in outcomes and Outcome.UNBOUND not in outcomes
        assert len(store) < COUNT and store.synced
        assert store.mirror.relists == 0, [e for e in logs if e["event"] == "etcd_mirror_lost"]
    finally:
        await store.close()
        await client.close()


async def test_a_revision_larger_than_the_watch_can_carry_is_relisted_and_resumed(
    etcd, writer: EtcdClient, prefix: str
) -> None:
    lease = await writer.grant_lease(3600)  # one lease for all, as before leases were sharded
    names = sessions(COUNT)
    await bind(writer, prefix, names, lease)
    client = small_client(etcd.endpoint)
    store = store_for(client, prefix)
    try:
        await store.start(sync_timeout=LISTED_S)
        assert store.synced and len(store) == COUNT
        with Probe(store, names[:50]) as probe, capture_logs() as logs:
            await eventually(lambda: len(probe.outcomes) > 20)
            before = len(probe.outcomes)
            await writer.revoke_lease(lease)  # 4,000 deletes in one revision: one message
            await eventually(lambda: store.mirror.relists == 1 and store.synced, within=20)
            await eventually(lambda: _converged(store, writer, prefix), within=20)
            outcomes = await probe.stopped()
        assert len(outcomes) > before
        assert Outcome.ERROR not in outcomes and Outcome.UNBOUND not in outcomes
        lost = [e for e in logs if e["event"] == "etcd_mirror_lost"]
        assert lost and lost[0]["kind"] == "too_large", lost  # the real reason, named
        assert "larger than max" in lost[0]["error"]
    finally:
        await store.close()
        await client.close()


async def test_a_mirror_that_lost_its_watch_relists_and_drops_what_went_meanwhile(
    etcd, writer: EtcdClient, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed_lease = await writer.grant_lease(3600)
    await bind(writer, prefix, sessions(2000, "keep"))
    await bind(writer, prefix, sessions(1000, "doomed"), doomed_lease)
    client = small_client(etcd.endpoint)
    registry = CollectorRegistry()
    store = store_for(client, prefix, registry)
    MirrorMetrics("ext_proc", registry).track(store.mirror)
    original = client.watch_prefix
    released = asyncio.Event()
    calls = 0

    async def lost_once(prefix_: bytes, start: int) -> AsyncIterator[Any]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first watch hears nothing, then the stream is lost
            await released.wait()
            raise EtcdUnavailable("watch stream lost", operation="Watch")
        async for batch in original(prefix_, start):
            yield batch

    monkeypatch.setattr(client, "watch_prefix", lost_once)
    try:
        await store.start(sync_timeout=LISTED_S)
        assert len(store) == 3000
        await writer.revoke_lease(doomed_lease)  # gone while the mirror is not listening
        await bind(writer, prefix, sessions(500, "arrived"))
        with capture_logs() as logs:
            released.set()
            await eventually(lambda: store.mirror.relists == 1 and store.synced, within=20)
        assert await _converged(store, writer, prefix)
        assert len(store) == 2500  # no phantom of the 1,000 that went
        lost = [e for e in logs if e["event"] == "etcd_mirror_lost"]
        assert lost and lost[0]["kind"] == "unavailable" and lost[0]["mirror"] == "bindings"
        labels = {"service": "ext_proc", "mirror": "bindings"}
        assert registry.get_sample_value("kvgate_etcd_mirror_relists_total", labels) == 1
        assert registry.get_sample_value("kvgate_etcd_mirror_synced", labels) == 1
        assert store.mirror.state == MirrorState.SYNCED
    finally:
        released.set()
        await store.close()
        await client.close()
