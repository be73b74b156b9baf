"""`kvgate bench --compare` on the real stack agrees with `kvgate simulate` within 5 points."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import small_bank

from bench.compare import CompareOptions, compare
from emulator.options import EmulatorOptions
from experiment.modes import ALL_MODES
from kvgate.contract.modes import RoutingMode
from simulator.run import SimConfig, simulate_async

SCALE = 1 / 40


async def test_compare_and_simulate_agree_per_mode(tmp_path: Path) -> None:
    workload = small_bank(sessions=40, duration_s=240)
    engine = EmulatorOptions(instances=3, block_size=16, hbm_tokens=20_000, time_scale=SCALE)
    results = await compare(workload, ALL_MODES, CompareOptions(engine, tmp_path))
    sim_engine = EmulatorOptions(instances=3, block_size=16, hbm_tokens=20_000)
    rates = {}
    reads: dict[str, tuple[float, float]] = {}  # DDR bytes per request: real, simulated
    for mode in ALL_MODES:
        real = results[mode].stats.figures()
        # the same engine addresses, so the rings place sessions exactly as in the real run
        config = SimConfig(sim_engine, addresses=results[mode].endpoints)
        simulated = await simulate_async(workload, mode, config)
        sim = simulated.stats.figures()
        # same ring, same bindings: the same engine per request
        if not mode.round_robin:
            per_engine = dict(zip(results[mode].endpoints, simulated.per_engine_requests,
                                  strict=True))
            assert per_engine == results[mode].engines, mode
        assert real["errors"] == 0, mode
        assert real["requests"] == len(workload.requests), mode
        assert real["hit_rate"] == pytest.approx(sim["hit_rate"], abs=0.05), mode
        assert real["ddr_hit_rate"] == pytest.approx(sim["ddr_hit_rate"], abs=0.05), mode
        rates[mode] = real["hit_rate"]
        reads[mode] = (real["ddr_bytes_per_request_mean"], sim["ddr_bytes_per_request_mean"])
        used = results[mode].engines
        assert len(used) == 3, (mode, used)  # every engine served, through the gateway
    # every mode ran on the same engine addresses
    assert len({tuple(r.endpoints) for r in results.values()}) == 1
    # the comparison is not vacuous: modes differ on this workload
    assert rates["affinity+ddr"] - rates["round_robin"] > 0.15
    # both say the same about the pool's cost: round robin reads more from it than kvgate
    rr, kv = reads[RoutingMode.ROUND_ROBIN_DDR], reads[RoutingMode.AFFINITY_DDR]
    assert rr[0] > 1.5 * kv[0] and rr[1] > 1.5 * kv[1], (rr, kv)
