"""A gap in an engine's KV event stream, filled from the publisher's replay socket: the
emulator's publisher (vLLM's framing and replay protocol), the collector's subscription fed
every message but the missed ones, which it must fetch itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import msgpack
import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from emulator.kv_events import KvEventLog
from emulator.kv_events_zmq import KvEventPublisher
from kvgate.config.sections.placement import GateConfig
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.kv_events import END_SEQ, EventSubscription, replay, replay_endpoint
from kvgate.fleet.residency import EngineResidency
from kvgate.fleet.scrape import EngineScrapeMetrics
from kvgate.session import normalize_session
from tests.support.kv_events import Message, Subscriber

BS = 16
ALICE = normalize_session(b"alice")


class Rig:
    def __init__(self, publisher: KvEventPublisher, log: KvEventLog,
                 messages: list[Message]) -> None:
        self.publisher, self.log, self.messages = publisher, log, messages
        self.context = zmq.asyncio.Context()
        self.subscriptions: list[EventSubscription] = []

    def subscription(self, replay: bool) -> EventSubscription:
        engine = f"127.0.0.1:{self.publisher.port}"
        offset = (self.publisher.replay_port or 0) - self.publisher.port if replay else 0
        sub = EventSubscription(
            self.context, engine, f"tcp://{engine}",
            EngineResidency(session_key=lambda raw: normalize_session(raw.encode())),
            replay=replay_endpoint(engine, 0, 0, offset))
        self.subscriptions.append(sub)
        return sub


async def _rig(buffer_steps: int) -> AsyncIterator[Rig]:
    log = KvEventLog(BS)
    publisher = KvEventPublisher(log, "127.0.0.1", 0, replay_port=0,
                                 buffer_steps=buffer_steps)
    await publisher.start()
    try:
        async with Subscriber(f"tcp://127.0.0.1:{publisher.port}") as watcher:
            async def clear() -> None:
                log.cleared()
                publisher.flush()

            await watcher.ready(clear)
            # Alice's context grows one block a message: [1, 2], then 3, 4 and 5.
            for start, hashes in ((0, [1, 2]), (2, [1, 2, 3]), (3, [1, 2, 3, 4]),
                                  (4, [1, 2, 3, 4, 5])):
                log.expect(list(range(len(hashes) * BS)), [], len(hashes), session="alice")
                log.stored(hashes, start)
                publisher.flush()
            await watcher.collect(lambda events: len(events) >= 4)
            rig = Rig(publisher, log, list(watcher.received))
        try:
            yield rig
        finally:
            for sub in rig.subscriptions:
                sub.close()
            rig.context.term()
    finally:
        await publisher.close()


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """The publisher buffers 100 messages for replay, or ``param`` (indirect)."""
    async for made in _rig(buffer_steps=getattr(request, "param", 100)):
        yield made


def _frames(message: Message) -> list[bytes]:
    return [message.topic, message.seq.to_bytes(8, "big"), message.payload]


async def _first_and_last(rig: Rig, replay: bool) -> EventSubscription:
    """The subscription takes the first and the last message: the two between are missed."""
    sub = rig.subscription(replay)
    first, *missed, last = rig.messages
    assert len(missed) == 2 and last.seq == first.seq + 3
    await sub.take(_frames(first))
    await sub.take(_frames(last))
    return sub


async def test_a_gap_is_filled_from_the_replay_socket(rig: Rig) -> None:
    assert ALICE is not None
    sub = await _first_and_last(rig, replay=True)
    assert (sub.gaps, sub.replayed, sub.lost) == (1, 2, False)
    assert sub.messages - sub.caught_up == 4
    assert sub.residency.hbm_tokens(ALICE) == 5 * BS  # the whole chain, as if nothing was lost


async def test_a_stream_joined_late_catches_up_from_the_replay_socket(rig: Rig) -> None:
    """A subscription that hears alice's last message only (a collector started afresh): the
    replay socket's buffer gives what came before, so her chain is known from its start."""
    assert ALICE is not None
    last = rig.messages[-1]
    late = rig.subscription(replay=True)
    await late.take(_frames(last))
    assert (late.caught_up, late.gaps, late.lost) == (last.seq, 0, False)
    assert late.residency.hbm_tokens(ALICE) == 5 * BS
    alone = rig.subscription(replay=False)
    await alone.take(_frames(last))
    assert alone.residency.hbm_tokens(ALICE) is None  # its parent was stored before it joined


async def test_without_a_replay_socket_a_gap_forgets_the_engine(rig: Rig) -> None:
    assert ALICE is not None
    sub = await _first_and_last(rig, replay=False)
    assert (sub.gaps, sub.replayed, sub.lost) == (1, 0, True)
    assert sub.residency.hbm_tokens(ALICE) is None  # its chain starts at a block never seen


@pytest.mark.parametrize("rig", [1], indirect=True)  # the publisher keeps the newest alone
async def test_a_replay_that_no_longer_has_them_forgets_the_engine(rig: Rig) -> None:
    assert ALICE is not None
    sub = await _first_and_last(rig, replay=True)
    assert (sub.gaps, sub.replayed, sub.lost) == (1, 0, True)
    assert sub.residency.hbm_tokens(ALICE) is None  # its chain starts at a block never seen


async def test_replies_without_a_topic_frame_are_read_too() -> None:
    """vLLM's main branch answers ``[b"", sequence, payload]`` (no topic): a replay socket
    that does so, asked for 5 up to 7, gives 5 and 6 and not what it sends past them."""
    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    async def serve() -> None:
        client, _, start = await router.recv_multipart()
        assert int.from_bytes(start, "big") == 5
        for seq in (5, 6, 7):
            payload = msgpack.packb([0.0, [{"type": "AllBlocksCleared", "n": seq}], 0])
            await router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
        await router.send_multipart([client, b"", END_SEQ, b""])

    try:
        served = asyncio.ensure_future(serve())
        got = await asyncio.wait_for(replay(context, f"tcp://127.0.0.1:{port}", 5, 7), 10)
        await served
        assert [(seq, events[0]["n"]) for seq, events in got] == [(5, 5), (6, 6)]
    finally:
        router.close(linger=0)
        context.term()


async def test_the_collector_gives_each_subscription_its_replay_socket() -> None:
    engine = "10.0.0.1:8000"
    settings = CollectorSettings(True, True, 0.05, 0.05, GateConfig(
        source="collector", kv_events_port=5557, kv_events_replay_offset=1))
    collector = FleetCollector(lambda: [engine], lambda: settings,
                               EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
    try:
        collector._gather_residency(settings, {engine})
        sub = collector.events.engines[engine][0]
        assert (sub.endpoint, sub.replay) == ("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558")
        collector._gather_residency(
            replace(settings, gate=replace(settings.gate, kv_events_replay_offset=2)), {engine})
        assert collector.events.engines[engine][0].replay == "tcp://10.0.0.1:5559"
        assert collector.residency_lost == [engine]  # subscribed again: what it knew is gone
    finally:
        await collector.events.close()
