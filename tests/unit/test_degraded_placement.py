"""While the bindings store's writes do not reach etcd, the pipeline places on Envoy's ring
alone (the one placement every replica computes alike) and moves no session for load: a
session's turns reach any replica, and the others cannot see what this one binds."""

from __future__ import annotations

import time
from dataclasses import replace

from prometheus_client import CollectorRegistry

from kvgate.bindings.etcd import RING_AFTER_RECOVERY_S, EtcdBindingStore
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding, MoveEstimate
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.states import MoveReason
from kvgate.contract.vllm import EngineFigures
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient
from kvgate.placement import EnvoyRing, session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.routing import GatedPolicy, Outcome, Pipeline
from kvgate.runtime.tasks.supervisor import Supervisor

CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: "
                   "[10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1]}]\n")
ENDPOINTS = [e.key for e in CONFIG.pools[0].endpoints]
RING = EnvoyRing([(e, 1) for e in ENDPOINTS])
NOW = 100.0


class AwayStore(MemoryBindingStore):
    """Memory that can lose etcd like the etcd store: writes then wait in a local queue
    (revision 0), and a move that may as well not happen (optional) is not made.
    `lose_at_next_write`: the next create or move is the write that finds etcd gone."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False
        self.lose_at_next_write = False

    @property
    def degraded(self) -> bool:
        return self.away

    @property
    def places_on_ring(self) -> bool:
        return self.away

    async def create(self, binding: Binding) -> Binding:
        if self.lose_at_next_write:
            self.away, self.lose_at_next_write = True, False
        if not self.away:
            return await super().create(binding)
        existing = self.get(binding.pool, binding.session)
        return existing if existing is not None else self._queue(binding)

    async def move(self, current: Binding, endpoint: str,
                   reason: MoveReason | None = None, *, optional: bool = False,
                   estimate: MoveEstimate | None = None) -> Binding:
        if self.lose_at_next_write:
            self.away, self.lose_at_next_write = True, False
        if not self.away:
            return await super().move(current, endpoint, reason, estimate=estimate)
        return current if optional else self._queue(
            current.moved_to(endpoint, reason, estimate=estimate))

    def _queue(self, binding: Binding) -> Binding:
        local = replace(binding, revision=0)
        self._index.put(local)
        return local


def _gated(store: AwayStore) -> tuple[Pipeline, LoadBoard]:
    board = LoadBoard(max_age_s=2.0)
    policy = GatedPolicy(EngineCost(), GateConfig(), board, clock=lambda: NOW)
    return Pipeline(store, EndpointDirectory(CONFIG), 4.0, policy=policy), board


def _ring_first(session: bytes) -> str:
    return next(RING.walk(session_hash(session)))


def _busy(board: LoadBoard, address: str) -> None:
    board.observe(address, ObservedLoad(at=NOW, backlog_s=60.0,
                                         figures=EngineFigures.of(waiting=30)))


async def test_the_gate_places_off_the_ring_while_etcd_is_reached() -> None:
    decider, board = _gated(AwayStore())
    _busy(board, _ring_first(b"s"))  # so the gate's pick is not the ring's
    placed = await decider.decide("p", b"s", prompt_tokens=2000)
    assert placed.outcome is Outcome.NEW and placed.endpoints[0] != _ring_first(b"s")


async def test_while_degraded_new_sessions_follow_the_ring_whatever_the_load() -> None:
    store = AwayStore()
    decider, board = _gated(store)
    store.away = True
    busy = ENDPOINTS[0]
    _busy(board, busy)  # the gate would place these elsewhere
    sessions = [s for s in (b"s%d" % i for i in range(60)) if _ring_first(s) == busy]
    assert len(sessions) >= 5
    placed = {s: (await decider.decide("p", s, prompt_tokens=2000)).endpoints[0]
              for s in sessions}
    assert placed == {s: _ring_first(s) for s in sessions}
    assert {b.revision for b in store.bindings("p")} == {0}  # all queued for etcd


async def test_the_write_that_finds_etcd_gone_re_places_its_session_on_the_ring() -> None:
    store = AwayStore()
    decider, board = _gated(store)
    ring = _ring_first(b"s")
    _busy(board, ring)
    store.lose_at_next_write = True  # placed by the gate, then its write is queued
    placed = await decider.decide("p", b"s", prompt_tokens=2000)
    assert (placed.outcome, placed.endpoints[0]) == (Outcome.NEW, ring)
    assert [(b.endpoint, b.revision) for b in store.bindings("p")] == [(ring, 0)]


async def test_while_degraded_no_session_is_moved_for_load() -> None:
    store = AwayStore()
    decider, board = _gated(store)
    home = (await decider.decide("p", b"s", prompt_tokens=2000)).endpoints[0]
    store.away = True
    _busy(board, home)
    again = await decider.decide("p", b"s", prompt_tokens=2000)
    assert (again.outcome, again.endpoints[0]) == (Outcome.STICKY, home)
    store.away = False  # etcd back: the gate moves it off the busy engine
    moved = await decider.decide("p", b"s", prompt_tokens=2000)
    assert (moved.outcome, moved.reason) == (Outcome.REBIND, MoveReason.LOAD)
    assert moved.endpoints[0] != home


async def test_a_move_for_load_whose_write_finds_etcd_gone_is_not_made() -> None:
    """The other replicas would keep sending the session where it was: it stays there."""
    store = AwayStore()
    decider, board = _gated(store)
    home = (await decider.decide("p", b"s", prompt_tokens=2000)).endpoints[0]
    _busy(board, home)  # the gate wants it elsewhere ...
    store.lose_at_next_write = True  # ... and its write is the one that finds etcd gone
    kept = await decider.decide("p", b"s", prompt_tokens=2000)
    assert (kept.outcome, kept.reason, kept.endpoints[0]) == (Outcome.STICKY, None, home)
    assert [(b.endpoint, b.revision > 0) for b in store.bindings("p")] == [(home, True)]


async def test_the_etcd_store_places_on_the_ring_while_degraded_and_a_moment_after() -> None:
    """A peer that lost etcd too placed its new sessions on the ring and may still be flushing
    them: right after recovery this replica places new sessions there as well (docs/faults.md,
    the leader kills)."""
    client = EtcdClient(["127.0.0.1:1"])  # never called: the test drives the state alone
    try:
        store = EtcdBindingStore(client, "/kvgate/t/", 60.0, supervisor=Supervisor(
            "t", CollectorRegistry()))
        assert not store.places_on_ring
        store._degraded = True
        assert store.places_on_ring
        store._degraded, store._recovered_at = False, time.monotonic()  # just recovered
        assert store.places_on_ring
        store._recovered_at = time.monotonic() - RING_AFTER_RECOVERY_S
        assert not store.places_on_ring
    finally:
        await client.close()
