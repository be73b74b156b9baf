"""The simulator's kvgate runs the core's link backlog (kvgate.placement.links) on the simulated
fleet's nodes (engine i on node i // devices_per_node, as emulator/transfer.py groups them)."""

from __future__ import annotations

from bench_helpers import small_bank

from emulator.options import EmulatorOptions
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.modes import RoutingMode
from simulator.run import SimConfig, engine_address, simulate
from simulator.simulation import Simulation

TERMS = ("queue_wait", "ddr_read", "link_backlog", "prefill")


def _config(gate: GateConfig) -> SimConfig:
    return SimConfig(EmulatorOptions(instances=10, block_size=16), gate=gate,
                     hbm_residency=True)


def test_the_term_reads_the_simulated_nodes_links() -> None:
    sim = Simulation(small_bank(sessions=8), RoutingMode.AFFINITY_DDR,
                     _config(GateConfig(terms=TERMS)))
    links = sim.router._policy.links  # type: ignore[attr-defined]
    assert links is not None
    links.book(engine_address(0), 0.0, 200_000)  # 52 GB: 0.36 s of a 144 GB/s node link
    assert links.wait_s(engine_address(7), 0.0) > 0.3  # engines 0..7 share node 0
    assert links.wait_s(engine_address(8), 0.0) == 0.0  # engine 8 is on node 1


def test_a_run_with_the_term_answers_every_request() -> None:
    workload = small_bank(sessions=24)
    figures = simulate(workload, RoutingMode.AFFINITY_DDR,
                       _config(GateConfig(terms=TERMS))).stats.figures()
    assert figures["errors"] == 0 and figures["requests"] == len(workload.requests)
