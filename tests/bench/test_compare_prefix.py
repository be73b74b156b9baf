"""`kvgate bench --compare --gate-prefix-placement on`: the load-aware modes run the gate's prefix
step (ext_proc reads new sessions' prompts); the others are untouched; refused without
--compare. The step itself through the real stack: tests/gateway/test_prefix_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compare import CompareOptions, reserved_ports, stack_for
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from kvgate_cli.main import main


def test_the_prefix_step_is_on_in_the_gated_modes_only(tmp_path: Path) -> None:
    engine = EmulatorOptions(instances=2, time_scale=1 / 40)
    on = CompareOptions(engine, tmp_path, prefix_placement=True)
    with reserved_ports(on) as ports:
        assert stack_for(RoutingMode.AFFINITY_DDR, on, ports).config.placement.load_gate \
            .reads_prompts
        assert not stack_for(RoutingMode.STICKY_DDR, on, ports).config.placement.load_gate \
            .reads_prompts
        off = CompareOptions(engine, tmp_path)
        assert not stack_for(RoutingMode.AFFINITY_DDR, off, ports).config.placement.load_gate \
            .reads_prompts


def test_the_prefix_step_is_refused_without_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--gateway", "http://127.0.0.1:1", "--gate-prefix-placement", "on",
                 "--sessions", "2", "--duration-s", "60"])
    assert code == 2
    assert "--gate-prefix-placement applies to --compare only" in capsys.readouterr().err
