"""The fleet-state collector (`placement.load_gate.source: collector`): the gateway's one
scraper of engine load. The control-plane leader runs it: it already knows the engines and
probes them. Every `refresh_s` it scrapes each active engine once (kvgate.fleet.scrape) and
wakes whoever watches (the admin API's WatchFleetLoad streams, one per ext_proc replica), so
each engine is scraped once per interval whatever the number of replicas. With
`kv_events_port` (or `_offset`) it also reads every active engine's KV event stream
(kvgate.fleet.kv_events) and each round names the sessions whose HBM residency changed.

Figures stay in this process's memory, stamped with its own monotonic clock; they leave as
ages (`Fleet.ages`), so no two hosts' clocks are ever compared. Nothing goes through etcd.
While it does not collect it holds no figures; a follower still reads the engines' event
streams, so that what it knows of their HBM is current when it leads, however often leadership
comes and goes (a stream read afresh knows nothing of the conversations already under way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import structlog

from kvgate.config.sections.placement import GateConfig
from kvgate.fleet.kv_events import EventsAt, EventSubscriptions, events_endpoint, replay_endpoint
from kvgate.fleet.scrape import EngineFigures, EngineScrapeMetrics, Pages, ScrapeRounds
from kvgate.placement.evictions import EvictionRate

log = structlog.get_logger("kvgate.fleet")


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    """What the collector reads from the running config at every round (so a reload applies)."""

    configured: bool  # the gate is on and its source is the collector
    leading: bool  # this control-plane replica leads
    refresh_s: float
    timeout_s: float  # a scrape slower than this is abandoned
    # `placement.load_gate`: where each engine publishes its KV events (kv_events_port...)
    gate: GateConfig = field(default_factory=GateConfig)


def one_stream_each(endpoints: Mapping[str, EventsAt]) -> dict[str, EventsAt]:
    """The engines whose event stream no other engine's shares. Several engines read from one
    stream (`kv_events_port` on a host that runs several) would each be credited with the
    others' blocks: none of them is followed, and it is said once per set."""
    sharing: dict[str, list[str]] = {}
    for engine, (stream, _) in endpoints.items():
        sharing.setdefault(stream, []).append(engine)
    shared = {stream: engines for stream, engines in sharing.items() if len(engines) > 1}
    for stream, engines in shared.items():
        log.warning("kv_events_stream_shared", stream=stream, engines=engines,
                    hint="several engines on one host need kv_events_port_offset")
    return {e: at for e, at in endpoints.items() if at[0] not in shared}


@dataclass(frozen=True, slots=True)
class Residency:
    """What one engine's HBM holds of one session (None: nothing known of it there now), and
    what the session last stored there (`stored`, None: not known), both in real tokens."""

    endpoint: str
    session: str
    tokens: int | None
    stored: int | None = None


@dataclass(frozen=True, slots=True)
class AgedFigures:
    """One engine's figures as they leave: how old they are, not when they were read."""

    address: str
    figures: EngineFigures
    age_s: float


