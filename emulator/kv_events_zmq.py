"""Publish one instance's KV cache events as vLLM's ``ZmqEventPublisher`` does.

Wire format (vLLM 0.32/0.33, ``vllm/distributed/kv_events.py``): a PUB socket; each message is
multipart ``[topic, sequence, payload]``, the sequence an 8-byte big-endian count from 0, the
payload a msgpack ``KVEventBatch`` (:func:`emulator.kv_events.encode_batch`). With a replay
endpoint, a ROUTER socket serves missed messages (``ZmqEventPublisher._service_replay``): a
client (a DEALER or REQ) sends its start sequence as 8 big-endian bytes and gets every buffered
message from it, framed as on the PUB socket, then an end marker ``[b"", (-1 as 8 signed bytes),
b""]``. That is vLLM 0.32's framing, read in its installed source and checked against a running
engine (tests/real_vllm/test_kv_events_vs_emulator.py); vLLM's main branch has dropped the topic
frame from the replies, which kvgate's reader (kvgate.fleet.kv_events.replay) accepts too.

Events gathered during one engine step (here: one decode step of wall time, at most 50 ms; no
wait at all with time scale 0) go out as one batch. Everything runs on the event loop: the PUB
socket never blocks (past its high-water mark ZeroMQ drops, as vLLM's does), and the replay
socket is served by a task.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import structlog
import zmq
import zmq.asyncio

from emulator.kv_events import KvEventLog, encode_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)
log = structlog.get_logger("emulator.kv_events")

_context: zmq.Context[zmq.Socket[bytes]] | None = None


def _shared_context() -> zmq.Context[zmq.Socket[bytes]]:
    """One ZeroMQ context (one I/O thread) for every publisher of the process."""
    global _context
    if _context is None or _context.closed:
        _context = zmq.Context()
    return _context


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _bind(sock: zmq.Socket[Any], host: str, port: int) -> int:
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    sock.bind(tcp_endpoint(host, port))
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return int(endpoint.rsplit(":", 1)[1])


class KvEventPublisher:
    """Sends what a :class:`KvEventLog` gathers; ``port`` 0 binds a free port (see
    :attr:`port` after :meth:`start`)."""

    def __init__(self, events: KvEventLog, host: str, port: int, *, topic: str = "kv",
                 replay_port: int | None = None, step_s: float = 0.0,
                 buffer_steps: int = 10_000, hwm: int = 100_000) -> None:
        self.events = events
        self.host = host
        self.port = port
        self.replay_port = replay_port
        self.topic = topic.encode()
        self.step_s = max(0.0, min(step_s, 0.05))
        self.sent = 0  # messages published
        self._hwm = hwm
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._flush: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Bind the PUB (and replay) sockets; from now on the log's events are published."""
        self._loop = asyncio.get_running_loop()
        context = _shared_context()
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(self._hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.port = _bind(self._pub, self.host, self.port)
        if self.replay_port is not None:
            self._replay = zmq.asyncio.Context.shadow(context.underlying).socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (self._buffer.maxlen or 0) + 2)
            self.replay_port = _bind(self._replay, self.host, self.replay_port)
            self._replay_task = asyncio.create_task(self._serve_replay())
        self.events.on_event = self._schedule
        log.info("kv_events_publishing", endpoint=tcp_endpoint(self.host, self.port),
                 replay_port=self.replay_port, topic=self.topic.decode())

    def _schedule(self) -> None:
        """The log has events: send them at the end of this step."""
        if self._flush is not None or self._loop is None:
            return
        if self.step_s > 0:
            self._flush = self._loop.call_later(self.step_s, self.flush)
        else:
            self._flush = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Publish the events gathered so far as one batch (nothing when there are none)."""
        self._flush = None
        events = self.events.take()
        if not events or self._pub is None:
            return
        seq = self.sent
        payload = encode_batch(time.time(), events)
        self.sent += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                     flags=zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: dropped, as vLLM's PUB socket would
            log.warning("kv_events_dropped", seq=seq)

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("kv_events_bad_replay_request", frames=len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await self._replay.send_multipart(
                        (client, b"", self.topic, seq.to_bytes(8, "big"), payload))
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        """Send what is pending, then close the sockets."""
        if self._flush is not None:
            self._flush.cancel()
            self.flush()
        self.events.on_event = None
        if self._replay_task is not None:
            self._replay_task.cancel()
            await asyncio.gather(self._replay_task, return_exceptions=True)
            self._replay_task = None
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
