"""GateConfig's move thresholds, asked for by name (the gate, simulator.move_probe and
simulator.peak_probe)."""

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


def test_a_moved_session_cools_down_for_cooldown_s_only() -> None:
    gate = GateConfig(cooldown_s=30.0)
    assert not gate.cooling(None, 100.0)  # never moved
    assert gate.cooling(80.0, 100.0)
    assert not gate.cooling(70.0, 100.0)  # 30 s since: free to move again
    assert not GateConfig(cooldown_s=0.0).cooling(100.0, 100.0)


def test_a_decision_scores_the_rings_first_candidates() -> None:
    assert GateConfig(candidates=2).scored(["a", "b", "c"]) == ["a", "b"]
    assert GateConfig(candidates=8).scored(("a",)) == ("a",)


def test_miss_safe_and_the_saving_ratio_turn_off_one_at_a_time() -> None:
    gate = GateConfig(min_saving_s=1.0, min_saving_ratio=0.3, cooldown_s=5.0)
    loose = gate.without_miss_safe()
    assert loose == GateConfig(min_saving_s=1.0, min_saving_ratio=0.3, cooldown_s=5.0,
                               miss_safe=False)
    assert not loose.clears(1.5, 6.0)  # the ratio still holds
    no_ratio = loose.without_saving_ratio()
    assert no_ratio.clears(1.5, 6.0) and not no_ratio.clears(0.9, 1.0)  # min_saving_s holds
    assert not no_ratio.miss_safe and gate.without_saving_ratio().miss_safe
