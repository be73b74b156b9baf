"""Session traffic for discovery tests: sessions talking in turns through the gateway, every
answer noted with the engine that gave it (the emulator's `x-engine-id`); the endpoint records
discovery writes, and an engine's drain as the sessions see it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import count

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config.model import Config
from kvgate.endpoints import EndpointRecord, EndpointRecords
from kvgate.endpoints.records import record_key
from kvgate.etcd import EtcdClient, KeyValue
from kvgate.placement.ring import EnvoyRing, session_hash
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

    def last(since: float) -> dict[str, str | None]:
        """Each session's last engine since `since` (None: no answer since)."""
        return {s: ends[-1] if (ends := traffic.engines_of(s, since)) else None
                for s in sessions}

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
    await eventually(partial(last, since), until=lambda ends: set(ends.values()) <= siblings,
                     what=f"{leaving}'s sessions ending on {sorted(siblings)} after the drain")
    early = [(t, s, e) for t, s, e in traffic.answers
             if s in sessions and e != leaving and t < deadline_mono - 0.2]
    assert early == [], "a session moved before its drain's deadline"
    return {s: traffic.engines_of(s, since)[-1] for s in sessions}


def placed_on(engine: str, pool: list[str]) -> Iterator[str]:
    """New session ids that ext_proc's first placement puts on `engine` once it is one of
    `pool`'s engines (weight 1 each, no load gate, `engine` under its load bound): Envoy's ring
    over `pool` picks it for them. Before that they land elsewhere, so the first of them that
    lands on `engine` shows the gateway places there, not the hash's luck."""
    ring = EnvoyRing([(address, 1) for address in pool])
    return (session for session in (f"new-{engine}-{i}" for i in count(1))
            if ring.pick(session_hash(session.encode())) == engine)


@dataclass(frozen=True, slots=True)
class Ready:
    """When (monotonic) the gateway could first place sessions on a new engine: etcd held its
    record, ext_proc's endpoints mirror had reached that record's revision, and Envoy listed
    it among its cluster's hosts (EDS)."""

    record: float
    ext_proc: float
    envoy: float

    @property
    def gateway(self) -> float:
        return max(self.ext_proc, self.envoy)


async def ready_for(engine: str, etcd: EtcdClient, prefix: str, ext_proc_metrics: str,
                    envoy_admin: str, pool: str = "coder", every: float = 0.02) -> Ready:
    """Polls, every `every` seconds, until the gateway can place sessions on `engine`."""
    key = record_key(prefix, pool, engine)
    found: KeyValue | None = await eventually(lambda: etcd.get(key),
                                              until=lambda kv: kv is not None,
                                              every=every, what=f"{engine}'s record")
    recorded = time.monotonic()
    assert found is not None
    async with httpx.AsyncClient(timeout=5) as http:
        async def mirrored() -> bool:
            page = (await http.get(f"http://{ext_proc_metrics}/metrics")).text
            return any(sample.labels.get("mirror") == "endpoints"
                       and sample.value >= found.mod_revision
                       for family in text_string_to_metric_families(page)
                       if family.name == "kvgate_etcd_mirror_revision"
                       for sample in family.samples)

        async def listed() -> bool:
            return f"::{engine}::" in (await http.get(f"http://{envoy_admin}/clusters")).text

        async def when(check: Callable[[], Awaitable[bool]], what: str) -> float:
            await eventually(check, until=lambda ok: ok, every=every, what=what)
            return time.monotonic()

        mirror_at, envoy_at = await asyncio.gather(
            when(mirrored, f"ext_proc's endpoints mirror at {engine}'s record"),
            when(listed, f"Envoy listing {engine}"))
    return Ready(recorded, mirror_at, envoy_at)


@dataclass(frozen=True, slots=True)
class Try:
    """One new session of a probe: when it was sent and answered (monotonic), and by whom."""

    sent: float
    answered: float
    engine: str  # "" if it failed


@dataclass(frozen=True, slots=True)
class Landed:
    """The new sessions a probe sent after a change until one landed on its engine."""

    changed: float  # when the change was made (monotonic)
    first: Try  # the first to land, by its answer
    tries: tuple[Try, ...]  # all of them, in the order they were answered

    @property
    def slowest(self) -> float:
        """The longest round trip of a try: the probe's own delay."""
        return max(t.answered - t.sent for t in self.tries)


