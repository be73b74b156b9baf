"""bench/decision_cost.py: `--board-from-reports` reaches the gate it measures."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench import decision_cost


def test_the_flag_sets_board_from_reports_in_the_gate() -> None:
    assert decision_cost._gate(True, False, reports=True).board_from_reports is True
    assert decision_cost._gate(True, False).board_from_reports is False


def test_a_sticky_decision_is_measured_with_reports_on_the_board() -> None:
    seconds = asyncio.run(decision_cost.per_decision(True, 50, 10, "round", reports=True))
    assert 0 < seconds < 1



def test_passes_compare_each_case_s_best(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Pass 1: round 30 us, round+hbm 40 us; pass 2: 20 and 35 us. The best: 20 and 35.
    costs = {"round": [30e-6, 20e-6], "round+hbm": [40e-6, 35e-6]}

    async def measured(gate_on: bool, decisions: int, sessions: int, figures: str = "none",
                       reports: bool = False) -> float:
        return costs[figures].pop(0) if figures in costs else 10e-6

    monkeypatch.setattr(decision_cost, "per_decision", measured)
    monkeypatch.setattr(sys, "argv", ["decision_cost", "--passes", "2"])
    decision_cost.main()
    ratios = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith(("best", "round+hbm / round"))]
    assert ratios == ["round+hbm / round: 1.33 (+10.00 us)", "round+hbm / round: 1.75 (+15.00 us)",
                      "best of 2 passes:", "round+hbm / round: 1.75 (+15.00 us)"]
