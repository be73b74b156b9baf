"""One engine's KV cache event stream, read into its :class:`EngineResidency`.

vLLM's publisher (vllm/distributed/kv_events.py ``ZmqEventPublisher``) sends multipart
``[topic, sequence (8-byte big-endian), msgpack payload]`` on a ZeroMQ PUB socket, the payload a
``KVEventBatch`` ``[ts, [events...], data_parallel_rank]``. A PUB socket drops what a slow or
late subscriber misses, and the sequence shows it. After a gap the subscription asks the
publisher's replay socket, where configured, for the messages missed (``_service_replay``: a
ROUTER that answers a start sequence with every buffered message from it, then an end marker),
and applies them in order; where it has none, or not all of them, the residency forgets the
engine (nothing known until its sessions store again) rather than answer from a partial record.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import structlog
import zmq
import zmq.asyncio

from kvgate.config.address import HostPort
from kvgate.fleet.residency import EngineResidency
from kvgate.session import normalize_session

log = structlog.get_logger("kvgate.fleet")

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker (vLLM's END_SEQ)
REPLAY_WITHIN_S = 1.0  # a replay not ended by then counts as none: the engine is forgotten


EventsAt = tuple[str, str | None]  # an engine's event stream, and its replay socket if any


def _publisher(engine: str, port: int, offset: int) -> HostPort:
    at = HostPort.parse(engine)
    return HostPort(at.host, port or at.port + offset)


def events_endpoint(engine: str, port: int, offset: int) -> str:
    """The engine's event publisher: on its host at ``port``, else at its own port + ``offset``
    (several engines on one host, as ``kvgate emulate --kv-events-port`` numbers them)."""
    return f"tcp://{_publisher(engine, port, offset)}"


def replay_endpoint(engine: str, port: int, offset: int, replay_offset: int) -> str | None:
    """The replay socket of the engine's publisher: at the publisher's port plus
    ``replay_offset`` (vLLM's ``replay_endpoint``; ``kvgate emulate`` numbers both from the
    same instance index, so the distance is the same for every instance). 0: none."""
    if not replay_offset:
        return None
    at = _publisher(engine, port, offset)
    return f"tcp://{HostPort(at.host, at.port + replay_offset)}"


def decode(frames: list[bytes]) -> tuple[int, list[Any]]:
    """A message's sequence number and events; ValueError if it is not vLLM's framing."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"not a KV event message: {len(frames)} frames")
    return int.from_bytes(frames[1], "big"), _events(frames[2])


def _events(payload: bytes) -> list[Any]:
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a KVEventBatch payload")
    return batch[1]


