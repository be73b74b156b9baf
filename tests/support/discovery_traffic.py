"""Session traffic for discovery tests: sessions talking in turns through the gateway, every
answer noted with the engine that gave it (the emulator's `x-engine-id`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx


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
