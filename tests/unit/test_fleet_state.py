"""The fleet-state collector and its feed, in one process: the collector scrapes each engine
once per round and hands out ages, not instants; the feed puts figures on a replica's board
aged by them; the admin API's stream carries them to a replica and stops when its replica no
longer leads, after which the figures age out (static stickiness) and the feed says so."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import cast

import grpc
import pytest
from prometheus_client import CollectorRegistry

from control_plane.admin.fleet_stream import FleetStream
from control_plane.admin.servicer import AdminServicer, control_plane_status, ext_proc_status
from control_plane.operations import Operations
from control_plane.status import CollectorStatus, ControlPlaneStatus
from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.feed import FleetFeed, FleetFeedMetrics, next_round
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import EngineFigures, EngineScrapeMetrics, ScrapeRounds
from kvgate.placement.live import LoadBoard
from kvgate.replicas import ReplicaReport
from kvgate_cli.admin import render
from tests.support.polling import eventually
from tests.support.upstreams import Upstream


def page(waiting: int, running: int, kv: float) -> str:
    return (f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n')


@contextlib.asynccontextmanager
async def engines(*pages: str) -> AsyncIterator[list[Upstream]]:
    started = []
    try:
        for text in pages:
            upstream = Upstream()
            upstream.metrics_page = text
            await upstream.start()
            started.append(upstream)
        yield started
    finally:
        for upstream in started:
            await upstream.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Settings:
    """The control plane's view, switchable: leading or not."""

    def __init__(self, leading: bool = True, refresh_s: float = 0.05) -> None:
        self.leading = leading
        self.refresh_s = refresh_s

    def __call__(self) -> CollectorSettings:
        return CollectorSettings(True, self.leading, self.refresh_s, 1.0)


async def test_the_collector_scrapes_each_engine_once_a_round_and_gives_ages() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    async with engines(page(3, 2, 0.5), page(0, 1, 0.25)) as ups:
        active = [u.address for u in ups]
        collector = FleetCollector(lambda: active, Settings(),
                                   EngineScrapeMetrics(registry, "control_plane"), clock)
        async with ScrapeRounds.session() as http:
            await collector.collect_round(http)
            clock.now += 0.25
            ages = {a.address: a for a in collector.ages()}
            assert [u.scrapes for u in ups] == [1, 1]
            assert ages[ups[0].address].figures == EngineFigures.of(
                waiting=3, running=2, kv_usage=0.5)
            assert ages[ups[1].address].figures == EngineFigures.of(
                waiting=0, running=1, kv_usage=0.25)
            assert {a.age_s for a in ages.values()} == {0.25}
            active.pop()  # the second engine leaves: its figures go with it
            await collector.collect_round(http)
    assert [a.address for a in collector.ages()] == [ups[0].address]
    assert [u.scrapes for u in ups] == [2, 1]
    assert (collector.rounds, collector.collecting) == (2, True)
    assert registry.get_sample_value("kvgate_control_plane_engine_scrapes_total",
                                     {"result": "ok"}) == 3


