"""bench/decision_cost.py: `--board-from-reports` reaches the gate it measures."""

from __future__ import annotations

import asyncio

from bench import decision_cost


def test_the_flag_sets_board_from_reports_in_the_gate() -> None:
    assert decision_cost._gate(True, False, reports=True).board_from_reports is True
    assert decision_cost._gate(True, False).board_from_reports is False


def test_a_sticky_decision_is_measured_with_reports_on_the_board() -> None:
    seconds = asyncio.run(decision_cost.per_decision(True, 50, 10, "round", reports=True))
    assert 0 < seconds < 1