async def first_new_session_on(traffic: Traffic, engine: str,
                               change: Callable[[], Awaitable[float]], within: float,
                               sessions: Iterator[str] | None = None, probes: int = 1,
                               ) -> Landed | None:
    """After `change` (which returns the monotonic time of the change it made), new sessions
    (from `sessions`, default `new-ENGINE-1`, ...), `probes` at a time, each after the last
    answer of its probe, until one lands on `engine`. None if none got there within `within`.
    With several probes a try the gateway holds up does not hold up the others."""
    fresh = sessions if sessions is not None else (f"new-{engine}-{i}" for i in count(1))
    changed = await change()
    tries: list[Try] = []

    async def probe() -> None:
        while not any(t.engine == engine for t in tries) and time.monotonic() - changed < within:
            sent = time.monotonic()
            on = await traffic.ask(next(fresh), 0)
            tries.append(Try(sent, time.monotonic(), on))

    await asyncio.gather(*(probe() for _ in range(probes)))
    landed = [t for t in tries if t.engine == engine]
    return Landed(changed, landed[0], tuple(tries)) if landed else None


# Envoy's workers take the main thread's EDS update a moment after its admin lists the host: a new
# session sent this long after the gateway could place on a new engine must land there.
SETTLE_S = 0.1


@dataclass(frozen=True, slots=True)
class Arrival:
    """A new engine's arrival as the gateway timed it (`ready`) and as new sessions showed it
    (`landed`)."""

    ready: Ready
    landed: Landed

    def after_change(self) -> dict[str, float]:
        """Seconds from the change to each step: etcd's record, ext_proc's mirror, Envoy, the
        gateway (the later of the two), the first new session there sent and answered."""
        at, landed = self.ready, self.landed
        steps = {"record": at.record, "ext_proc": at.ext_proc, "envoy": at.envoy,
                 "gateway": at.gateway, "sent": landed.first.sent,
                 "answered": landed.first.answered}
        return {step: when - landed.changed for step, when in steps.items()}

    def elsewhere(self, engine: str) -> list[Try]:
        """New sessions sent from SETTLE_S after the gateway could place on `engine` that landed
        elsewhere: none, if the gateway then did."""
        return [t for t in self.landed.tries
                if t.sent >= self.ready.gateway + SETTLE_S and t.engine != engine]

    def summary(self) -> str:
        s = self.after_change()
        return (f"etcd held the engine's record at {s['record']:.2f} s, ext_proc had it at "
                f"{s['ext_proc']:.2f} s, Envoy at {s['envoy']:.2f} s; the first new session on "
                f"it was sent at {s['sent']:.2f} s, answered at {s['answered']:.2f} s "
                f"({len(self.landed.tries)} tries, the slowest round trip "
                f"{self.landed.slowest:.2f} s)")


async def arrival(traffic: Traffic, engine: str, change: Callable[[], Awaitable[float]],
                  etcd: EtcdClient, config: Config, pool: list[str], within: float,
                  probes: int = 4) -> Arrival:
    """After `change` (which returns the monotonic time of the change that adds `engine` to
    `pool`'s engines), times the gateway itself (`ready_for`) while new sessions Envoy's ring
    puts on `engine` (`placed_on`), `probes` at a time, go until one lands there. Fails if
    none does, or the gateway is not ready, within `within` seconds."""
    ready: list[asyncio.Task[Ready]] = []

    async def changed() -> float:
        when = await change()
        ready.append(asyncio.create_task(ready_for(
            engine, etcd, config.etcd.prefix, str(config.ext_proc.metrics),
            str(config.envoy_admin))))
        return when

    try:
        landed = await first_new_session_on(traffic, engine, changed, within=within,
                                            sessions=placed_on(engine, pool), probes=probes)
        at = await asyncio.wait_for(ready[0], within)
    finally:
        for task in ready:
            task.cancel()
        await asyncio.gather(*ready, return_exceptions=True)
    assert landed is not None, f"no new session landed on {engine} within {within:g} s"
    return Arrival(at, landed)