async def replay(context: zmq.asyncio.Context, endpoint: str, start: int,
                 end: int) -> list[tuple[int, list[Any]]]:
    """The messages from ``start`` up to (not including) ``end`` that the replay socket at
    ``endpoint`` still buffers, in order. vLLM's reply (``_service_replay``) to a DEALER: per
    message from ``start`` on, ``[b"", topic, sequence, payload]`` (vLLM 0.32, as on the PUB
    socket) or ``[b"", sequence, payload]`` (vLLM's main branch), then the end marker, the same
    with END_SEQ as its sequence and no payload. ValueError on anything else."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        found: list[tuple[int, list[Any]]] = []
        while True:
            frames = await dealer.recv_multipart()
            if len(frames) not in (3, 4) or frames[0] or len(frames[-2]) != 8:
                raise ValueError(f"not a replay reply: {len(frames)} frames")
            if frames[-2] == END_SEQ:
                return found
            seq = int.from_bytes(frames[-2], "big")
            if start <= seq < end:
                found.append((seq, _events(frames[-1])))
    finally:
        dealer.close(linger=0)


class EventSubscription:
    """Reads one engine's stream into ``residency`` while :meth:`run` runs."""

    def __init__(self, context: zmq.asyncio.Context, engine: str, endpoint: str,
                 residency: EngineResidency, topic: bytes = b"",
                 replay: str | None = None) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.replay = replay  # the publisher's replay socket (None: gaps forget the engine)
        self.residency = residency
        self.messages = 0
        self.gaps = 0
        self.replayed = 0  # messages recovered from the replay socket after a gap
        self.caught_up = 0  # ... and from before the first message heard (:meth:`_catch_up`)
        self.lost = False  # the residency was forgotten since the collector last looked
        self._context = context
        self._socket = context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self._socket.subscribe(topic)
        self._seq: int | None = None
        self._caught_up = False  # the replay socket was asked for what came before joining

    async def run(self) -> None:
        try:
            while True:
                await self.take(await self._socket.recv_multipart())
        finally:
            self.close()

    def close(self) -> None:
        """Closes the subscription's socket (run closes it as it ends)."""
        self._socket.close(linger=0)

    async def take(self, frames: list[bytes]) -> None:
        try:
            seq, events = decode(frames)
        except (ValueError, msgpack.UnpackException) as exc:
            log.warning("kv_events_unreadable", engine=self.engine, reason=str(exc))
            self._forget()
            return
        if self._seq is None and not self._caught_up:
            self._caught_up = True
            await self._catch_up(seq)
        elif self._seq is not None and seq != self._seq + 1:
            self.gaps += 1
            # A sequence that went back is a restarted publisher: nothing to replay.
            if not (seq > self._seq and await self._recover(self._seq + 1, seq)):
                self._forget()
        self._seq = seq
        self._apply(events)

    async def _catch_up(self, first: int) -> None:
        """A stream joined at message `first`: what the replay socket still buffers before it,
        as if followed from there. Without it, a conversation already under way is never known
        here: its next blocks' parent was stored before (kvgate.fleet.residency). So a collector
        started afresh (a control plane restarted, a new leader) knows the engine's recent past."""
        if self.replay is None or first == 0:
            return
        try:
            buffered = await asyncio.wait_for(
                replay(self._context, self.replay, 0, first), REPLAY_WITHIN_S)
        except (TimeoutError, ValueError, msgpack.UnpackException, zmq.ZMQError) as exc:
            log.warning("kv_events_catch_up_failed", engine=self.engine, reason=repr(exc))
            return
        run = _leading_to(buffered, first)
        for _, events in run:
            self._apply(events)
        self.caught_up += len(run)

    async def _recover(self, start: int, end: int) -> bool:
        """Applies the missed messages [start, end) from the replay socket; False when it is
        not configured, does not answer in time, or no longer buffers all of them."""
        if self.replay is None:
            return False
        try:
            missed = await asyncio.wait_for(
                replay(self._context, self.replay, start, end), REPLAY_WITHIN_S)
        except (TimeoutError, ValueError, msgpack.UnpackException, zmq.ZMQError) as exc:
            log.warning("kv_events_replay_failed", engine=self.engine, reason=repr(exc))
            return False
        if [seq for seq, _ in missed] != list(range(start, end)):
            log.warning("kv_events_replay_short", engine=self.engine, missed=end - start,
                        replayed=len(missed))
            return False
        for _, events in missed:
            self._apply(events)
        self.replayed += len(missed)
        return True

    def _apply(self, events: list[Any]) -> None:
        self.messages += 1
        self.residency.apply(e for e in events if isinstance(e, dict))

    def _forget(self) -> None:
        self.residency.lost()
        self.lost = True
        self._seq = None


def _leading_to(messages: list[tuple[int, list[Any]]],
                end: int) -> list[tuple[int, list[Any]]]:
    """The unbroken run of `messages` (in order) whose last one is just before `end`: what can
    be applied before message `end` without a gap."""
    run: list[tuple[int, list[Any]]] = []
    for seq, events in reversed(messages):
        if seq != end - 1 - len(run):
            break
        run.append((seq, events))
    return run[::-1]


def _session_key(raw: str) -> str | None:
    """The id vLLM was sent (the client's session header, passed through) as kvgate keys it."""
    return normalize_session(raw.encode())


class EventSubscriptions:
    """One subscription per engine, following the active engines (:meth:`follow`)."""

    def __init__(self) -> None:
        self._context: zmq.asyncio.Context | None = None
        self.engines: dict[str, tuple[EventSubscription, asyncio.Task[None]]] = {}

    def follow(self, engines: dict[str, EventsAt]) -> list[str]:
        """Subscribe to each engine's publisher (engine → its stream and replay endpoints),
        again where a reader failed or the endpoints changed; drop the others. Returns the
        engines whose residency is gone (dropped, or subscribed again from nothing)."""
        dropped = []
        for engine, (sub, task) in list(self.engines.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("kv_events_reader_failed", engine=engine,
                            reason=repr(task.exception()))
            if engines.get(engine) != (sub.endpoint, sub.replay) or task.done():
                self._drop(engine)
                dropped.append(engine)
        for engine, (endpoint, replay_at) in engines.items():
            if engine not in self.engines:
                if self._context is None:
                    self._context = zmq.asyncio.Context()
                residency = EngineResidency(session_key=_session_key)
                sub = EventSubscription(self._context, engine, endpoint, residency,
                                        replay=replay_at)
                self.engines[engine] = (sub, asyncio.ensure_future(sub.run()))
        return dropped  # subscribed again or not, what was known of each is gone

    def residency(self, engine: str) -> EngineResidency | None:
        held = self.engines.get(engine)
        return None if held is None else held[0].residency

    def _drop(self, engine: str) -> None:
        sub, task = self.engines.pop(engine)
        task.cancel()
        task.add_done_callback(lambda _: sub.close())  # a task cancelled before it ran too

    async def close(self) -> None:
        tasks = [task for _, task in self.engines.values()]
        for engine in list(self.engines):
            self._drop(engine)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._context is not None:
            self._context.term()
            self._context = None
