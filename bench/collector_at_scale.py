"""Fleet state at a thousand engines, measured on this machine: the collector
(`placement.load_gate.source: collector`) scraping every stub engine once a round and streaming
each round to --feeds replicas' feeds over loopback gRPC, all in this process; how much CPU that
takes, and how old a load figure gets at a replica (the targets: the whole
gateway ≤ 0.5 core at 1,000 engines and 8 replicas; a figure's age p99 ≤ 2× the interval).

    python bench/collector_at_scale.py [--engines 1000] [--feeds 8] [--seconds 30]
        [--loops kvgate,asyncio]

Each run of --loops is the same measurement on another event loop, one after the other in this
run: `kvgate` is the loop the control plane (which hosts the collector) and ext_proc run on
(kvgate.runtime.tasks.loop: uvloop where installed), `asyncio` the standard library's, the
baseline the control plane ran on before; the first is the result, the others its baselines.

The stub engines (bench/stub_engines.py: a recorded vLLM 0.32 load page, fixed bytes) run in a
child process, their CPU not counted. This process's CPU over the run (every thread) is the
collector's scrapes, a round's message built once and serialized for every stream, and every
feed taking it: all of fleet state but the KV events (bench/engine_state_cost.py prices those per
block). The feeds share the collector's event loop, as busy as one process can be (in a gateway
the replicas run elsewhere), so the ages are pessimistic. Each feed records, round by round, the
age of the round's oldest figure when the next round replaced it
(`kvgate_ext_proc_fleet_state_replaced_age_seconds`): the oldest any decision could have read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import grpc
import structlog
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control_plane.admin.fleet_stream import FleetStream
from control_plane.admin.servicer import AdminServicer
from control_plane.operations import Operations
from control_plane.status import ControlPlaneStatus
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.feed import FleetFeed, FleetFeedMetrics
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import EngineScrapeMetrics
from kvgate.placement.live import LoadBoard
from kvgate.runtime.children.child import Child
from kvgate.runtime.tasks.loop import run as run_loop

METRIC = "kvgate_ext_proc_fleet_state_replaced_age_seconds"


def _status() -> ControlPlaneStatus:
    return ControlPlaneStatus("bench", "bench", "", "")


Histogram = tuple[dict[float, float], float, float]  # cumulative buckets, count, sum


def histogram(registries: list[CollectorRegistry]) -> Histogram:
    """The feeds' histograms summed."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for registry in registries:
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name == f"{METRIC}_bucket":
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
                elif sample.name == f"{METRIC}_count":
                    count += sample.value
                elif sample.name == f"{METRIC}_sum":
                    total += sample.value
    return buckets, count, total


def distribution(after: Histogram, before: Histogram) -> dict[str, Any]:
    """The rounds between two readings: how many, the fraction at or under each bucket's
    bound, and the smallest bound that holds 50 % and 99 % of them."""
    count, total = after[1] - before[1], after[2] - before[2]
    if count == 0:
        raise RuntimeError("no round was replaced: the feeds took nothing")
    share = {bound: (n - before[0].get(bound, 0.0)) / count
             for bound, n in sorted(after[0].items())}

    def bound_holding(fraction: float) -> float:
        return next(bound for bound, held in share.items() if held >= fraction)

    return {"rounds": count, "mean_s": total / count, "p50_at_most_s": bound_holding(0.5),
            "p99_at_most_s": bound_holding(0.99), "share_at_or_under": share}


def scraped(registry: CollectorRegistry) -> tuple[float, float]:
    """The collector's scrapes so far: answered, failed."""
    def count(result: str) -> float:
        return registry.get_sample_value("kvgate_control_plane_engine_scrapes_total",
                                         {"result": result}) or 0.0

    return count("ok"), count("failed")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvgate-fleet-at-scale-") as temporary:
        work = Path(temporary)
        ready = work / "stubs.json"
        child = Child("stubs", [sys.executable, str(Path(__file__).parent / "stub_engines.py"),
                                "--engines", str(args.engines), "--ready", str(ready)],
                      work / "stubs.log")
        await child.start()
        try:
            await child.wait_ready(lambda: asyncio.to_thread(ready.exists), 120)
            return await follow(json.loads(ready.read_text()), args)
        finally:
            await child.stop()


