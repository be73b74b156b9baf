"""A consumer of vLLM's KV cache event stream, for tests against the emulator and real vLLM.

Subscribes with a real ZeroMQ SUB socket, checks each message's framing, and decodes payloads
two ways: plain msgpack (what the events are), and msgspec with structs declared as vLLM 0.32
declares them in ``vllm/distributed/kv_events.py`` (same names, fields, order, defaults, tags;
written here from those definitions, not imported), so a payload vLLM's own decoder would reject
fails here too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)
WITHIN = 30.0


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)
ENCODER = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class Message:
    """One message off the PUB socket: its frames checked, its payload decoded."""

    topic: bytes
    seq: int
    payload: bytes

    @property
    def batch(self) -> list[Any]:
        """The payload as plain msgpack: ``[ts, [event maps...], data_parallel_rank]``."""
        value = msgpack.unpackb(self.payload, raw=False, strict_map_key=False)
        assert isinstance(value, list)
        return value

    @property
    def events(self) -> list[dict[str, Any]]:
        """The batch's events as maps (``type`` first)."""
        events = self.batch[1]
        assert isinstance(events, list)
        return events

    def typed(self) -> KVEventBatch:
        """The payload decoded with vLLM's struct definitions (raises if they reject it)."""
        return DECODER.decode(self.payload)


def message(frames: list[bytes]) -> Message:
    """Checks vLLM's framing: ``[topic, 8-byte big-endian sequence, payload]``."""
    assert len(frames) == 3, f"expected 3 frames, got {len(frames)}"
    topic, seq, payload = frames
    assert len(seq) == 8, f"sequence frame of {len(seq)} bytes"
    return Message(topic, int.from_bytes(seq, "big"), payload)


class Subscriber:
    """A SUB socket on one publisher; ``async with`` closes it."""

    def __init__(self, endpoint: str, topic: bytes = b"") -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.socket.subscribe(topic)
        self.received: list[Message] = []

    async def __aenter__(self) -> Subscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.socket.close(linger=0)
        self.context.term()

    async def receive(self, timeout_s: float) -> Message | None:
        """The next message, kept in :attr:`received`; None if none came within the time."""
        return await self._next(timeout_s)

    async def _next(self, timeout_s: float) -> Message | None:
        if not await self.socket.poll(int(timeout_s * 1000)):
            return None
        got = message(await self.socket.recv_multipart())
        self.received.append(got)
        return got

    async def ready(self, trigger: Callable[[], Awaitable[object]],
                    within: float = WITHIN) -> None:
        """Until a message arrives, call ``trigger`` (something that makes the publisher send;
        a subscription takes effect some time after connecting); then drain what it sent."""
        deadline = time.monotonic() + within
        while await self._next(0) is None:
            assert time.monotonic() < deadline, "no KV event message reached the subscriber"
            await trigger()
            if await self._next(0.2) is not None:
                break
        while await self._next(0.3) is not None:
            pass
        self.received.clear()

    async def collect(self, until: Callable[[list[dict[str, Any]]], bool],
                      within: float = WITHIN) -> list[dict[str, Any]]:
        """Events received since the last call (or :meth:`ready`), waiting until ``until`` holds
        for them; the messages stay in :attr:`received`."""
        deadline = time.monotonic() + within
        start = len(self.received)
        while True:
            events = [e for m in self.received[start:] for e in m.events]
            if until(events):
                return events
            left = deadline - time.monotonic()
            assert left > 0, f"events never satisfied the condition; got {events}"
            await self._next(min(left, 0.5))


async def replay(endpoint: str, start_seq: int, within: float = WITHIN) -> list[Message]:
    """Asks vLLM's replay socket (ROUTER) for every buffered message from ``start_seq``:
    vLLM 0.32 (vllm/distributed/kv_events.py ``ZmqEventPublisher._service_replay``) frames
    each as on the PUB socket behind the empty delimiter, the end as ``[b"", b"", END_SEQ,
    b""]``."""
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out: list[Message] = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), within)
            assert frames[0] == b"", "replay replies start with an empty delimiter"
            assert len(frames) == 4, f"a replay reply of {len(frames)} frames"
            if frames[2] == END_SEQ:
                return out
            out.append(message(frames[1:]))
    finally:
        dealer.close(linger=0)
        context.term()


def block_count(events: list[dict[str, Any]], kind: str) -> int:
    """Blocks named by the events of one ``type``."""
    return sum(len(e.get("block_hashes", ())) for e in events if e["type"] == kind)
