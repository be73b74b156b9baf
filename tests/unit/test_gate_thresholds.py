"""GateConfig's move thresholds, asked for by name (the gate and simulator.move_probe)."""

from __future__ import annotations

from kvgate.config.sections.placement import GateConfig


def test_a_saving_clears_both_thresholds_or_none() -> None:
    gate = GateConfig(min_saving_s=1.0, min_saving_ratio=0.3)
    assert gate.clears(1.0, 3.0)  # 1.0 s, a third of staying's estimate
    assert not gate.clears(0.99, 2.0)  # under min_saving_s
    assert not gate.clears(1.5, 6.0)  # under min_saving_ratio of the stay
    assert gate.clears(1.8, 6.0)


def test_the_thresholds_off_take_any_sooner_sibling_and_the_defaults_come_back() -> None:
    gate = GateConfig(min_saving_s=0.2, min_saving_ratio=0.1, miss_safe=False, cooldown_s=0.0)
    loose = gate.without_move_thresholds()
    assert loose.clears(0.0, 30.0) and loose.clears(-5.0, 30.0)
    assert not loose.miss_safe and loose.cooldown_s == 0.0
    defaults = gate.with_default_move_thresholds()
    assert defaults == GateConfig(cooldown_s=0.0)
    assert not defaults.clears(1.4, 3.0) and defaults.clears(1.5, 3.0)