async def test_a_collector_that_does_not_lead_scrapes_nothing_and_holds_nothing() -> None:
    settings = Settings(leading=False)
    async with engines(page(1, 1, 0.1)) as ups:
        collector = FleetCollector(lambda: [ups[0].address], settings,
                                   EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
        task = asyncio.create_task(collector.run())
        try:
            await asyncio.wait_for(collector.next_round(), 10)  # woken while idle, too
            assert (ups[0].scrapes, collector.rounds, collector.wanted()) == (0, 0, False)
            settings.leading = True
            await eventually(lambda: collector.rounds >= 2, what="two rounds once leading")
            settings.leading = False
            await eventually(lambda: not collector.collecting, what="collecting stops")
            assert collector.ages() == [] and collector.rounds == 0
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _round(*engines: tuple[str, int, int, float, float], columns: bool) -> pb.FleetLoad:
    """A round of (endpoint, waiting, running, kv_usage, age_s), as today's collector sends it
    (columns) or as one from before the columns did (a message per engine)."""
    if not columns:
        return pb.FleetLoad(round=1, interval_s=0.1, engines=[
            pb.EngineLoad(endpoint=e, waiting=w, running=r, kv_usage=kv, age_s=age)
            for e, w, r, kv, age in engines])
    endpoint, waiting, running, kv_usage, age_s = (list(c) for c in zip(*engines, strict=True))
    return pb.FleetLoad(round=1, interval_s=0.1, loads=pb.EngineLoads(
        endpoint=endpoint, waiting=waiting, running=running, kv_usage=kv_usage, age_s=age_s))


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "a message per engine"])
def test_the_feed_ages_each_figure_by_what_the_collector_said(columns: bool) -> None:
    clock, registry = Clock(), CollectorRegistry()
    board, mix = LoadBoard(max_age_s=1.0), PrefillMix()
    feed = FleetFeed(["127.0.0.1:1"], board, mix, FleetFeedMetrics(registry, "ext_proc"),
                     clock=clock)
    assert not feed.reachable() and feed.age_s() is None
    assert registry.get_sample_value("kvgate_ext_proc_fleet_state_age_seconds") == float("inf")
    feed.apply(_round(("10.0.0.1:1", 4, 2, 0.5, 0.2), ("10.0.0.2:1", 1, 0, 0.0, 1.5),
                      columns=columns))
    fresh = board.observed("10.0.0.1:1", clock.now)
    assert fresh is not None and fresh.at == pytest.approx(clock.now - 0.2)
    assert (fresh.figures.waiting, fresh.figures.running, fresh.figures.kv_usage) == (4, 2, 0.5)
    assert fresh.backlog_s == pytest.approx(4 * mix.mean_s)  # priced as a scraped one is
    assert board.observed("10.0.0.2:1", clock.now) is None  # past max_age_s: counts for nothing
    assert feed.reachable() and feed.age_s() == pytest.approx(0.2)
    assert registry.get_sample_value("kvgate_ext_proc_fleet_collector_reachable") == 1.0
    assert registry.get_sample_value("kvgate_ext_proc_fleet_state_oldest_figure_seconds_sum") \
        == pytest.approx(1.5)
    clock.now += 0.9  # no round since: the newest figure is 1.1 s old
    assert board.observed("10.0.0.1:1", clock.now) is None
    assert not feed.reachable()
    assert registry.get_sample_value("kvgate_ext_proc_fleet_collector_reachable") == 0.0
    assert registry.get_sample_value("kvgate_ext_proc_fleet_state_age_seconds") \
        == pytest.approx(1.1)


def test_the_feed_reports_how_old_figures_got_before_the_next_round() -> None:
    clock, registry = Clock(), CollectorRegistry()
    feed = FleetFeed(["127.0.0.1:1"], LoadBoard(), PrefillMix(),
                     FleetFeedMetrics(registry, "ext_proc"), clock=clock)
    name = "kvgate_ext_proc_fleet_state_replaced_age_seconds"
    feed.apply(_round(("a:1", 0, 0, 0.0, 0.03), ("b:1", 0, 0, 0.0, 0.08), columns=True))
    assert registry.get_sample_value(f"{name}_count") == 0  # nothing replaced yet
    clock.now += 0.1
    feed.apply(_round(("a:1", 0, 0, 0.0, 0.02), ("b:1", 0, 0, 0.0, 0.01), columns=True))
    # b's figure, read 0.08 s before the first round arrived, was 0.18 s old when replaced
    assert registry.get_sample_value(f"{name}_sum") == pytest.approx(0.18)
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.175"}) == 0
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.2"}) == 1


def _status() -> ControlPlaneStatus:
    return ControlPlaneStatus("cp-1", "cp-1", "", "")


