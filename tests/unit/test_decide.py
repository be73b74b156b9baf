"""The Decider (pure logic over an in-memory store): outcomes, coalescing, cancellation."""

from __future__ import annotations

import asyncio

from ext_proc.decide import Decider, Outcome
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding
from kvgate.config import load_text
from kvgate.endpoints import EndpointDirectory, EndpointRecord

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


async def test_outcomes_and_fallback_in_same_kv_pool() -> None:
    directory = EndpointDirectory(CONFIG)
    decider = Decider(MemoryBindingStore(), directory, 1.25)
    assert (await decider.decide("p", b"")).outcome is Outcome.SESSIONLESS
    first = await decider.decide("p", b"s1")
    assert first.outcome is Outcome.NEW and len(first.endpoints) == 2
    again = await decider.decide("p", b"s1")
    assert again.outcome is Outcome.STICKY and again.endpoints[0] == first.endpoints[0]
    home = first.endpoints[0]
    kv = "b" if home == "10.0.0.3:1" else "a"
    for endpoint in CONFIG.pools[0].endpoints:  # etcd's records replace the YAML's membership
        directory.set_record(EndpointRecord("p", endpoint.key, endpoint.kv_pool,
                                            healthy=endpoint.key != home))
    moved = await decider.decide("p", b"s1")
    assert moved.outcome is Outcome.REBIND and moved.endpoints[0] != home
    if kv == "a":  # a sibling in the same KV pool exists: the session goes there
        assert moved.endpoints[0] in {"10.0.0.1:1", "10.0.0.2:1"}


async def test_concurrent_first_requests_share_one_write_even_if_one_is_cancelled() -> None:
    store = SlowStore()
    decider = Decider(store, EndpointDirectory(CONFIG), 1.25)
    requests = [asyncio.create_task(decider.decide("p", b"together")) for _ in range(3)]
    await asyncio.wait_for(store.started.wait(), 5)
    requests[0].cancel()  # Envoy gave up on the first one
    store.gate.set()
    answers = await asyncio.gather(*requests[1:])
    assert store.creates == 1
    assert answers[0].endpoints == answers[1].endpoints
    assert store.get("p", answers[0].session or "") is not None
