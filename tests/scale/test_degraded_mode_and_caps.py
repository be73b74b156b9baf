"""Degraded mode that recovers, and bounds that hold: one slow etcd write does not send every
later one to the queue; the queue is bounded, and past it (or past session.max_bindings) a new
session is routed on Envoy's ring without a binding, counted and logged; existing bindings are
never evicted; until the mirror is synced an unknown session is looked up in etcd rather than
placed anew. A real etcd; the decision pipeline and the store in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding
from kvgate.bindings.store import Unbound
from kvgate.config import load_text
from kvgate.config.model import HostPort
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, EtcdNoSpace
from kvgate.etcd.errors import EtcdDeadline
from kvgate.etcd.mirror import MirrorState
from kvgate.routing import Outcome, Pipeline
from kvgate.runtime.tasks.supervisor import Supervisor
from kvgate.session import normalize_session
from tests.failsafe.failsafe_helpers import control_plane_config
from tests.scale.scale_helpers import A, B
from tests.support.polling import eventually

CONFIG = load_text(f"pools: [{{name: coder, endpoints: [{A}, {B}]}}]\n")


@pytest.fixture
async def client(etcd) -> AsyncIterator[EtcdClient]:
    made = EtcdClient([etcd.endpoint])
    yield made
    await made.close()


async def _store(client: EtcdClient, prefix: str, **options: Any) -> EtcdBindingStore:
    store = EtcdBindingStore(client, prefix, 3600, write_limit_s=2.0,
                             supervisor=Supervisor("ext_proc", CollectorRegistry()), **options)
    await store.start()
    return store


async def test_one_slow_write_queues_only_itself(client: EtcdClient, prefix: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _store(client, prefix)
    original = client.create
    calls = 0

    async def slow_write(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 2:  # the write and its retry on the next member
            raise EtcdDeadline("no answer within 100 ms", operation="Txn")
        return await original(*args, **kwargs)

    monkeypatch.setattr(client, "create", slow_write)
    try:
        late = await store.create(Binding("late", "coder", A))
        assert late.revision == 0 and not store.degraded  # queued, etcd not given up on
        on_time = await store.create(Binding("on-time", "coder", B))
        assert on_time.revision > 0  # written on the hot path, not queued behind the slow one
        await eventually(lambda: store.pending == 0)
        assert (await client.get(f"{prefix}bindings/coder/late".encode())) is not None
    finally:
        await store.close()


async def test_a_full_queue_leaves_new_sessions_unbound_and_drains_when_etcd_is_back(
    client: EtcdClient, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _store(client, prefix, max_pending=5)
    unbound: list[tuple[str, Unbound]] = []
    decider = Pipeline(store, EndpointDirectory(CONFIG), 1.25,
                      on_unbound=lambda pool, session, why: unbound.append((session, why)))
    known = await decider.decide("coder", b"known-before")
    refused = EtcdNoSpace("database space exceeded", operation="Txn")

    async def no_space(*args: Any, **kwargs: Any) -> Any:
        raise refused

    try:
        for name in ("create", "put_each", "get"):
            monkeypatch.setattr(client, name, no_space)
        outcomes = [(await decider.decide("coder", f"new-{i}".encode())).outcome
                    for i in range(8)]
        assert outcomes == [Outcome.NEW] * 5 + [Outcome.UNBOUND] * 3
        assert store.degraded and store.pending == 5
        assert [why.reason for _, why in unbound] == ["pending_full"] * 3
        again = await decider.decide("coder", b"known-before")
        assert again.outcome is Outcome.STICKY and again.endpoints == known.endpoints
        monkeypatch.undo()  # the operator freed space
        await eventually(lambda: store.pending == 0 and not store.degraded)
        for i in range(5):
            key = f"{prefix}bindings/coder/{normalize_session(f'new-{i}'.encode())}"
            assert await client.get(key.encode()) is not None
        assert (await decider.decide("coder", b"new-7")).outcome is Outcome.NEW  # room again
    finally:
        await store.close()


async def test_past_max_bindings_new_sessions_go_unbound_and_old_ones_stay() -> None:
    store = MemoryBindingStore()
    unbound: list[Unbound] = []
    decider = Pipeline(store, EndpointDirectory(CONFIG), 1.25, max_bindings=3,
                      on_unbound=lambda pool, session, why: unbound.append(why))
    first = [await decider.decide("coder", f"s{i}".encode()) for i in range(3)]
    late = await decider.decide("coder", b"s-late")
    assert late.outcome is Outcome.UNBOUND and late.endpoints == () and late.session
    assert unbound[0].reason == "max_bindings" and "session.max_bindings: 3" in str(unbound[0])
    for i, decision in enumerate(first):  # never evicted for the newcomer
        again = await decider.decide("coder", f"s{i}".encode())
        assert again.outcome is Outcome.STICKY and again.endpoints == decision.endpoints
    assert store.count("coder") == 3


async def test_before_the_mirror_is_synced_an_unknown_session_is_looked_up_not_placed(
    client: EtcdClient, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where would a fresh placement put it? Bind it to the other endpoint in etcd.
    placed = await Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 1.25).decide(
        "coder", b"returning-user")
    elsewhere = B if placed.endpoints[0] == A else A
    session = normalize_session(b"returning-user")
    assert session is not None
    await client.put(f"{prefix}bindings/coder/{session}".encode(),
                     Binding(session, "coder", elsewhere).encode())
    listing = asyncio.Event()
    count_range = client.count_range

    async def bindings_never_done(key: bytes, *args: Any) -> tuple[int, int]:
        if key.endswith(b"/bindings/"):  # the listing of a million bindings, still going
            listing.set()
            await asyncio.Event().wait()
        return await count_range(key, *args)

    monkeypatch.setattr(client, "count_range", bindings_never_done)
    store = EtcdBindingStore(client, prefix, 3600, write_limit_s=2.0,
                             supervisor=Supervisor("ext_proc", CollectorRegistry()))
    try:
        with capture_logs() as logs:
            await store.start(sync_timeout=0.2)
        assert listing.is_set() and not store.synced
        assert store.mirror.state in (MirrorState.STARTING, MirrorState.LISTING)
        assert any(e["event"] == "bindings_start_unsynced" for e in logs)
        decision = await Pipeline(store, EndpointDirectory(CONFIG), 1.25).decide(
            "coder", b"returning-user")
        assert decision.outcome is Outcome.STICKY and decision.endpoints[0] == elsewhere
    finally:
        await store.close()


async def test_ext_proc_counts_and_throttles_unbound_sessions(etcd, prefix: str) -> None:
    config = control_plane_config([A, B], etcd.endpoint, prefix)
    service = ExtProcService(config, ExtProcOptions(
        listen=HostPort("127.0.0.1", 0), metrics=None, etcd_endpoints=(etcd.endpoint,)))
    await service.start()
    try:
        with capture_logs() as logs:
            for i in range(50):
                service._unbound("coder", f"s{i}", Unbound("max_bindings", "cap reached"))
        assert service.metrics.registry.get_sample_value(
            "kvgate_ext_proc_unbound_total", {"reason": "max_bindings"}) == 50
        logged = [e for e in logs if e["event"] == "session_unbound"]
        assert len(logged) == 1 and logged[0]["reason"] == "max_bindings"
        assert service.report().unbound == 50
    finally:
        await service.stop(grace=0)
