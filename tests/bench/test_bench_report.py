from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchkit.modes import parse_modes, parse_simulated_modes
from benchkit.report import (
    ModeStats,
    markdown_table,
    percentile,
    result_document,
    write_outputs,
)
from kvgate.contract.modes import RoutingMode

KEYS = {"hit_rate", "hbm_hit_rate", "ddr_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
        "itl_p50_s", "itl_p99_s", "requests", "errors", "throughput_rps",
        "ddr_bytes_per_request_mean", "ddr_bytes_per_request_p99", "pool_read_gbps_mean",
        "pool_read_gbps_peak", "node_link_utilisation_p99"}


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (
        50.0, 90.0, 99.0)
    assert percentile([], 50) == 0.0


def test_figures_and_outputs_have_the_documented_shape(tmp_path: Path) -> None:
    stats = ModeStats()
    for i in range(10):
        stats.add(arrival=float(i), ttft=0.1 * (i + 1), finish=float(i) + 2, prompt=1000,
                  cached=600, hbm=400, ddr=200)
    stats.error(11.0)
    document = result_document({"name": "w"}, {"affinity+ddr": stats}, 0.7)
    assert set(document) == {"workload", "modes", "oracle_hit_rate", "no_queue_ttft_p50_s",
                             "no_queue_ttft_p90_s", "no_queue_ttft_p99_s"}
    assert document["no_queue_ttft_p99_s"] is None  # not computed: no bound claimed
    bounded = result_document({"name": "w"}, {"affinity+ddr": stats}, 0.7,
                              [0.05 * (i + 1) for i in range(100)])
    assert (bounded["no_queue_ttft_p50_s"], bounded["no_queue_ttft_p99_s"]) == pytest.approx(
        (2.5, 4.95))
    assert "no-queue bound" in markdown_table(bounded) and "no-queue" not in markdown_table(
        document)
    f = document["modes"]["affinity+ddr"]
    assert set(f) == KEYS
    assert (f["hit_rate"], f["hbm_hit_rate"], f["ddr_hit_rate"]) == pytest.approx((0.6, 0.4, 0.2))
    assert (f["requests"], f["errors"]) == (11, 1)
    assert f["ttft_p50_s"] == pytest.approx(0.5)
    assert f["throughput_rps"] == pytest.approx(10 / 11)
    assert f["ddr_bytes_per_request_mean"] == f["ddr_bytes_per_request_p99"] == 200 * 256 * 1024
    assert f["pool_read_gbps_mean"] is None  # only the simulator measures the pool's traffic
    paths = write_outputs(tmp_path, "x", document, {"affinity+ddr": stats.ttfts}, "t")
    assert json.loads(paths[0].read_text()) == document
    table = paths[1].read_text()
    assert "| affinity+ddr | 60.0 % | 40.0 % | 20.0 % |" in table
    assert "| affinity+ddr | 0.05 GB | 0.05 GB | – | – | – |" in table
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bench_run_knows_only_the_mean_ddr_read_from_the_engines_counters() -> None:
    stats = ModeStats()
    for i in range(4):
        stats.add(arrival=float(i), ttft=0.5, finish=float(i) + 1, prompt=1000, cached=500)
    stats.ddr_tokens = 400  # what the engines' external-hit counters said, for all four
    f = stats.figures()
    assert f["ddr_bytes_per_request_mean"] == 100 * 256 * 1024
    assert f["ddr_bytes_per_request_p99"] is None


def test_modes_parse() -> None:
    assert parse_modes("all") == tuple(m for m in RoutingMode if not m.simulated_only)
    assert RoutingMode.STICKY_DDR in parse_modes("all")
    assert parse_modes("affinity+ddr,round_robin") == (RoutingMode.AFFINITY_DDR,
                                                       RoutingMode.ROUND_ROBIN)
    with pytest.raises(ValueError, match="unknown mode"):
        parse_modes("random")


def test_the_peers_modes_are_the_simulators_only() -> None:
    assert parse_simulated_modes("all") == tuple(RoutingMode)
    assert parse_simulated_modes("kv-cost,affinity+ddr") == (RoutingMode.KV_COST,
                                                              RoutingMode.AFFINITY_DDR)
    with pytest.raises(ValueError, match="kvgate simulate and plan only"):
        parse_modes("kv-cost")  # a real stack cannot run it