async def follow(engines: list[str], args: argparse.Namespace) -> dict[str, Any]:
    settings = CollectorSettings(True, True, args.refresh_s, 1.0)
    scrape_registry = CollectorRegistry()
    collector = FleetCollector(lambda: engines, lambda: settings,
                               EngineScrapeMetrics(scrape_registry, "control_plane"))
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(
        cast(Operations, None), _status,
        FleetStream(collector, "bench", lambda: "bench")), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    registries = [CollectorRegistry() for _ in range(args.feeds)]
    feeds = [FleetFeed([address], LoadBoard(), PrefillMix(), FleetFeedMetrics(registry, "ext_proc"))
             for registry in registries]
    tasks = [asyncio.create_task(collector.run())] + [
        asyncio.create_task(feed.run()) for feed in feeds]
    try:
        deadline = time.monotonic() + 60
        while not all(feed.reachable() for feed in feeds):  # every stream followed
            if time.monotonic() > deadline:
                raise RuntimeError("the feeds took no round within 60 s")
            await asyncio.sleep(0.05)
        ages, scrapes = histogram(registries), scraped(scrape_registry)
        rounds, cpu, wall = collector.rounds, time.process_time(), time.monotonic()
        await asyncio.sleep(args.seconds)  # the run's length, not a readiness wait
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        rounds = collector.rounds - rounds
        result = distribution(histogram(registries), ages)
        share: dict[float, float] = result["share_at_or_under"]
        ok, failed = (after - before for after, before in
                      zip(scraped(scrape_registry), scrapes, strict=True))
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await server.stop(None)
    return {"engines": len(engines), "feeds": args.feeds, "seconds": round(wall, 2),
            "refresh_s": args.refresh_s, "collector_rounds": rounds,
            "rounds_per_s": rounds / wall, "scrapes_ok": ok, "scrapes_failed": failed,
            "cores": cpu / wall, "cpu_s_per_engine_round": cpu / max(1, rounds) / len(engines),
            **result, "share_at_or_under": {f"{bound:g}": held for bound, held in share.items()},
            "p99_vs_refresh": result["p99_at_most_s"] / args.refresh_s,
            "share_within_2x_refresh": share.get(2 * args.refresh_s)}


LOOPS = {"kvgate": run_loop, "asyncio": asyncio.run}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The first of --loops is the result; the others are kept under `baselines`, with the
    result's CPU as a ratio of each."""
    runs: dict[str, dict[str, Any]] = {}
    for name in args.loops:
        runs[name] = LOOPS[name](main(args))
        gc.collect()  # what one run left is not the next run's to collect
    first, *rest = args.loops
    result = {"loop": first, **runs[first]}
    if rest:
        result["baselines"] = {name: runs[name] for name in rest}
        result["cores_vs"] = {name: runs[first]["cores"] / runs[name]["cores"] for name in rest}
    return result


def report(result: dict[str, Any]) -> str:
    lines = [_report(result["loop"], result)]
    for name, baseline in result.get("baselines", {}).items():
        lines.append(_report(name, baseline))
        lines.append(f"CPU on {result['loop']}'s loop: {result['cores_vs'][name]:.2f}x {name}'s")
    return "\n".join(lines)


def _report(loop: str, result: dict[str, Any]) -> str:
    within = result["share_within_2x_refresh"]
    return (f"[{loop}] {result['engines']} engines, {result['feeds']} feeds, refresh "
            f"{result['refresh_s'] * 1000:g} ms, {result['seconds']:g} s: "
            f"{result['rounds_per_s']:.1f} rounds/s, {result['scrapes_failed']:.0f} of "
            f"{result['scrapes_ok'] + result['scrapes_failed']:.0f} scrapes failed; "
            f"{result['cores']:.2f} cores in all "
            f"({result['cpu_s_per_engine_round'] * 1e6:.1f} µs per engine per round)\n"
            f"{result['rounds']:.0f} rounds replaced; the oldest figure of a round when replaced: "
            f"mean {result['mean_s'] * 1000:.0f} ms, p50 ≤ {result['p50_at_most_s'] * 1000:g} ms, "
            f"p99 ≤ {result['p99_at_most_s'] * 1000:g} ms "
            f"({result['p99_vs_refresh']:.2f}x the refresh interval); "
            + ("" if within is None else f"{within * 100:.1f} % within 2x the interval"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--refresh-s", type=float, default=0.1)
    parser.add_argument("--feeds", type=int, default=8)
    parser.add_argument("--loops", default="kvgate,asyncio",
                        type=lambda text: text.split(","),
                        help=f"event loops to run on, the result's first ({', '.join(LOOPS)})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()
    if unknown := set(arguments.loops) - set(LOOPS):
        parser.error(f"--loops: unknown loop {', '.join(sorted(unknown))} "
                     f"(known: {', '.join(LOOPS)})")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    outcome = measure(arguments)
    print(report(outcome))
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(outcome, indent=1) + "\n")
