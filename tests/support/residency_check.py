"""HBM residency from an engine's KV events, checked against what the engine then reports: the
same plan of turns for the emulator (tests/emulator) and real vLLM (tests/real_vllm).

Sessions converse on two engines whose caches are too small for all of them (so contexts are
evicted), some moving to the other engine halfway; before each turn the residency built from
the target engine's event stream predicts how many of the session's tokens its HBM holds, and
the turn's ``cached_tokens`` says what it really held.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from kvgate.fleet.residency import EngineResidency
from tests.support.conversation import Conversation
from tests.support.kv_events import Subscriber

SESSION_HEADER = "X-Session-ID"  # what vLLM tags its BlockStored events with


@dataclass
class WatchedEngine:
    """One engine: its URL, a subscriber on its event stream, and the residency built from it."""

    url: str
    sub: Subscriber
    hbm: EngineResidency = field(default_factory=EngineResidency)
    stores: Counter[str] = field(default_factory=Counter)  # BlockStored events per session
    gaps: int = 0
    _applied: int = 0
    _seq: int | None = None

    async def pump(self, wait_s: float = 0.0) -> None:
        """Applies every message received so far (waiting up to ``wait_s`` for one)."""
        while await self.sub.receive(wait_s) is not None:
            wait_s = 0.0
        for message in self.sub.received[self._applied:]:
            if self._seq is not None and message.seq != self._seq + 1:
                self.gaps += 1
                self.hbm.lost()
            self._seq = message.seq
            events = message.events
            self.hbm.apply(events)
            self.stores.update(e["session_id"] for e in events
                               if e["type"] == "BlockStored" and e.get("session_id"))
        self._applied = len(self.sub.received)

    async def until_stored(self, session: str, before: int, within_s: float = 30.0) -> None:
        """Until the session's store of the turn just answered has arrived."""
        deadline = time.monotonic() + within_s
        while self.stores[session] <= before:
            assert time.monotonic() < deadline, f"no BlockStored for {session} arrived"
            await self.pump(0.2)


@dataclass(frozen=True)
class Row:
    session: str
    engine: int
    moved: bool
    predicted: int | None  # None: nothing known of the session on that engine
    cached: int
    prompt: int

    @property
    def guess(self) -> int:
        """What the gate would take: nothing known there is nothing held there."""
        return self.predicted or 0

    def agrees(self) -> bool:
        """Context in HBM (at least half the prompt) or not: the same answer both ways."""
        return (self.guess >= self.prompt / 2) == (self.cached >= self.prompt / 2)


async def converse(engines: list[WatchedEngine], http: httpx.AsyncClient, block_size: int, *,
                   sessions: int = 8, rounds: int = 8, context: int = 600,
                   move_round: int = 2) -> list[Row]:
    """Every session takes a turn per round on its engine (alternating homes); in
    ``move_round`` every other session moves to the other engine and stays there. A question
    is a block long, so every turn stores a block (and its events say whose)."""
    talks = [Conversation(f"res-{i}", seed=300 + i, context=context, question=block_size,
                          answer=8) for i in range(sessions)]
    home = {t.session: i % len(engines) for i, t in enumerate(talks)}
    rows = []
    for r in range(rounds):
        for i, talk in enumerate(talks):
            moved = r == move_round and i % 2 == 0
            if moved:
                home[talk.session] = (home[talk.session] + 1) % len(engines)
            engine = engines[home[talk.session]]
            await engine.pump()
            predicted = engine.hbm.hbm_tokens(talk.session)
            before = engine.stores[talk.session]
            turn = await talk.turn(http, engine.url, {SESSION_HEADER: talk.session})
            await engine.until_stored(talk.session, before)
            if r:  # a first turn has nothing to hold anywhere
                rows.append(Row(talk.session, home[talk.session], moved, predicted,
                                turn.cached, turn.prompt))
    return rows


def summary(rows: list[Row], block_size: int) -> str:
    exact = sum(r.guess == r.cached for r in rows)
    near = sum(abs(r.guess - r.cached) <= block_size for r in rows)
    agree = sum(r.agrees() for r in rows)
    moved = [r for r in rows if r.moved]
    evicted = sum(r.cached < r.prompt / 2 for r in rows if not r.moved)
    return (f"{len(rows)} turns ({len(moved)} moved, {evicted} sticky with the context "
            f"evicted): in HBM or not agrees {agree}/{len(rows)}, tokens exact {exact}, within "
            f"a block {near}")
