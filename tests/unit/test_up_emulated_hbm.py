"""`kvgate up` with an emulated fleet: the gate's `engine_cost.hbm_tokens` (read by
`load_gate.hbm_estimate: routed`) is the emulated engines' HBM unless the YAML sets it."""

from __future__ import annotations

import argparse

from emulator.command import add_arguments as emulate_arguments
from emulator.command import options_from_args
from emulator.options import EmulatorOptions
from kvgate.config import Config, load_text
from kvgate_cli.up.command import add_arguments, emulator_args, priced
from stack.engine_speed import emulated_cost

ENGINE = EmulatorOptions(hbm_tokens=64_000)


def _yaml(cost: str) -> Config:
    return load_text(f"placement:\n  engine_cost: {{{cost}}}\n", require_pools=False)


def test_the_gate_knows_the_emulated_engines_hbm_unless_the_yaml_sets_it() -> None:
    unpriced = priced(Config(), ENGINE, 1 / 20).placement.engine_cost
    assert unpriced == emulated_cost(ENGINE, 1 / 20) and unpriced.hbm_tokens == 64_000
    assert priced(Config(), ENGINE, 0).placement.engine_cost.hbm_tokens == 64_000  # instant
    own_speed = priced(_yaml("prefill_tokens_per_s: 5000"), ENGINE, 1).placement.engine_cost
    assert (own_speed.prefill_tokens_per_s, own_speed.hbm_tokens) == (5000, 64_000)
    own_hbm = priced(_yaml("hbm_tokens: 100000"), ENGINE, 1).placement.engine_cost
    assert own_hbm.hbm_tokens == 100_000


def test_up_tells_its_emulated_engines_their_hbm() -> None:
    up, emulate = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_arguments(up)
    emulate_arguments(emulate)
    for given, hbm in ((["--hbm-tokens", "64000"], 64_000),
                       ([], EmulatorOptions().hbm_tokens)):
        argv = emulator_args(up.parse_args(given))
        assert options_from_args(emulate.parse_args(list(argv))).hbm_tokens == hbm
