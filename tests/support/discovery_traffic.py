"""Session traffic for discovery tests: sessions talking in turns through the gateway, every
answer noted with the engine that gave it (the emulator's `x-engine-id`); the endpoint records
discovery writes, and an engine's drain as the sessions see it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import httpx

from kvgate.endpoints import EndpointRecord, EndpointRecords
from kvgate.etcd import EtcdClient
from tests.support.polling import eventually


def _chat(session: str, turn: int) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": f"# the repository of {session}\n" * 40},
                         {"role": "user", "content": f"question {turn}"}], "max_tokens": 2}


@dataclass
class Traffic:
    """Sessions talking in turns; every answer noted as (time, session, engine)."""

    http: httpx.AsyncClient
    answers: list[tuple[float, str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    talkers: list[asyncio.Task[None]] = field(default_factory=list)

    async def ask(self, session: str, turn: int) -> str:
        reply = await self.http.post("/v1/chat/completions", json=_chat(session, turn),
                                     headers={"x-session-id": session})
        if reply.status_code != 200:
            self.failures.append(f"{session}: {reply.status_code} {reply.text[:200]}")
            return ""
        engine = reply.headers["x-engine-id"]
        self.answers.append((time.monotonic(), session, engine))
        return engine

    async def talk(self, session: str) -> None:
        turn = 0
        while not self.stop.is_set():
            await self.ask(session, turn)
            turn += 1

    def engines_of(self, session: str, since: float = 0.0) -> list[str]:
        return [e for t, s, e in self.answers if s == session and t >= since]

    def talk_on(self, sessions: list[str]) -> None:
        """`sessions` talking in the background until `close`."""
        self.talkers += [asyncio.create_task(self.talk(s)) for s in sessions]

    async def start(self, sessions: list[str]) -> None:
        """`sessions` talking in the background, once each has been answered."""
        self.talk_on(sessions)
        await eventually(lambda: {s for _, s, _ in self.answers} >= set(sessions),
                         what="every session answered")

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.talkers)


Records = dict[str, EndpointRecord]  # address → its record


async def engine_records(client: EtcdClient, prefix: str, pool: str = "coder") -> Records:
    return {r.address: r for r in await EndpointRecords(client, prefix).list(pool)}


async def drained(traffic: Traffic, etcd: EtcdClient, prefix: str, leaving: str,
                  sessions: list[str], siblings: set[str]) -> dict[str, str]:
    """`leaving`'s record drains, then goes; its `sessions` end on `siblings`, none of them
    before the drain's deadline. Returns where each session ended."""
    def draining(records: Records) -> bool:
        return records[leaving].drain_deadline is not None

    def gone(records: Records) -> bool:
        return leaving not in records

    def ended(since: float) -> bool:
        return all(traffic.engines_of(s, since)[-1:] and traffic.engines_of(s, since)[-1]
                   in siblings for s in sessions)

    listed = partial(engine_records, etcd, prefix)
    deadline = (await eventually(listed, until=draining,
                                 what=f"{leaving} draining"))[leaving].drain_deadline
    assert deadline is not None
    # Wall clock to monotonic: the record's deadline is unix time.
    deadline_mono = time.monotonic() + (deadline - time.time())
    await eventually(listed, until=gone, what=f"{leaving}'s record removed")
    since = time.monotonic()
    # Answers in flight when the record went may still come from the leaving engine: the
    # sessions end on its siblings.
    await eventually(partial(ended, since),
                     what=f"{leaving}'s sessions ending on {sorted(siblings)} after the drain")
    early = [(t, s, e) for t, s, e in traffic.answers
             if s in sessions and e != leaving and t < deadline_mono - 0.2]
    assert early == [], "a session moved before its drain's deadline"
    return {s: traffic.engines_of(s, since)[-1] for s in sessions}


async def first_new_session_on(traffic: Traffic, engine: str,
                               change: Callable[[], Awaitable[float]],
                               within: float) -> tuple[float, float] | None:
    """After `change` (which returns the monotonic time of the change it made), new sessions one
    after the other until one lands on `engine`: the seconds from the change to when that one
    was sent and to when it was answered (its placement happened between the two). None if
    none got there within `within`."""
    changed = await change()
    index = 0
    while time.monotonic() - changed < within:
        index += 1
        sent = time.monotonic()
        if await traffic.ask(f"new-{engine}-{index}", 0) == engine:
            return sent - changed, time.monotonic() - changed
    return None
