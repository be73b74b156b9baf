"""Traffic for fault tests, and its account: many sessions through the gateway, new ones
arriving all the time, every answer streamed as an engine streams it, every request recorded
(which engine answered, when, and how it ended: failed before its stream began, cut in the
middle of it, or whole), then checked against the bindings etcd holds at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvgate.session import normalize_session


@dataclass(frozen=True, slots=True)
class Served:
    session: str
    start: float
    end: float
    engine: str | None  # None: it failed before its answer began
    error: str = ""
    cut: bool = False  # its answer began (`engine` said who) and stopped before its end


@dataclass
class Traffic:
    """``workers`` sessions at a time, each of ``turns`` requests in a row (``think_s`` apart),
    then a new one."""

    url: str
    workers: int = 8
    turns: int = 5
    think_s: float = 0.0
    body_bytes: int = 0  # each request POSTs a prompt this long (the gate reads its length)
    events: int = 3  # each answer streamed: who answers, this many events (10 ms apart), [DONE]
    served: list[Served] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def _session(self, http: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            session = f"chaos-{next(self._ids)}"
            for _ in range(self.turns):
                if self._stop.is_set():
                    return
                start = time.monotonic()
                engine, cut, error = await self._ask(http, session)
                self.served.append(Served(session, start, time.monotonic(), engine, error, cut))
                if self.think_s:
                    await asyncio.sleep(self.think_s)  # the client's pace, not a wait

    async def _ask(self, http: httpx.AsyncClient, session: str
                   ) -> tuple[str | None, bool, str]:
        """One turn: (the engine that answered, whether its stream was cut, the error)."""
        engine: str | None = None
        try:
            async with http.stream(
                    "POST" if self.body_bytes else "GET", "/v1/chat",
                    params={"stream": self.events} if self.events else None,
                    headers={"x-session-id": session},
                    content=b"x" * self.body_bytes if self.body_bytes else None) as reply:
                if reply.status_code != 200:
                    return None, False, f"HTTP {reply.status_code}"
                if not self.events:
                    return json.loads(await reply.aread())["upstream"], False, ""
                async for line in reply.aiter_lines():
                    data = line.removeprefix("data: ")
                    if data == line:
                        continue  # the blank line between events
                    if engine is None:
                        engine = json.loads(data)["upstream"]
                    elif data == "[DONE]":
                        return engine, False, ""
                return engine, engine is not None, "the stream ended before [DONE]"
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return engine, engine is not None, type(exc).__name__

    async def run(self) -> None:
        """Until :meth:`stop`; every request it started ends before this returns."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
            await asyncio.gather(*(self._session(http) for _ in range(self.workers)))

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class Account:
    """One row of the fault table."""

    fault: str
    requests: int
    failed: int  # no answer: failed before its stream began
    sessions: int
    split: int  # sessions answered by two engines
    lost: int  # sessions whose binding is gone, or names another engine than their last
    faults: int
    slowest_s: float
    errors: tuple[str, ...] = ()
    missing: int = 0  # of `lost`: no binding at all
    # Of `split`: sessions whose engines interleave (A, B, A: both served it over overlapping
    # times, the cache split); the rest moved once (A, then only B).
    interleaved: int = 0
    # Each session on two engines, its turns in order and its binding as etcd holds it (a
    # move's reason and time): what a failed assertion shows of a split.
    on_two: tuple[str, ...] = ()
    # Each session etcd holds no binding for, its turns in order: what a failed assertion shows
    # of a lost binding.
    unbound: tuple[str, ...] = ()
    cut: int = 0  # answers that began and stopped before their end
    rebinds: int = 0  # bindings etcd holds with a move recorded (the session moved)
    # Seconds from the fault's end until the gateway decided on bindings again and stayed so
    # (tests/support/recovery.py); None: not back.
    recovery_s: float | None = None

    HEADER = ("| fault | requests | failed before streaming | cut mid-stream | sessions "
              "| on two engines (interleaved) | bindings lost | re-binds | faults | recovery "
              "| slowest request |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def row(self) -> str:
        recovery = "not back" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        return (f"| {self.fault} | {self.requests} | {self.failed} | {self.cut} "
                f"| {self.sessions} | {self.split} ({self.interleaved}) | {self.lost} "
                f"| {self.rebinds} | {self.faults} | {recovery} | {self.slowest_s:.2f} s |")


def account(fault: str, served: list[Served], bindings: dict[str, dict[str, Any]],
            faults: int, failed_over: Collection[str] = (),
            expired_before: float | None = None) -> Account:
    """``bindings``: session uuid -> the binding's stored value, as etcd holds them at the end.
    ``failed_over``: engines the fault failed, whose sessions' bindings the failover moves
    elsewhere as it should (one answered last by such an engine and bound elsewhere is not
    lost). ``expired_before``: a session whose last turn started before this (monotonic time)
    has been idle past its TTL when the bindings were read; its binding may have expired."""
    in_order = sorted(served, key=lambda s: s.start)
    engines = engines_by_session(in_order)
    last_turn = {s.session: s.start for s in in_order}
    missing: list[str] = []
    moved = 0
    for session, answered in engines.items():
        key = normalize_session(session.encode())
        value = None if key is None else bindings.get(key)
        held = None if value is None else value["endpoint"]
        if held is None:
            if expired_before is None or last_turn[session] >= expired_before:
                missing.append(session)
        elif held != answered[-1] and answered[-1] not in failed_over:
            moved += 1
    failed = [s for s in served if s.engine is None]
    return Account(fault, len(served), len(failed), len(engines),
                   sum(len(set(e)) > 1 for e in engines.values()), len(missing) + moved,
                   faults, max((s.end - s.start for s in served), default=0.0),
                   tuple(sorted({s.error for s in failed})), len(missing),
                   sum(_interleaved(e) for e in engines.values()),
                   tuple(_turns(session, in_order, bindings) for session, e in engines.items()
                         if len(set(e)) > 1),
                   tuple(_turns(session, in_order, bindings) for session in missing),
                   cut=sum(s.cut for s in served),
                   rebinds=sum("reason" in value for value in bindings.values()))


def engines_by_session(served: list[Served]) -> dict[str, list[str]]:
    """Each session's answering engines, in the order its requests started."""
    engines: dict[str, list[str]] = defaultdict(list)
    for s in sorted(served, key=lambda s: s.start):
        if s.engine is not None:
            engines[s.session].append(s.engine)
    return engines


def _turns(session: str, in_order: list[Served], bindings: dict[str, dict[str, Any]]) -> str:
    """`session`'s answered turns (engine, start on the wall clock) and its stored binding;
    `in_order`: every request, by start."""
    wall = time.time() - time.monotonic()
    turns = ", ".join(f"{s.engine}@{s.start + wall:.3f}" for s in in_order
                      if s.session == session and s.engine is not None)
    key = normalize_session(session.encode())
    return f"{session}: {turns}; binding {None if key is None else bindings.get(key)}"


def mid_conversation(served: list[Served], engine: str, turns: int, ahead: int) -> list[str]:
    """The sessions whose last answered turn `engine` answered and that have at least `ahead`
    of their `turns` (Traffic.turns) still to be decided, besides the one under way: `served`
    lists a turn once it has ended, and the session's next turn starts at once."""
    asked = Counter(s.session for s in served)
    last: dict[str, str] = {}
    for s in served:  # a session's turns end in the order they were asked
        if s.engine is not None:
            last[s.session] = s.engine
    return [session for session, answered in last.items()
            if answered == engine and turns - asked[session] - 1 >= ahead]


def runs(answered: list[str]) -> list[str]:
    """The engines that answered a session, each run of turns on one engine once, in order."""
    return [e for i, e in enumerate(answered) if i == 0 or e != answered[i - 1]]


def _interleaved(answered: list[str]) -> bool:
    """An engine answers again after another one did."""
    engines = runs(answered)
    return len(engines) != len(set(engines))
