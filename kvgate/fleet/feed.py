"""An ext_proc replica's side of the fleet-state collector (`placement.load_gate.source:
collector`): one gRPC stream (the admin API's WatchFleetLoad) from the control-plane leader,
whatever the number of engines. Each figure lands on the replica's load board stamped
`now − its age`, the age the collector gave as the round left it: the collector's and the
replica's clocks are never compared, and a figure older than the board's `max_age_s` counts
for nothing, as a scraped one does.

When the collector is unreachable, follows no leader, or dies, no figure arrives: those it
delivered age out of the board and the gate falls back to static stickiness for every engine
it covered (plus this replica's own ledger of what it sent). Decisions never wait for the feed;
`kvgate_{service}_fleet_collector_reachable`, `kvgate_{service}_fleet_state_age_seconds`
(ext_proc's: `kvgate_ext_proc_...`) and the replica's line in `kvgate status` say how it
stands. The feed tries each configured address in turn (only the leader streams), pausing
between attempts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.contract.vllm import GAUGES, EngineFigures
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.live import LoadBoard, ObservedLoad, ObservedRound

log = structlog.get_logger("kvgate.fleet")

RETRY_S = (0.2, 0.5, 1.0, 2.0)  # pauses between failed attempts, the last one repeated


async def next_round(frames: AsyncIterator[pb.FleetLoad], within_s: float,
                     abandoned: set[asyncio.Future[pb.FleetLoad]]) -> pb.FleetLoad | None:
    """The stream's next round (None: it ended); TimeoutError when none came within `within_s`.

    Not `asyncio.wait_for`: that waits for the read it cancels to finish, and a read pending in
    gRPC (a plain-text stream to a TLS collector, retrying its connection) was seen not to
    finish, holding the feed and its channel for good. A read given up is cancelled and kept in
    `abandoned` until it ends; the caller cancels the call and closes the channel."""
    read = asyncio.ensure_future(anext(frames))
    try:
        done, _ = await asyncio.wait((read,), timeout=within_s)
    except asyncio.CancelledError:
        _abandon(read, abandoned)
        raise
    if not done:
        _abandon(read, abandoned)
        raise TimeoutError
    try:
        return read.result()
    except StopAsyncIteration:
        return None


def _abandon(read: asyncio.Future[pb.FleetLoad],
             abandoned: set[asyncio.Future[pb.FleetLoad]]) -> None:
    read.cancel()
    if not read.done():
        abandoned.add(read)
        read.add_done_callback(lambda _: abandoned.discard(read))
    read.add_done_callback(_retrieve)


def _retrieve(read: asyncio.Future[pb.FleetLoad]) -> None:
    if not read.cancelled():
        read.exception()  # the call was given up: its error says nothing new


class FleetFeedMetrics:
    """The feed's health as Prometheus sees it (gauges read the feed when scraped), named after
    the service the feed serves (`kvgate_{service}_fleet_*`, `kvgate_{service}_hbm_*`)."""

    def __init__(self, registry: CollectorRegistry, service: str,
                 hbm: HbmBoard | None = None) -> None:
        prefix = f"kvgate_{service}"
        self.reachable = Gauge(
            f"{prefix}_fleet_collector_reachable", "1 while the fleet-state collector's "
            "figures arrive no older than max_load_age_s; 0: static stickiness for the engines "
            "it covers", registry=registry)
        self.age = Gauge(
            f"{prefix}_fleet_state_age_seconds", "Age of the newest engine figure the "
            "collector delivered (+Inf: none yet)", registry=registry)
        self.frames = Counter(
            f"{prefix}_fleet_state_rounds", "Collector rounds received",
            registry=registry)
        self.oldest = Histogram(
            f"{prefix}_fleet_state_oldest_figure_seconds", "Age of the oldest figure of "
            "each round as it arrived", buckets=(0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0),
            registry=registry)
        self.replaced = Histogram(
            f"{prefix}_fleet_state_replaced_age_seconds", "Age of each round's oldest "
            "figure when the next round replaced it: the oldest a decision could have read",
            buckets=(0.05, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.5, 1.0, 2.0, 5.0),
            registry=registry)
        if hbm is not None:
            Gauge(f"{prefix}_hbm_residency_pairs", "Engine-session pairs whose residency "
                  "in HBM the collector reported (from the engines' KV events): a session held "
                  "by two engines counts twice", registry=registry).set_function(
                      lambda: hbm.pairs)
            Gauge(f"{prefix}_hbm_eviction_rates", "Engines whose HBM eviction rate (blocks "
                  "per second over the last minute, from their KV events) the collector "
                  "reported: the gate re-homes a session its engine evicted to a sibling that "
                  "evicts slower", registry=registry).set_function(lambda: hbm.engines_evicting)


class FleetFeed:
    """Keeps one stream from the collector open and puts its figures on `board`."""

    def __init__(
        self, addresses: Sequence[str], board: LoadBoard, mix: PrefillMix,
        metrics: FleetFeedMetrics, token: str | None = None,
        clock: Callable[[], float] = time.monotonic, stall_s: float = 2.0,
        hbm: HbmBoard | None = None, tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        """`tls`: the admin API's CA (kvgate.admin_api.tls.channel_credentials); None: plain
        text, fit for loopback only, since the token crosses with every stream."""
        if not addresses:
            raise ValueError("the fleet feed needs at least one collector address")
        self.addresses = tuple(addresses)
        self._board = board
        self._mix = mix
        self._metrics = metrics
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls = tls
        self._clock = clock
        # A stream silent this long is given up (a collector host gone without a reset would
        # otherwise hold it open forever) and the next address tried.
        self._stall_s = stall_s
        self.hbm = hbm  # the engines' HBM residency, where the collector reads KV events
        self.following: str | None = None  # the address streaming to it now
        self._newest_at: float | None = None  # when its newest figure was read (our clock)
        self._oldest_at: float | None = None  # when the last round's oldest figure was read
        self._endpoints: list[str] = []  # the last round's engines, in its order
        self._index: dict[str, int] = {}  # and where each is in the round's columns
        self._trouble: set[str] = set()  # failures of the current streak, each logged once
        self._abandoned: set[asyncio.Future[pb.FleetLoad]] = set()  # reads left to finish late
        metrics.reachable.set_function(lambda: 1.0 if self.reachable() else 0.0)
        metrics.age.set_function(self._age_or_inf)

    def age_s(self, now: float | None = None) -> float | None:
        """Age of the newest figure delivered (None: none yet)."""
        if self._newest_at is None:
            return None
        return max(0.0, (self._clock() if now is None else now) - self._newest_at)

    def _age_or_inf(self) -> float:
        age = self.age_s()
        return float("inf") if age is None else age

    def reachable(self, now: float | None = None) -> bool:
        """Figures that still count arrive: the newest is no older than the board's limit."""
        age = self.age_s(now)
        return age is not None and age <= self._board.max_age_s

    async def run(self) -> None:
        """Runs under the service's supervisor until cancelled."""
        attempt = 0
        while True:
            address = self.addresses[attempt % len(self.addresses)]
            try:
                if await self.follow(address):
                    attempt = 0  # it streamed: start over from the first address
            except grpc.aio.AioRpcError as exc:
                self._failed(address, f"{exc.code().name}: {exc.details()}")
            finally:
                self.following = None
            attempt += 1
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S)) - 1])

    async def follow(self, address: str) -> bool:
        """Reads `address`'s stream until it ends; True if at least one round arrived."""
        streamed = False
        async with (grpc.aio.insecure_channel(address) if self._tls is None
                    else grpc.aio.secure_channel(address, self._tls)) as channel:
            call = admin_pb2_grpc.AdminStub(channel).WatchFleetLoad(
                pb.WatchFleetLoadRequest(), metadata=self._metadata)
            frames = aiter(call)
            while True:
                try:
                    frame = await next_round(frames, self._stall_s, self._abandoned)
                except TimeoutError:
                    call.cancel()
                    self._failed(address, f"no round for {self._stall_s:g}s")
                    return streamed
                if frame is None:
                    break
                if not streamed:
                    streamed = True
                    self.following = address
                    if self._trouble:
                        log.info("fleet_collector_following", collector=address,
                                 identity=frame.collector)
                    self._trouble.clear()
                self.apply(frame)
        if streamed:
            self._failed(address, "the stream ended")
        return streamed

    def apply(self, frame: pb.FleetLoad) -> None:
        """One round onto the board: each figure read `age_s` ago, on this replica's clock, and
        priced as a scraped one is (kvgate.routing.engine_load.observed_load: waiting × the
        mean prefill booked). The round's columns are kept as they came and each engine's
        figures made only when a decision reads them (ObservedRound): at a thousand engines
        per round, per replica, building every figure was most of the cost."""
        now = self._clock()
        if frame.engines:  # a collector from before the columns
            self._apply_engines(frame, now)
        else:
            loads = frame.loads
            endpoints = list(loads.endpoint)
            if endpoints != self._endpoints:  # the same engines keep their index
                self._endpoints = endpoints
                self._index = {address: i for i, address in enumerate(endpoints)}
            ages = list(loads.age_s)
            self._board.observe_round(ObservedRound(
                self._index, now, ages, [list(getattr(loads, g.name)) for g in GAUGES],
                self._mix.mean_s))
            if ages:
                self._seen(now, min(ages), max(ages))
        if self.hbm is not None:
            self.hbm.apply(frame)
        self._metrics.frames.inc()

    def _apply_engines(self, frame: pb.FleetLoad, now: float) -> None:
        mean_s = self._mix.mean_s
        observe = self._board.observe
        for engine in frame.engines:
            figures = EngineFigures([getattr(engine, g.name) for g in GAUGES])
            observe(engine.endpoint, ObservedLoad(now - engine.age_s, engine.waiting * mean_s,
                                                  figures))
        ages = [engine.age_s for engine in frame.engines]
        self._seen(now, min(ages), max(ages))

    def _seen(self, now: float, youngest: float, oldest: float) -> None:
        if self._newest_at is None or now - youngest > self._newest_at:
            self._newest_at = now - youngest
        self._metrics.oldest.observe(oldest)
        if self._oldest_at is not None:
            self._metrics.replaced.observe(now - self._oldest_at)
        self._oldest_at = now - oldest

    def _failed(self, address: str, reason: str) -> None:
        self._oldest_at = None  # what the next stream brings replaces nothing this one sent
        if self.hbm is not None:
            self.hbm.clear()  # changes missed meanwhile: the next stream starts whole
        if f"{address} {reason}" not in self._trouble:
            log.warning("fleet_collector_unreachable", collector=address, reason=reason,
                        effect="figures age out: static stickiness until it streams again")
        self._trouble.add(f"{address} {reason}")
