"""One engine's KV cache event stream, read into its :class:`EngineResidency`.

vLLM's publisher (vllm/distributed/kv_events.py ``ZmqEventPublisher``) sends multipart
``[topic, sequence (8-byte big-endian), msgpack payload]`` on a ZeroMQ PUB socket, the payload a
``KVEventBatch`` ``[ts, [events...], data_parallel_rank]``. A PUB socket drops what a slow or
late subscriber misses, and the sequence shows it: after a gap the residency forgets the engine
(nothing known until its sessions store again) rather than answer from a partial record.
vLLM's replay socket could fill the gap; it is not asked here, since a second port per engine
would be needed in the config, and one engine's residency lost for a turn costs only a guess.
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


def events_endpoint(engine: str, port: int, offset: int) -> str:
    """The engine's event publisher: on its host at ``port``, else at its own port + ``offset``
    (several engines on one host, as ``kvgate emulate --kv-events-port`` numbers them)."""
    at = HostPort.parse(engine)
    return f"tcp://{HostPort(at.host, port or at.port + offset)}"


def decode(frames: list[bytes]) -> tuple[int, list[Any]]:
    """A message's sequence number and events; ValueError if it is not vLLM's framing."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"not a KV event message: {len(frames)} frames")
    batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a KVEventBatch payload")
    return int.from_bytes(frames[1], "big"), batch[1]


class EventSubscription:
    """Reads one engine's stream into ``residency`` while :meth:`run` runs."""

    def __init__(self, context: zmq.asyncio.Context, engine: str, endpoint: str,
                 residency: EngineResidency, topic: bytes = b"") -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.residency = residency
        self.messages = 0
        self.gaps = 0
        self.lost = False  # the residency was forgotten since the collector last looked
        self._socket = context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self._socket.subscribe(topic)
        self._seq: int | None = None

    async def run(self) -> None:
        try:
            while True:
                self.take(await self._socket.recv_multipart())
        finally:
            self._socket.close(linger=0)

    def take(self, frames: list[bytes]) -> None:
        try:
            seq, events = decode(frames)
        except (ValueError, msgpack.UnpackException) as exc:
            log.warning("kv_events_unreadable", engine=self.engine, reason=str(exc))
            self._forget()
            return
        if self._seq is not None and seq != self._seq + 1:
            self.gaps += 1
            self._forget()
        self._seq = seq
        self.messages += 1
        self.residency.apply(e for e in events if isinstance(e, dict))

    def _forget(self) -> None:
        self.residency.lost()
        self.lost = True
        self._seq = None


def _session_key(raw: str) -> str | None:
    """The id vLLM was sent (the client's session header, passed through) as kvgate keys it."""
    return normalize_session(raw.encode())


class EventSubscriptions:
    """One subscription per engine, following the active engines (:meth:`follow`)."""

    def __init__(self) -> None:
        self._context: zmq.asyncio.Context | None = None
        self.engines: dict[str, tuple[EventSubscription, asyncio.Task[None]]] = {}

    def follow(self, engines: dict[str, str]) -> list[str]:
        """Subscribe to each engine's endpoint (engine → endpoint), again where a reader
        failed; drop the others. Returns the engines dropped (their residency is gone)."""
        dropped = []
        for engine, (sub, task) in list(self.engines.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("kv_events_reader_failed", engine=engine,
                            reason=repr(task.exception()))
            if engines.get(engine) != sub.endpoint or task.done():
                self._drop(engine)
                dropped.append(engine)
        for engine, endpoint in engines.items():
            if engine not in self.engines:
                if self._context is None:
                    self._context = zmq.asyncio.Context()
                residency = EngineResidency(session_key=_session_key)
                sub = EventSubscription(self._context, engine, endpoint, residency)
                self.engines[engine] = (sub, asyncio.ensure_future(sub.run()))
        return [e for e in dropped if e not in self.engines]

    def residency(self, engine: str) -> EngineResidency | None:
        held = self.engines.get(engine)
        return None if held is None else held[0].residency

    def _drop(self, engine: str) -> None:
        _, task = self.engines.pop(engine)
        task.cancel()

    async def close(self) -> None:
        tasks = [task for _, task in self.engines.values()]
        for engine in list(self.engines):
            self._drop(engine)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._context is not None:
            self._context.term()
            self._context = None
