"""`kvgate bench --compare` and the load gate: which modes run it, with what prices, and the
refusal of the modes only the simulator runs. (The real runs are in test_bench_compare.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compare import CompareOptions, RunPorts, check_modes, ports_needed, stack_for
from emulator.options import EmulatorOptions
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.modes import RoutingMode
from kvgate_cli.main import main
from stack.engine_speed import emulated_cost


def test_each_mode_gets_the_gate_it_names_priced_for_the_emulated_engines(
        tmp_path: Path) -> None:
    engine = EmulatorOptions(instances=2, time_scale=1 / 20)
    options = CompareOptions(engine, tmp_path)
    ports = RunPorts.of(2, list(range(20000, 20000 + ports_needed(2))))
    on = stack_for(RoutingMode.AFFINITY_DDR, options, ports).config.placement
    off = stack_for(RoutingMode.STICKY_DDR, options, ports).config.placement
    assert on.load_gate.enabled and not off.load_gate.enabled
    # Wall-clock prices: the engines run 20x faster than their figures say.
    assert on.engine_cost == emulated_cost(engine, 1 / 20)
    assert on.engine_cost.prefill_tokens_per_s == pytest.approx(5000.0 * 20)
    assert on.engine_cost.prefill_overhead_s == pytest.approx(0.020 / 20)
    assert on.load_gate.min_saving_s == pytest.approx(GateConfig().min_saving_s / 20)
    # Scraped every 500 ms wall; prompts sized at the bench's own bytes per token.
    assert (on.load_gate.refresh_s, on.load_gate.bytes_per_token) == (0.5, 5.3)


def test_simulated_only_modes_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="kv-cost run in `kvgate simulate`"):
        check_modes([RoutingMode.AFFINITY_DDR, RoutingMode.KV_COST])
    check_modes([RoutingMode.STICKY_DDR, RoutingMode.ROUND_ROBIN_DDR])  # real-stack modes pass
    # On the command line the refusal comes from parsing --modes, before anything starts.
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--compare", "--modes", "affinity+ddr,bounded-hash", "--sessions", "2",
              "--duration-s", "60"])
    assert exited.value.code == 2
    assert "--modes: mode bounded-hash runs in kvgate simulate and plan only" in (
        capsys.readouterr().err)
