"""What the load gate's engine scrapes cost an ext_proc replica: CPU seconds per round over N
engines (one GET /metrics each, concurrently, keep-alive), measured in this process.

    python bench/scrape_cost.py [--engines 4,16,64] [--rounds 200]

The engines are one emulator process (its CPU is not counted); the scraper is ext_proc's own
(kvgate.routing.engine_load). At refresh_s = 0.1, a replica runs 10 rounds a second: multiply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.scrape import ScrapeRounds
from kvgate.placement.live import LoadBoard
from kvgate.routing.engine_load import EngineLoadScraper, EngineScrapeMetrics
from kvgate.runtime.children.child import Child


async def measure(engines: int, rounds: int, work: Path) -> tuple[float, float]:
    ready = work / f"fleet-{engines}.json"
    child = Child("engines", [sys.executable, "-m", "emulator", "--instances", str(engines),
                              "--port", "0", "--ready-file", str(ready), "--log-level",
                              "warning"], work / f"engines-{engines}.log")
    await child.start()
    try:
        await child.wait_ready(lambda: asyncio.to_thread(ready.exists), 60)
        addresses = json.loads(ready.read_text())["engines"]
        board = LoadBoard()
        registry = CollectorRegistry()
        metrics = EngineScrapeMetrics(registry, "ext_proc")
        scraper = EngineLoadScraper(lambda: addresses, board, PrefillMix(), 0.1, metrics)
        async with ScrapeRounds.session() as http:
            await scraper.scrape_round(http)  # connections opened
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                await scraper.scrape_round(http)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        failed = registry.get_sample_value("kvgate_ext_proc_engine_scrapes_total",
                                           {"result": "failed"})
        if failed:
            raise RuntimeError(f"{failed:.0f} scrapes failed")
        return cpu / rounds, wall / rounds
    finally:
        await child.stop()


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="kvgate-scrape-"))
    print(f"{'engines':>8}{'CPU ms/round':>14}{'wall ms/round':>15}{'CPU share at 100 ms':>21}")
    for engines in args.engines:
        cpu, wall = await measure(engines, args.rounds, work)
        print(f"{engines:>8}{cpu * 1e3:>14.2f}{wall * 1e3:>15.2f}{cpu / 0.1:>21.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=lambda s: [int(x) for x in s.split(",")],
                        default=[4, 16, 64])
    parser.add_argument("--rounds", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
