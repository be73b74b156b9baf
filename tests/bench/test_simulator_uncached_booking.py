"""The simulator's kvgate runs `placement.load_gate.book_uncached_prefill` (kvgate.routing.booking):
on agentic sessions sharing one harness, a new session is booked less the harness its engine
holds, so the gate books less prefill per request than with the setting off."""

from __future__ import annotations

import asyncio

from emulator.options import EmulatorOptions
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.modes import RoutingMode
from simulator.run import SimConfig
from simulator.simulation import Simulation
from workload.agentic import AgenticCodingOptions, agentic_coding
from workload.model import Workload


def _workload() -> Workload:
    workload = agentic_coding(AgenticCodingOptions(
        sessions=24, duration_s=300.0, ramp_s=60.0, prefix_tokens=8_000,
        task_median_tokens=500, target_min_tokens=10_000, target_max_tokens=16_000))
    workload.warmup_s = 0.0
    return workload


def _booked(gate: GateConfig, workload: Workload, hbm_residency: bool) -> tuple[float, int]:
    """The gate's mean booked prefill (its PrefillMix) and the requests answered."""
    sim = Simulation(workload, RoutingMode.AFFINITY_DDR, SimConfig(
        EmulatorOptions(instances=4, block_size=16), gate=gate, hbm_residency=hbm_residency))
    figures = asyncio.run(sim.run()).stats.figures()
    assert figures["errors"] == 0
    return sim.router._policy.mix.mean_s, figures["requests"]  # type: ignore[attr-defined]


def test_new_sessions_are_booked_less_the_shared_harness() -> None:
    workload = _workload()
    for residency in (False, True):  # the gateway's index, then the engines' own caches
        whole, answered = _booked(GateConfig(), workload, residency)
        less, answered_less = _booked(GateConfig(book_uncached_prefill=True), workload,
                                      residency)
        assert answered == answered_less == len(workload.requests)
        assert 0 < less < whole
