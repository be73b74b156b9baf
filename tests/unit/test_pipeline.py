"""kvgate.routing.pipeline (pure logic over an in-memory store): outcomes, coalescing,
cancellation."""

from __future__ import annotations

import asyncio

from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding
from kvgate.config import load_text
from kvgate.endpoints import EndpointDirectory, EndpointRecord
from kvgate.placement import EnvoyRing, session_hash
from kvgate.routing import Outcome, Pipeline

CONFIG = load_text(
    "pools: [{name: p, kv_pool: a, endpoints: ["
    "10.0.0.1:1, 10.0.0.2:1, {address: 10.0.0.3:1, kv_pool: b}]}]\n"
)


class SlowStore(MemoryBindingStore):
    """Creates wait for a gate, like an etcd transaction in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.creates = 0

    async def create(self, binding: Binding) -> Binding:
        self.creates += 1
        self.started.set()
        await self.gate.wait()
        return await super().create(binding)


def _fail(directory: EndpointDirectory, failed: str) -> None:
    for endpoint in CONFIG.pools[0].endpoints:  # etcd's records replace the YAML's membership
        directory.set_record(EndpointRecord("p", endpoint.key, endpoint.kv_pool,
                                            healthy=endpoint.key != failed))


async def test_outcomes_and_fallback_in_same_kv_pool() -> None:
    directory = EndpointDirectory(CONFIG)
    # A loose load bound: this test is about the KV-pool preference; a sibling filled to its
    # bound spills to the other pool (tested in test_placement).
    decider = Pipeline(MemoryBindingStore(), directory, 4.0)
    assert (await decider.decide("p", b"")).outcome is Outcome.SESSIONLESS
    first = await decider.decide("p", b"s1")
    assert first.outcome is Outcome.NEW and len(first.endpoints) == 2
    again = await decider.decide("p", b"s1")
    assert again.outcome is Outcome.STICKY and again.endpoints[0] == first.endpoints[0]
    # Sessions on 10.0.0.1:1, whose KV pool `a` it shares with 10.0.0.2:1 only.
    sessions = [b"s%d" % i for i in range(60)]
    placed = {s: await decider.decide("p", s) for s in sessions}
    on_a1 = [s for s in sessions if placed[s].endpoints[0] == "10.0.0.1:1"]
    assert len(on_a1) >= 5
    # Envoy's ring alone would send some of them to 10.0.0.3:1 (KV pool b) when their engine
    # fails: the preference below is really exercised.
    ring = EnvoyRing([(e.key, 1) for e in CONFIG.pools[0].endpoints])
    assert any(ring.first_other(session_hash(s), "10.0.0.1:1") == "10.0.0.3:1" for s in on_a1)
    # Their retry goes to the KV sibling, and when their engine fails they are re-bound there.
    assert {placed[s].endpoints[1] for s in on_a1} == {"10.0.0.2:1"}
    _fail(directory, "10.0.0.1:1")
    moved = [await decider.decide("p", s) for s in on_a1]
    assert {m.outcome for m in moved} == {Outcome.REBIND}
    assert {m.endpoints[0] for m in moved} == {"10.0.0.2:1"}
    # With no sibling in its KV pool, a session of 10.0.0.3:1 moves to the other pool.
    on_b = next(s for s in sessions if placed[s].endpoints[0] == "10.0.0.3:1")
    _fail(directory, "10.0.0.3:1")
    rebound = await decider.decide("p", on_b)
    assert rebound.outcome is Outcome.REBIND
    assert rebound.endpoints[0] in {"10.0.0.1:1", "10.0.0.2:1"}


async def test_concurrent_first_requests_share_one_write_even_if_one_is_cancelled() -> None:
    store = SlowStore()
    decider = Pipeline(store, EndpointDirectory(CONFIG), 1.25)
    requests = [asyncio.create_task(decider.decide("p", b"together")) for _ in range(3)]
    await asyncio.wait_for(store.started.wait(), 30)
    requests[0].cancel()  # Envoy gave up on the first one
    store.gate.set()
    answers = await asyncio.gather(*requests[1:])
    assert store.creates == 1
    assert answers[0].endpoints == answers[1].endpoints
    assert store.get("p", answers[0].session or "") is not None
