"""HBM residency from the collector to a replica, in process: a real ZeroMQ publisher framed as
vLLM's, the collector's subscription (sequence gaps forget the engine), the round's changes in
the admin stream's message (every session in a stream's first one), and a replica's board."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from control_plane.admin.fleet_stream import FleetStream
from kvgate.config.sections.placement import GateConfig
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.fleet.kv_events import decode, events_endpoint, replay_endpoint
from kvgate.fleet.scrape import EngineFigures, EngineScrapeMetrics
from kvgate.session import normalize_session
from tests.support.polling import eventually
from tests.support.ports import free_ports

ENGINE = "127.0.0.1:8000"
BS = 16


def stored(blocks: list[int], parent: int | None, session: str) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": blocks, "parent_block_hash": parent,
            "token_ids": [], "block_size": BS, "session_id": session}


class Publisher:
    """vLLM's framing: [topic, 8-byte big-endian sequence, msgpack [ts, events, rank]]."""

    def __init__(self, port: int) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(f"tcp://127.0.0.1:{port}")
        self.seq = 0

    async def send(self, events: list[dict[str, Any]], skip: int = 0) -> None:
        self.seq += skip
        await self.socket.send_multipart([b"kv", self.seq.to_bytes(8, "big"),
                                          msgpack.packb([0.0, events, 0])])
        self.seq += 1

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def rig() -> AsyncIterator[tuple[FleetCollector, Publisher, CollectorSettings]]:
    (port,) = free_ports(1)
    publisher = Publisher(port)
    settings = CollectorSettings(True, True, 0.05, 0.05,
                                 GateConfig(source="collector", kv_events_port=port))
    collector = FleetCollector(lambda: [ENGINE], lambda: settings,
                               EngineScrapeMetrics(CollectorRegistry(), "control_plane"),
                               clock=Clock())
    try:
        yield collector, publisher, settings
    finally:
        await collector.events.close()
        publisher.close()


def test_endpoints_and_framing() -> None:
    assert events_endpoint("10.0.0.1:8000", 5557, 0) == "tcp://10.0.0.1:5557"
    assert events_endpoint("127.0.0.1:8001", 0, 100) == "tcp://127.0.0.1:8101"
    assert events_endpoint("[::1]:8000", 5557, 0) == "tcp://[::1]:5557"
    assert replay_endpoint("10.0.0.1:8000", 5557, 0, 1) == "tcp://10.0.0.1:5558"
    assert replay_endpoint("127.0.0.1:8001", 0, 100, 50) == "tcp://127.0.0.1:8151"
    assert replay_endpoint("10.0.0.1:8000", 5557, 0, 0) is None
    assert decode([b"kv", (7).to_bytes(8, "big"), msgpack.packb([0.0, [{"type": "X"}], 0])]
                  ) == (7, [{"type": "X"}])
    for frames in ([b"kv", b"1", b""], [b"kv"], [b"kv", bytes(8), msgpack.packb({"a": 1})]):
        with pytest.raises(ValueError):
            decode(frames)


async def test_a_session_stored_reaches_a_replica_and_a_gap_forgets_the_engine(
        rig: tuple[FleetCollector, Publisher, CollectorSettings]) -> None:
    collector, publisher, settings = rig
    collector._gather_residency(settings, {ENGINE})  # subscribes
    sub = collector.events.engines[ENGINE][0]
    assert sub.replay is None  # no kv_events_replay_offset: a gap forgets the engine

    async def joined() -> int:  # a SUB socket hears nothing until its subscription lands
        await publisher.send([{"type": "AllBlocksCleared"}])
        await asyncio.sleep(0)
        return sub.messages

    await eventually(joined, what="the subscription hears the publisher")
    collector._gather_residency(settings, {ENGINE})
    key = normalize_session(b"alice")
    assert key is not None
    seen = sub.messages
    await publisher.send([stored([1, 2, 3], None, "alice")])
    await eventually(lambda: sub.messages > seen, what="the store arrives")
    collector._gather_residency(settings, {ENGINE})
    collector.rounds += 1
    stream, board = FleetStream(collector, "cp-0", lambda: "cp-0"), HbmBoard()
    first = stream.frame(collector, full=True)
    assert first.residency_full and [(r.endpoint, r.session, r.tokens, r.stored)
                                     for r in first.residency] == [(ENGINE, key, 3 * BS, 3 * BS)]
    board.apply(first)
    assert board.hbm_tokens(ENGINE, key, 10_000) == 3 * BS
    assert board.hbm_share(ENGINE, key) == 1.0 and board.hbm_share("other", key) is None
    assert board.hbm_tokens(ENGINE, key, 20) == 20 and board.hbm_tokens("other", key, 9) is None

    # Its tail evicted: the next round's message carries the change alone.
    seen = sub.messages
    await publisher.send([{"type": "BlockRemoved", "block_hashes": [3]}])
    await eventually(lambda: sub.messages > seen, what="the eviction arrives")
    collector._gather_residency(settings, {ENGINE})
    collector.rounds += 1
    delta = stream.frame(collector)
    assert not delta.residency_full and [(r.tokens, r.stored) for r in delta.residency
                                         ] == [(2 * BS, 3 * BS)]  # what it stored stays
    board.apply(delta)
    assert board.hbm_tokens(ENGINE, key, 10_000) == 2 * BS
    assert board.hbm_share(ENGINE, key) == pytest.approx(2 / 3)

    # A message missed (its sequence skips one): the engine is forgotten, everywhere.
    seen = sub.messages
    await publisher.send([stored([4], 2, "alice")], skip=1)
    await eventually(lambda: sub.messages > seen, what="the next message arrives")
    assert sub.gaps == 1
    collector._gather_residency(settings, {ENGINE})
    collector.rounds += 1
    lost = stream.frame(collector)
    assert list(lost.residency_lost) == [ENGINE]
    board.apply(lost)
    assert board.hbm_tokens(ENGINE, key, 10_000) is None and board.pairs == 0

    # The engine leaves: its subscription is dropped and its residency with it.
    collector._gather_residency(settings, set())
    assert collector.residency_lost == [ENGINE] and not collector.events.engines


