"""bench/engine_state_cost.py on a few stub engines: it runs, reads the recorded real vLLM
pages and event stream, times scraping the three gauges and the whole page, and
projects the collector (its own scrapes, and a round delivered to every replica) below every
replica scraping for itself; bench/collector_at_scale.py on twenty cheap stubs: every engine
scraped each round, each feed's rounds replaced and their ages counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_scrapes_are_timed_and_events_are_decoded(
        tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_state_cost.py"), "--engines", "2",
         "--rounds", "20", "--repeat", "2", "--delivery-rounds", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    per = result["per_engine"]
    # CPU figures are the bench's output, compared there in one run; a test only checks they
    # were measured (a busy machine orders two short timings either way).
    assert per["scrape_filtered_cpu_s"] > 0 and per["scrape_whole_cpu_s"] > 0
    assert result["recorded"]["metrics_load_bytes"] * 50 < result["recorded"]["metrics_full_bytes"]
    assert result["events"]["stored_blocks"] > 0 and per["events_cpu_s_per_block"] > 0
    assert per["residency_cpu_s_per_block"] > 0
    cores = result["projection"]["cores"]
    assert cores["one collector: three gauges, once"] == pytest.approx(
        1000 * 10 * per["collector_scrape_cpu_s"])
    assert per["delivery_bytes"] > 0 and per["delivery_replica_cpu_s"] > 0
    assert (cores["one collector: three gauges, once"]
            + cores["one collector: a round to every replica"]
            < cores["every replica scrapes the three gauges"])
    assert "three gauges" in done.stdout
    # Columns: a round and the message per engine it replaces both timed; fewer bytes
    assert per["delivery_replica_cpu_s"] > 0 and per["delivery_replica_baseline_cpu_s"] > 0
    assert per["delivery_bytes"] < per["delivery_baseline_bytes"]
    assert per["delivery_replica_read_cpu_s"] > 0


def test_at_scale_every_engine_is_scraped_and_every_feed_replaced_its_rounds(
        tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "collector_at_scale.py"), "--engines", "20",
         "--feeds", "2", "--seconds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["engines"] == 20 and result["collector_rounds"] >= 1
    assert result["scrapes_ok"] >= 20 * result["collector_rounds"] - 20  # a round in flight
    assert result["rounds"] >= 1 and result["cores"] > 0
    # The same measurement on asyncio's own loop, the baseline of the control plane's.
    assert result["loop"] == "kvgate" and result["baselines"]["asyncio"]["rounds"] >= 1
    assert result["cores_vs"]["asyncio"] > 0
    share = result["share_at_or_under"]  # bucket bound → rounds at or under it
    assert share["inf"] == 1.0 and share[f"{result['p99_at_most_s']:g}"] >= 0.99
    assert "rounds replaced" in done.stdout