async def test_the_stream_feeds_a_replica_until_its_control_plane_stops_leading() -> None:
    settings = Settings()
    async with engines(page(5, 1, 0.75), page(0, 0, 0.0)) as ups:
        collector = FleetCollector(lambda: [u.address for u in ups], settings,
                                   EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
        stream = FleetStream(collector, "cp-1", lambda: "cp-1" if settings.leading else "cp-2")
        server = grpc.aio.server()
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(cast(Operations, None), _status, stream), server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        board, registry = LoadBoard(max_age_s=0.5), CollectorRegistry()
        feed = FleetFeed([address], board, PrefillMix(), FleetFeedMetrics(registry, "ext_proc"))
        tasks = [asyncio.create_task(collector.run()), asyncio.create_task(feed.run())]
        try:
            busy = ups[0].address
            seen = await eventually(lambda: board.observed(busy, time.monotonic()),
                                    what="the busy engine's figures at the replica")
            assert seen is not None and seen.figures == EngineFigures.of(waiting=5, running=1,
                                                                         kv_usage=0.75)
            assert feed.following == address and collector.watchers == 1
            assert board.observed(ups[1].address, time.monotonic()) is not None
            settings.leading = False  # leadership lost: the stream ends, figures age out
            await eventually(lambda: not feed.reachable(), what="the feed reports unreachable")
            assert board.observed(busy, time.monotonic()) is None  # static stickiness again
            assert registry.get_sample_value("kvgate_ext_proc_fleet_collector_reachable") == 0
            await eventually(lambda: collector.watchers == 0, what="the stream closed")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await feed.follow(address)
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "the leader is cp-2" in (refused.value.details() or "")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.stop(None)


async def test_a_silent_stream_is_given_up_and_named() -> None:
    # Leading, but its rounds never run: the stream opens and nothing comes (as from a host
    # gone without a reset).
    collector = FleetCollector(lambda: [], Settings(),
                               EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(
        cast(Operations, None), _status, FleetStream(collector, "cp-1", lambda: "cp-1")), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        feed = FleetFeed([address], LoadBoard(), PrefillMix(),
                         FleetFeedMetrics(CollectorRegistry(), "ext_proc"), stall_s=0.3)
        assert await asyncio.wait_for(feed.follow(address), 20) is False
        assert feed.following is None and not feed.reachable()
        await eventually(lambda: collector.watchers == 0, what="the stream closed")
    finally:
        await server.stop(None)


class _StuckStream:
    """A stream whose read ignores cancellation until released, as a gRPC read pending on a
    channel that keeps retrying its connection was seen to."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reads = self.cancels = 0

    def __aiter__(self) -> _StuckStream:
        return self

    async def __anext__(self) -> pb.FleetLoad:
        self.reads += 1
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancels += 1
        raise StopAsyncIteration


async def test_a_read_that_ignores_cancellation_does_not_hold_the_feed() -> None:
    stream, abandoned = _StuckStream(), set[asyncio.Future[pb.FleetLoad]]()
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(next_round(stream, 0.05, abandoned), 10)
        assert len(abandoned) == 1
        await eventually(lambda: stream.cancels == 1, what="the read given up was cancelled")
        waiting = asyncio.create_task(next_round(stream, 30, abandoned))
        await eventually(lambda: stream.reads == 2, what="a second read")
        waiting.cancel()  # the feed itself stopped: it returns at once, the read left behind
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)
        assert len(abandoned) == 2
    finally:
        stream.release.set()  # the reads end at last and are forgotten
    await eventually(lambda: not abandoned, what="the abandoned reads end")


async def test_a_stream_that_ends_reads_as_none() -> None:
    stream = _StuckStream()
    stream.release.set()
    assert await next_round(stream, 1, set()) is None


def test_a_replica_report_says_where_its_load_comes_from_and_status_shows_it() -> None:
    lost = ReplicaReport("ep-1", 1.0, load_source="collector", load_age_s=12.5,
                         collector_reachable=False)
    assert ReplicaReport.decode(lost.encode()) == lost
    fine = ReplicaReport.decode(ReplicaReport("ep-2", 1.0, load_source="collector",
                                              load_age_s=0.08, collector_reachable=True).encode())
    old = ReplicaReport.decode(b'{"identity": "ep-3", "at": 1.0}')  # a report from before
    assert (old.load_source, old.load_age_s, old.collector_reachable) == ("", None, False)
    response = control_plane_status(ControlPlaneStatus(
        "cp-1", "cp-1", "", "", fleet_collector=CollectorStatus(True, 40, 2, 0.1, 7)))
    response.ext_procs.extend(ext_proc_status(r) for r in (lost, fine, old))
    text = render.status_text(response)
    assert "COLLECTOR UNREACHABLE (newest 12.50s old): static stickiness" in text
    assert "collector (newest 0.08s old)" in text and "- (gate off)" in text
    assert "fleet state    collector: 40 engines every 100ms, 2 ext_proc streams" in text
    shown = render.status_dict(response)
    assert shown["fleet_collector"]["watchers"] == 2
    assert [e["collector_reachable"] for e in shown["ext_procs"]] == [False, True, False]