async def test_an_engines_eviction_rate_reaches_a_replica(
        rig: tuple[FleetCollector, Publisher, CollectorSettings]) -> None:
    collector, publisher, settings = rig
    clock = collector._clock
    assert isinstance(clock, Clock)
    collector._gather_residency(settings, {ENGINE})  # subscribes, and samples 0 evicted at 0 s
    sub = collector.events.engines[ENGINE][0]

    async def joined() -> int:
        await publisher.send([{"type": "AllBlocksCleared"}])
        await asyncio.sleep(0)
        return sub.messages

    await eventually(joined, what="the subscription hears the publisher")
    collector.record(ENGINE, EngineFigures(), clock.now)
    collector.record("127.0.0.1:9000", EngineFigures(), clock.now)  # an engine without events
    stream, board = FleetStream(collector, "cp-0", lambda: "cp-0"), HbmBoard()
    collector.rounds += 1
    board.apply(stream.frame(collector, full=True))
    assert board.eviction_rate(ENGINE) is None  # no time has passed: not known yet

    seen = sub.messages
    await publisher.send([stored([1, 2, 3, 4], None, "alice"),
                          {"type": "BlockRemoved", "block_hashes": [4]},
                          {"type": "BlockRemoved", "block_hashes": [3]},
                          {"type": "BlockRemoved", "block_hashes": [2]}])
    await eventually(lambda: sub.messages > seen, what="the evictions arrive")
    clock.now = 20.0
    collector._gather_residency(settings, {ENGINE})
    collector.rounds += 1
    frame = stream.frame(collector)
    assert ENGINE in frame.loads.endpoint
    board.apply(frame)
    assert board.eviction_rate(ENGINE) == pytest.approx(3 / 20.0)  # three blocks in 20 s
    assert board.eviction_rate("127.0.0.1:9000") is None
    board.clear()  # the stream lost: nothing known until the next one
    assert board.eviction_rate(ENGINE) is None


async def test_residency_outlives_a_lost_and_regained_leadership() -> None:
    """A follower keeps reading the streams: a conversation that went on while this replica
    did not lead is known the moment it leads again. (Read afresh, the stream would anchor no
    conversation already under way: its next blocks' parent was stored before.)"""
    (port,) = free_ports(1)
    publisher = Publisher(port)
    settings = CollectorSettings(True, True, 0.02, 0.02,
                                 GateConfig(source="collector", kv_events_port=port))
    collector = FleetCollector(lambda: [ENGINE], lambda: settings,
                               EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
    running = asyncio.create_task(collector.run())
    key = normalize_session(b"alice")

    async def heard() -> bool:  # a SUB socket hears nothing until its subscription lands
        held = collector.events.engines.get(ENGINE)
        if held is None:
            return False
        await publisher.send([{"type": "AllBlocksCleared"}])
        await asyncio.sleep(0.01)
        return held[0].messages > 0

    def alice() -> int | None:
        return dict(((e, s), t) for e, s, t in (
            (r.endpoint, r.session, r.tokens) for r in collector.residency())).get((ENGINE, key))

    try:
        await eventually(heard, what="the leader's subscription hears the publisher")
        await publisher.send([stored([1, 2, 3], None, "alice")])
        await eventually(alice, until=lambda t: t == 3 * BS, what="alice's first turn")
        settings = CollectorSettings(True, False, 0.02, 0.02,
                                     GateConfig(source="collector", kv_events_port=port))
        await eventually(lambda: not collector.collecting, what="it stops collecting")
        await publisher.send([stored([4, 5], 3, "alice")])  # her next turn, while it follows
        await eventually(alice, until=lambda t: t == 5 * BS, what="the follower hears it")
        settings = CollectorSettings(True, True, 0.02, 0.02,
                                     GateConfig(source="collector", kv_events_port=port))
        await eventually(lambda: collector.collecting, what="it collects again")
        await publisher.send([stored([6], 5, "alice")])
        await eventually(alice, until=lambda t: t == 6 * BS, what="the leader knows her")
        assert collector.residency_lost == []
        # Unconfigured (the gate's source changed): the streams are dropped.
        settings = CollectorSettings(False, True, 0.02, 0.02,
                                     GateConfig(source="collector", kv_events_port=port))
        await eventually(lambda: not collector.events.engines, what="streams dropped")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        publisher.close()


def test_engines_that_share_one_stream_are_not_followed() -> None:
    from kvgate.fleet.collector import one_stream_each

    endpoints = {a: (events_endpoint(a, 5557, 0), None)
                 for a in ("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000")}
    assert one_stream_each(endpoints) == {"10.0.0.2:8000": ("tcp://10.0.0.2:5557", None)}
    offset = {a: (events_endpoint(a, 0, 100), None) for a in ("10.0.0.1:8000", "10.0.0.1:8001")}
    assert one_stream_each(offset) == offset
