"""The etcd binding store against a real etcd: races, compare-and-set, watch, idle expiry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.support.polling import eventually


@pytest.fixture
async def stores(etcd, prefix: str) -> AsyncIterator[Callable[..., EtcdBindingStore]]:
    made: list[tuple[EtcdBindingStore, EtcdClient]] = []

    async def make(idle_ttl: float = 3600) -> EtcdBindingStore:
        client = EtcdClient([etcd.endpoint])
        supervisor = Supervisor("ext_proc", CollectorRegistry())
        store = EtcdBindingStore(client, prefix, idle_ttl, supervisor=supervisor,
                                 write_limit_s=2.0)
        await store.start()
        made.append((store, client))
        return store

    yield make  # type: ignore[misc]
    for store, client in made:
        await store.close()
        await client.close()


async def test_concurrent_creates_agree_and_watch_propagates(stores) -> None:
    a, b = await stores(), await stores()
    results = await asyncio.gather(*(
        store.create(Binding(f"s{i}", "p", endpoint))
        for i in range(20)
        for store, endpoint in ((a, "10.0.0.1:1"), (b, "10.0.0.2:1"))
    ))
    for i in range(20):
        assert results[2 * i].endpoint == results[2 * i + 1].endpoint
    await eventually(lambda: len(a) == 20 and len(b) == 20)
    for i in range(20):
        assert a.get("p", f"s{i}") == b.get("p", f"s{i}")
    assert sum(a.load("p").values()) == 20


async def test_move_is_compare_and_set(stores) -> None:
    a, b = await stores(), await stores()
    original = await a.create(Binding("s", "p", "10.0.0.1:1"))
    await eventually(lambda: b.get("p", "s") is not None)
    moved = await a.move(original, "10.0.0.2:1")
    assert moved.endpoint == "10.0.0.2:1" and moved.revision > original.revision
    late = await b.move(original, "10.0.0.3:1")  # b still acts on the old binding
    assert late.endpoint == "10.0.0.2:1"
    await eventually(lambda: b.get("p", "s") == moved)


async def test_idle_binding_expires_used_one_stays(stores) -> None:
    store = await stores(idle_ttl=2)
    loop = asyncio.get_running_loop()
    started = loop.time()  # before the bindings exist, so a slow create cannot shorten it
    idle = await store.create(Binding("idle", "p", "10.0.0.1:1"))
    used = await store.create(Binding("used", "p", "10.0.0.1:1"))
    assert idle.revision and used.revision

    def idle_gone() -> bool:
        store.touch(used)
        return store.get("p", "idle") is None

    await eventually(idle_gone, what="the idle binding expired")
    # Kept at least about idle_ttl: a lower bound, which a slow machine can only lengthen.
    assert loop.time() - started >= 2 * 0.9
    assert store.get("p", "used") is not None
