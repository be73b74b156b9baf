"""`kvgate simulate --pd-decode-puts on`: the decode engines write the DDR pool too, as
vllm-ascend's AscendStoreConnector does with ``consumer_is_to_put: true``."""

from __future__ import annotations

import argparse

from bench_helpers import small_bank

from emulator.options import EmulatorOptions
from kvgate.contract.modes import PdMode
from kvgate.runtime.tasks.loop import run as run_loop
from simulator.command import add_arguments
from simulator.pd_flags import pd_description
from simulator.pd_simulation import PdSimulation
from simulator.run import SimConfig


def _run(decode_puts: bool) -> PdSimulation:
    workload = small_bank(sessions=12, duration_s=240.0, context=3000)
    config = SimConfig(EmulatorOptions(instances=4, block_size=16), pd=(1, 3),
                       hbm_residency=True, decode_puts=decode_puts)
    simulation = PdSimulation(workload, PdMode.KVGATE, config)
    assert run_loop(simulation.run()).stats.figures()["errors"] == 0
    return simulation


def _held(simulation: PdSimulation, turns: list[int]) -> list[int]:
    """How many leading blocks of each turn's prompt the pool holds at the run's end."""
    pool = simulation.pool
    assert pool is not None
    return [pool.held_prefix(simulation.blocks.hashes(i)) for i in turns]


def test_a_prompt_prefilled_on_its_decode_engine_reaches_the_pool_only_with_decode_puts() -> None:
    off, on = _run(False), _run(True)
    assert off.prefilled_on == on.prefilled_on  # the same turns skipped: only the pool differs
    skipped = [i for i, e in enumerate(on.prefilled_on) if e >= 1]
    assert skipped
    chunk = on.pool.chunk  # type: ignore[union-attr]
    # On: every skipped turn's whole blocks were put by its decode engine (the pool is large
    # enough to evict nothing here).
    full = [len(on.blocks.hashes(i)) // chunk * chunk for i in skipped]
    assert _held(on, skipped) == full
    # Off: only the prefill engine writes, so some skipped turn's tail is missing.
    assert any(h < f for h, f in zip(_held(off, skipped), full, strict=True))


def test_the_flag_is_off_by_default_and_named_in_the_result_only_when_on() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--engines", "4", "--pd", "1:3", "--modes", "pd-kvgate"])
    assert args.pd_decode_puts == "off"
    options = EmulatorOptions(instances=4)
    assert "decode_puts" not in pd_description(SimConfig(options, pd=(1, 3)))["pd"]
    on = pd_description(SimConfig(options, pd=(1, 3), decode_puts=True))
    assert on["pd"]["decode_puts"] is True
