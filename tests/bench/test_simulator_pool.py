"""The DDR pool's costs in the simulator: contended transfers, a small pool, a pool down or slow."""

from __future__ import annotations

import dataclasses

import pytest

from emulator.ddr_pool import DdrPool
from emulator.options import EmulatorOptions
from emulator.pool_faults import PoolFaults, PoolWindow, parse_window
from emulator.prefix_cache import PrefixCache
from kvgate.contract.modes import RoutingMode
from kvgate.session import normalize_session
from simulator.routing import EngineHoldings, PoolHoldings
from simulator.run import SimConfig, simulate
from workload.bank import BankCodingOptions, bank_coding
from workload.model import Workload


@pytest.fixture(scope="module")
def workload() -> Workload:
    w = bank_coding(BankCodingOptions(sessions=240, duration_s=900, ramp_s=0))
    w.warmup_s = 60
    return w


def _fleet(**changes: object) -> EmulatorOptions:
    return dataclasses.replace(EmulatorOptions(instances=4, block_size=128), **changes)


def _figures(workload: Workload, mode: RoutingMode, **changes: object) -> dict[str, object]:
    return simulate(workload, mode, SimConfig(_fleet(**changes))).stats.figures()


def test_contention_on_the_node_link_raises_the_tail(workload: Workload) -> None:
    # Four engines on one node: a node link as wide as their four device links, then one a
    # tenth of a device link, which the node's transfers must share.
    wide = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, node_gbps=80.0)
    narrow = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, node_gbps=2.0)
    assert wide["ddr_hit_rate"] > 0.3  # the pool serves most of round robin's hits
    assert narrow["ttft_p99_s"] > 2 * wide["ttft_p99_s"]
    assert narrow["node_link_utilisation_p99"] > wide["node_link_utilisation_p99"]
    # The same bytes move either way; contention only makes them wait.
    assert narrow["ddr_bytes_per_request_mean"] == pytest.approx(
        wide["ddr_bytes_per_request_mean"], rel=0.25)


def test_a_fixed_cost_per_transfer_shows_in_ttft(workload: Workload) -> None:
    cheap = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, transfer_fixed_ms=0.0)
    costly = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, transfer_fixed_ms=500.0)
    assert costly["ttft_p50_s"] > cheap["ttft_p50_s"] + 0.3


def test_affinity_reads_less_from_the_pool_than_round_robin(workload: Workload) -> None:
    rr = _figures(workload, RoutingMode.ROUND_ROBIN_DDR)
    kvgate = _figures(workload, RoutingMode.AFFINITY_DDR)
    assert kvgate["ddr_bytes_per_request_mean"] < 0.6 * rr["ddr_bytes_per_request_mean"]
    assert kvgate["pool_read_gbps_mean"] < rr["pool_read_gbps_mean"]


def test_a_pool_smaller_than_the_working_set_loses_hits(workload: Workload) -> None:
    big = _figures(workload, RoutingMode.ROUND_ROBIN_DDR)
    small = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, pool_hbm_multiple=0.25)
    assert small["ddr_hit_rate"] < big["ddr_hit_rate"] - 0.1


def test_a_pool_down_for_a_window_serves_nothing_then_comes_back_empty(
        workload: Workload) -> None:
    window = PoolWindow(300.0, 300.0)
    healthy = _figures(workload, RoutingMode.ROUND_ROBIN_DDR)
    down = _figures(workload, RoutingMode.ROUND_ROBIN_DDR, pool_fail=(window,))
    assert down["window_s"] == [300.0, 600.0]
    # Round robin keeps only what each HBM holds during the outage.
    assert down["window_hit_rate"] < 0.5 * healthy["hit_rate"]
    assert down["ddr_hit_rate"] < healthy["ddr_hit_rate"]
    always_down = _figures(workload, RoutingMode.ROUND_ROBIN_DDR,
                           pool_fail=(PoolWindow(0.0, 10_000.0),))
    assert always_down["ddr_hit_rate"] == 0.0 and always_down["pool_read_gbps_peak"] == 0.0


def test_a_slow_pool_raises_the_tail(workload: Workload) -> None:
    healthy = _figures(workload, RoutingMode.ROUND_ROBIN_DDR)
    slow = _figures(workload, RoutingMode.ROUND_ROBIN_DDR,
                    pool_slow=(PoolWindow(0.0, 10_000.0, 0.05),))
    assert slow["ttft_p99_s"] > 1.5 * healthy["ttft_p99_s"]
    assert slow["hit_rate"] == pytest.approx(healthy["hit_rate"], abs=0.05)


