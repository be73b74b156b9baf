"""The emulator's calibration: the fit recovers the timing that produced the samples, and the
comparison applies the issue's targets (pure logic; the real runs are `python -m real_vllm
calibrate`)."""

from __future__ import annotations

import pytest

from bench.client import DriveResult, RequestSample
from benchkit.report import ModeStats
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import comparison, emulated, fit


def test_fit_recovers_fixed_cost_prefill_rate_and_decode() -> None:
    samples = []
    for prompt, cached in ((128, 0), (512, 0), (1024, 0), (2048, 0), (2112, 2048), (640, 512)):
        ttft = 0.030 + (prompt - cached) / 2500
        samples.append(RequestSample(prompt, cached, ttft, 33, 32 * 0.020))
    timing = fit(samples)
    assert timing.prefill_overhead_ms == pytest.approx(30.0, abs=0.01)
    assert timing.prefill_tokens_per_s == pytest.approx(2500.0, rel=1e-3)
    assert timing.decode_ms_per_token == pytest.approx(20.0)
    assert timing.ttft_residual_p50_ms == pytest.approx(0.0, abs=0.01)
    options = emulated(2, timing, 131072, 16)
    assert isinstance(options, EmulatorOptions)
    assert (options.block_size, options.hbm_tokens, options.no_ddr_pool) == (128, 131072, True)
    assert options.timing().prefill_seconds(1000, 0) == pytest.approx(0.030 + 1000 / 2500)


def _result(hit: float, ttft: float) -> DriveResult:
    stats = ModeStats()
    for _ in range(10):
        stats.add(0.0, ttft, 1.0, 1000, round(1000 * hit))
    return DriveResult(stats)


def test_comparison_flags_gaps_beyond_3_points_and_25_percent() -> None:
    real = {RoutingMode.ROUND_ROBIN: _result(0.50, 0.40), RoutingMode.AFFINITY: _result(0.70, 0.40)}
    emulated_runs = {RoutingMode.ROUND_ROBIN: _result(0.52, 0.45),
                     RoutingMode.AFFINITY: _result(0.65, 0.20)}
    rows = {r["mode"]: r for r in comparison(real, emulated_runs)}
    assert rows["round_robin"]["hit_rate_ok"] and rows["round_robin"]["ttft_p50_ok"]
    assert rows["affinity"]["hit_rate_gap_points"] == pytest.approx(5.0)
    assert not rows["affinity"]["hit_rate_ok"] and not rows["affinity"]["ttft_p50_ok"]
