"""The emulator's calibration: each timing model's fit recovers the timing that produced the
samples, the comparison applies the issue's targets per model over repeats, and the replay of
the committed real runs works without an engine (pure logic and the simulator; the real runs
are `python -m real_vllm calibrate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.client import DriveResult, RequestSample
from benchkit.report import ModeStats
from emulator.options import EmulatorOptions
from emulator.steps import StepScheduler
from emulator.timing import FCFS, VLLM_STEPS
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.tasks.loop import run as run_loop
from real_vllm import __main__ as main
from real_vllm.calibrate import chunks, emulated, fit, fit_steps, fits
from real_vllm.fleet import EngineOptions
from real_vllm.replay import emulated_half, replay, stored_runs
from real_vllm.report import comparison, markdown, median_figures, runs_of, within_targets

ROOT = Path(__file__).resolve().parents[2]


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
    real = runs_of([{RoutingMode.ROUND_ROBIN: _result(0.50, 0.40),
                     RoutingMode.AFFINITY: _result(0.70, 0.40)}])
    emulated_runs = runs_of([{RoutingMode.ROUND_ROBIN: _result(0.52, 0.45),
                              RoutingMode.AFFINITY: _result(0.65, 0.20)}])
    rows = {r["mode"]: r for r in comparison(real, emulated_runs, FCFS)}
    assert rows["round_robin"]["hit_rate_ok"] and rows["round_robin"]["ttft_p50_ok"]
    assert rows["affinity"]["hit_rate_gap_points"] == pytest.approx(5.0)
    assert not rows["affinity"]["hit_rate_ok"] and not rows["affinity"]["ttft_p50_ok"]
    assert rows["affinity"]["model"] == FCFS and "real_runs" not in rows["affinity"]


def test_repeats_compare_medians_and_show_their_spread() -> None:
    mode = RoutingMode.AFFINITY
    real = runs_of([{mode: _result(0.70, t)} for t in (0.30, 0.40, 0.90)])
    emulated_runs = runs_of([{mode: _result(0.70, t)} for t in (0.35, 0.45)])
    assert median_figures(real["affinity"])["ttft_p50_s"] == pytest.approx(0.40)
    row, = comparison(real, emulated_runs, VLLM_STEPS)
    assert row["ttft_p50_gap_pct"] == pytest.approx(0.0)  # medians 0.40 and 0.40
    assert row["repeats"] == {"real": 3, "emulated": 2}
    table = markdown("t", [row])
    assert "| affinity | — | real | 70.0 % [70.0–70.0] | 0.400 s [0.300–0.900] |" in table
    assert "| affinity | vllm-steps | 0.0 points (ok) | 0 % (ok) |" in table
    assert within_targets([row]) == {VLLM_STEPS: {"comparisons": 1, "ttft_p50_ok": 1,
                                                  "hit_rate_ok": 1}}


def test_fits_recover_the_cost_of_every_prompt_token_cached_or_not() -> None:
    # Samples made with 11 ms fixed, 6 µs per prompt token and 9,000 tokens/s of prefill:
    # cold prompts and warm ones (64 new tokens on a cached prefix) of several sizes.
    samples = []
    for prompt in (192, 576, 1088, 2112, 3136):
        for cached in (0, prompt - 64):
            uncached = prompt - cached
            samples.append(RequestSample(prompt, cached, 0.011 + prompt * 6e-6 + uncached / 9000,
                                         33, 32 * 0.008))
    timing = fit(samples)
    assert timing.prefill_overhead_ms == pytest.approx(11.0, abs=0.01)
    assert timing.prompt_us_per_token == pytest.approx(6.0, abs=0.01)
    assert timing.prefill_tokens_per_s == pytest.approx(9000.0, rel=1e-3)
    assert timing.ttft_residual_p50_ms == pytest.approx(0.0, abs=0.01)
    options = emulated(2, timing, 131072, 16)
    assert options.prompt_us_per_token == timing.prompt_us_per_token
    # As fits were made before the term: none, and the warm prompts' cost lands elsewhere.
    before = fit(samples, prompt_term=False)
    assert before.prompt_us_per_token == 0.0 and before.ttft_residual_p50_ms > 1.0
    # A per-prompt cost that would come out negative is not fitted at all.
    falling = [RequestSample(s.prompt_tokens, s.cached_tokens,
                             0.011 - s.prompt_tokens * 1e-6 + s.uncached / 9000, 33, 0.25)
               for s in samples]
    assert fit(falling).prompt_us_per_token == 0.0


def test_step_fit_recovers_step_cost_rate_and_api_time() -> None:
    # Samples made by the step model itself: 12 ms in the API server, 15 ms a step, 2,000
    # tokens/s; a lone decode is one step and one token (15.5 ms).
    samples = []
    for prompt, cached in ((128, 0), (1024, 0), (2048, 0), (3072, 0), (3136, 3072), (640, 512)):
        uncached = prompt - cached
        ttft = 0.012 + chunks(uncached, 2048) * 0.015 + uncached / 2000
        samples.append(RequestSample(prompt, cached, ttft, 33, 32 * 0.0155))
    timing = fit_steps(samples)
    assert timing.scheduler == VLLM_STEPS and timing.max_num_batched_tokens == 2048
    assert timing.prefill_overhead_ms == pytest.approx(12.0, abs=0.01)
    assert timing.prefill_tokens_per_s == pytest.approx(2000.0, rel=1e-3)
    assert timing.step_ms == pytest.approx(15.0, abs=0.01)
    # The emulator configured with it gives a lone request that TTFT again.
    options = emulated(2, timing, 131072, 16)
    assert options.scheduler == VLLM_STEPS
    slot = StepScheduler(options.timing()).schedule(0.0, 3072, 1)
    assert slot.ttft == pytest.approx(0.012 + 2 * 0.015 + 3072 / 2000, abs=1e-4)
    assert set(fits(samples, [FCFS, VLLM_STEPS])) == {FCFS, VLLM_STEPS}


def test_replay_of_the_committed_runs_needs_no_engine(tmp_path: Path) -> None:
    # The simulator backend: seconds, no gateway; both models over both workloads.
    directory = ROOT / "docs/results/calibration"
    report = run_loop(replay(directory, [FCFS, VLLM_STEPS], tmp_path, lambda _: None, "sim"))
    rows = [*report["workload_a"]["modes"], *report["workload_b"]["modes"]]
    assert {(r["mode"], r["model"]) for r in rows} == {
        (m, model) for m in ("round_robin", "affinity") for model in (FCFS, VLLM_STEPS)}
    # The real side is what was stored; the fcfs fit is the one stored with it.
    stored = json.loads((directory / "calibration.json").read_text())
    assert stored_runs(stored["workload_a"])["affinity"] == [
        stored["workload_a"]["modes"][1]["real"]]
    assert report["idle_fits"][FCFS]["prefill_tokens_per_s"] == (
        stored["idle_fit"]["prefill_tokens_per_s"])
    # Affinity's hit rate is the cache model's, exact under either timing model.
    assert all(r["hit_rate_gap_points"] == 0.0 for r in rows if r["mode"] == "affinity")
    assert "| affinity | vllm-steps | emulated |" in report["markdown"]


class _FakeFleet:
    """What ``_calibrate`` uses of a RealFleet, with no engine behind it."""

    instances, urls = 2, ["http://a", "http://b"]
    options = EngineOptions()

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def test_calibrate_repeats_and_writes_what_replay_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real half faked (samples of a known timing), the emulated half in the simulator:
    # the wiring of fits, repeats and the report, and that a stored report replays.
    samples = [RequestSample(p, c, 0.02 + (p - c) / 3000, 25, 24 * 0.015)
               for p, c in ((256, 0), (1024, 0), (2048, 0), (3072, 0), (1088, 1024))]

    async def measure(url: str) -> list[RequestSample]:
        return samples

    async def run_real(fleet: object, workload: object, modes: list[RoutingMode],
                       workdir: Path, say: object,
                       engine_side: dict[str, dict[str, float | None]] | None = None,
                       route: object = None) -> dict[RoutingMode, DriveResult]:
        assert route is None  # through the gateway, as calibrate runs by default
        ttft = 0.2 if workdir.name.startswith("a") else 0.3
        if engine_side is not None:  # what the engines' histograms would say of the run
            engine_side.update({str(m): {"queue_s": 0.01, "prefill_s": 0.05,
                                         "ttft_s": ttft - 0.02, "requests": 4.0}
                                for m in modes})
        return {m: DriveResult(_result(0.5, ttft).stats, samples=samples) for m in modes}

    async def emulated_sim(*args: Any, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        return await emulated_half(*args, **{**kwargs, "backend": "sim"})

    monkeypatch.setattr(main, "measure", measure)
    monkeypatch.setattr(main, "run_real", run_real)
    monkeypatch.setattr(main, "emulated_half", emulated_sim)
    modes = [RoutingMode.ROUND_ROBIN, RoutingMode.AFFINITY]
    report = run_loop(main._calibrate(_FakeFleet(tmp_path), modes, 4, 131072,  # type: ignore[arg-type]
                                      [FCFS, VLLM_STEPS], 2))
    assert report["idle_fits"][VLLM_STEPS]["scheduler"] == VLLM_STEPS
    assert report["idle_fit"] == report["idle_fits"][FCFS]
    rows = report["workload_b"]["modes"]
    assert [(r["mode"], r["model"]) for r in rows] == [
        ("round_robin", FCFS), ("affinity", FCFS),
        ("round_robin", VLLM_STEPS), ("affinity", VLLM_STEPS)]
    assert all(r["repeats"] == {"real": 2, "emulated": 2} for r in rows)
    assert len(report["workload_a_samples"]["affinity"]) == 2 * len(samples)
    # What the engines measured of each real run, per workload and repeat, kept in the report.
    assert [run["affinity"]["ttft_s"] for run in report["engine_side"]["b"]] == [
        pytest.approx(0.28)] * 2
    out = tmp_path / "out"
    main._write(dict(report), out)
    replayed = run_loop(replay(out, [VLLM_STEPS], tmp_path / "r", lambda _: None, "sim"))
    assert replayed["in_workload_fits"][VLLM_STEPS] == report["in_workload_fits"][VLLM_STEPS]
    assert stored_runs(replayed["workload_b"])["affinity"] == rows[1]["real_runs"]