def test_pool_windows_parse_and_say_what_is_wrong() -> None:
    assert parse_window("1800@600", slow=False) == PoolWindow(1800.0, 600.0, 0.0)
    assert parse_window("10@5:0.25", slow=True) == PoolWindow(10.0, 5.0, 0.25)
    for text, slow, message in (("1800", False, "T@DURATION"), ("1@2:0.5", False, "T@DURATION"),
                                ("1@2", True, "FACTOR"), ("1@0", False, "DURATION > 0"),
                                ("1@2:1.5", True, r"\(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            parse_window(text, slow)
    faults = PoolFaults([PoolWindow(10, 10), PoolWindow(15, 20, 0.5)])
    assert (faults.factor(5), faults.factor(12), faults.factor(22), faults.factor(40)) == (
        1.0, 0.0, 0.5, 1.0)
    assert faults.changes() == [10, 15, 20, 35]
    assert faults.recovered_at(20) and not faults.recovered_at(35)


def test_pool_holdings_are_a_pure_query_of_whole_chunks_and_nothing_while_down() -> None:
    pool = DdrPool(64 * 128, 128, "lmcache")  # 256-token chunks: two blocks a key
    pool.insert([1, 2, 3, 4, 5])
    before = pool.keys()
    up = [True]
    holdings = PoolHoldings(pool, lambda: up[0], 128)
    holdings.asking = [1, 2, 3, 9, 5]
    assert pool.held_prefix(holdings.asking) == 2  # 3 blocks found, a chunk is whole or not
    assert holdings.pool_tokens("ddr-pool", "s", 10_000) == 256
    assert holdings.pool_tokens("ddr-pool", "s", 100) == 100  # never more than the context
    assert pool.keys() == before  # nothing refreshed
    up[0] = False
    assert holdings.pool_tokens("ddr-pool", "s", 10_000) == 0


def test_pool_residency_off_changes_nothing_and_on_is_its_own_run(workload: Workload) -> None:
    mode = RoutingMode.AFFINITY_DDR
    off = simulate(workload, mode, SimConfig(_fleet())).stats.figures()
    again = simulate(workload, mode, SimConfig(_fleet(), pool_residency=False)).stats.figures()
    on = simulate(workload, mode, SimConfig(_fleet(), pool_residency=True)).stats.figures()
    assert off == again
    assert on["requests"] == off["requests"] and on["errors"] == 0


def test_engine_holdings_are_the_engines_cache_as_a_pure_query() -> None:
    cache = PrefixCache(8 * 128, 128)
    cache.release([1, 2, 3], hold=cache.acquire([1, 2, 3]))
    caches = {"e0": cache}
    holdings = EngineHoldings(caches.get, 128)
    holdings.asking = [1, 2, 9, 4]
    assert holdings.hbm_tokens("e0", "s", 10_000) == 256  # blocks 1 and 2, then a miss
    assert holdings.hbm_tokens("e0", "s", 100) == 100  # never more than the context
    assert holdings.hbm_tokens("e1", "s", 10_000) is None  # not an engine it knows


def test_engine_holdings_share_is_of_what_the_session_last_stored_there() -> None:
    """As the engines' KV events tell it (kvgate.fleet.residency): of the blocks the session's
    last turn cached there (prompt and answer), the leading run still held; keyed by the
    session as the gate keys it."""
    cache = PrefixCache(8 * 128, 128)
    cache.release([1, 2, 3, 4], hold=cache.acquire([1, 2, 3, 4]))
    holdings = EngineHoldings({"e0": cache}.get, 128)
    key = normalize_session(b"s")
    assert key is not None and holdings.hbm_share("e0", key) is None  # stored nothing there
    holdings.stored("e0", "s", [1, 2, 3, 4])
    assert holdings.hbm_share("e0", key) == 1.0
    holdings.asking = [7]  # the prompt being routed plays no part
    assert holdings.hbm_share("e0", key) == 1.0
    holdings.stored("e0", "s", [1, 2, 5, 6])  # its next turn: blocks 5 and 6 not cached
    assert holdings.hbm_share("e0", key) == 0.5 and holdings.hbm_share("e1", key) is None


def test_hbm_residency_off_changes_nothing_and_on_is_its_own_run(workload: Workload) -> None:
    mode = RoutingMode.AFFINITY_DDR
    off = simulate(workload, mode, SimConfig(_fleet())).stats.figures()
    again = simulate(workload, mode, SimConfig(_fleet(), hbm_residency=False)).stats.figures()
    on = simulate(workload, mode, SimConfig(_fleet(), hbm_residency=True)).stats.figures()
    assert off == again
    assert on["requests"] == off["requests"] and on["errors"] == 0