class FleetCollector:
    """Scrapes every active engine once per round while it is `wanted()`; watchers
    `await next_round(seen)` and read `ages()`."""

    def __init__(
        self, engines: Callable[[], Iterable[str]], settings: Callable[[], CollectorSettings],
        metrics: EngineScrapeMetrics, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = engines
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._read: dict[str, tuple[EngineFigures, float]] = {}  # address → figures, read at
        self.rounds = 0  # rounds completed since it started collecting
        self.collecting = False
        self.watchers = 0  # streams open now (the admin API counts them in and out)
        self._tick = asyncio.Event()  # replaced each round; set to wake the round's watchers
        self._rounds: ScrapeRounds | None = None  # remade when refresh or timeout change
        self.events = EventSubscriptions()  # each engine's KV events (kv_events_port)
        self.residency_changed: list[Residency] = []  # in the last round
        self.residency_lost: list[str] = []  # engines forgotten in the last round
        self._followed: tuple[tuple[int, int, int], frozenset[str]] = ((0, 0, 0), frozenset())
        self._endpoints: dict[str, EventsAt] = {}  # engine → its publisher, for `_followed`
        self._evicting: dict[str, EvictionRate] = {}  # engine → its evictions, sampled per round

    def configured(self) -> bool:
        return self._settings().configured

    def wanted(self) -> bool:
        """It should collect now: configured, and this replica leads."""
        settings = self._settings()
        return settings.configured and settings.leading

    @property
    def refresh_s(self) -> float:
        return self._settings().refresh_s

    @property
    def engines(self) -> int:
        return len(self._read)

    async def run(self) -> None:
        """Runs under the control plane's supervisor until cancelled."""
        async with ScrapeRounds.session() as http, self._events_closed():
            while True:
                settings = self._settings()
                if not (settings.configured and settings.leading):
                    self._stop_collecting()
                    # A follower keeps reading the engines' event streams: what it knows of
                    # their HBM is current the moment it leads (again). Dropped, a stream read
                    # afresh anchors no conversation already under way (kvgate.fleet.residency).
                    self._follow_events(settings if settings.configured else None,
                                        set(self._engines()) if settings.configured else set())
                    self._wake()  # watchers learn at once that figures stopped
                    await asyncio.sleep(settings.refresh_s)
                    continue
                spent = await self.collect_round(http)
                await asyncio.sleep(max(0.0, settings.refresh_s - spent))

    async def collect_round(self, http: Pages) -> float:
        """One round over every active engine, then the watchers are woken; returns the
        seconds it took."""
        settings = self._settings()
        rounds = self._rounds
        if rounds is None or (rounds.refresh_s, rounds.timeout_s) != (settings.refresh_s,
                                                                       settings.timeout_s):
            rounds = self._rounds = ScrapeRounds(self._engines, self.record, settings.refresh_s,
                                                 settings.timeout_s, self._metrics, self._clock)
        self.collecting = True
        spent = await rounds.timed_round(http)
        active = set(self._engines())
        for gone in [a for a in self._read if a not in active]:
            del self._read[gone]  # left the pool, drained or failed: its queue is not ours
        self._gather_residency(settings, active)
        self.rounds += 1
        self._wake()
        return spent

    def record(self, address: str, figures: EngineFigures, at: float) -> None:
        """One engine's figures as read at `at` (the scrape's callback)."""
        self._read[address] = (figures, at)

    def _follow_events(self, settings: CollectorSettings | None, active: set[str]) -> list[str]:
        """Follows the active engines' event streams (None: none); the engines whose residency
        is gone since (dropped, or subscribed again from nothing)."""
        gate = None if settings is None else settings.gate
        wanted = ((0, 0, 0), frozenset()) if gate is None or not gate.kv_events else (
            gate.kv_event_ports, frozenset(active))
        if wanted != self._followed:  # the endpoints are made again only when these change
            self._followed = wanted
            (port, offset, replay), engines = wanted
            self._endpoints = one_stream_each({
                a: (events_endpoint(a, port, offset), replay_endpoint(a, port, offset, replay))
                for a in sorted(engines)})
        return self.events.follow(self._endpoints)

    def _gather_residency(self, settings: CollectorSettings, active: set[str]) -> None:
        """Follows the active engines' event streams; what changed since the last round."""
        lost = self._follow_events(settings, active)
        changed: list[Residency] = []
        now = self._clock()
        evicting = self._evicting
        for engine in [e for e in evicting if e not in self.events.engines]:
            del evicting[engine]
        for engine, (sub, _) in self.events.engines.items():
            if sub.lost:
                sub.lost = False
                lost.append(engine)
            residency = sub.residency
            rate = evicting.get(engine)
            if rate is None:
                rate = evicting[engine] = EvictionRate()
            rate.sample(now, residency.evicted)
            changed.extend(Residency(engine, session, residency.hbm_tokens(session),
                                     residency.stored_tokens(session))
                           for session in residency.take_changed())
        self.residency_changed, self.residency_lost = changed, lost

    def eviction_rate(self, engine: str) -> float | None:
        """Blocks `engine`'s HBM evicted per second over about the last minute, from its KV
        events; None: not known (no events from it, or too few seconds of them)."""
        rate = self._evicting.get(engine)
        return None if rate is None else rate.per_s()

    def residency(self) -> list[Residency]:
        """Every session known on every engine (a stream's first message)."""
        return [Residency(engine, session, tokens, stored)
                for engine, (sub, _) in self.events.engines.items()
                for session, tokens, stored in sub.residency.known()]

    @asynccontextmanager
    async def _events_closed(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.events.close()

    def _stop_collecting(self) -> None:
        """Stops streaming figures; the event streams are the caller's to keep or drop."""
        if self.collecting or self._read:
            self.collecting = False
            self._read.clear()
            self.rounds = 0
            self.residency_changed, self.residency_lost = [], []

    def _wake(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def next_round(self) -> None:
        """Returns after the next round (or once collecting stops)."""
        await self._tick.wait()

    def ages(self) -> list[AgedFigures]:
        """Every engine's latest figures with their age now (the collector's clock)."""
        now = self._clock()
        return [AgedFigures(address, figures, max(0.0, now - at))
                for address, (figures, at) in self._read.items()]
