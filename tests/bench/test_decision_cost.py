"""bench/decision_cost.py: `--board-from-reports` reaches the gate it measures."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from bench import decision_cost


def test_the_flag_sets_board_from_reports_in_the_gate() -> None:
    assert decision_cost._gate(True, False, reports=True).board_from_reports is True
    assert decision_cost._gate(True, False).board_from_reports is False


def test_a_sticky_decision_is_measured_with_reports_on_the_board() -> None:
    seconds = asyncio.run(decision_cost.per_decision(True, 50, 10, "round", reports=True))
    assert 0 < seconds < 1


def test_the_cases_take_turns_and_the_policy_alone_is_timed() -> None:
    found = asyncio.run(decision_cost.interleaved(("round", "round+hbm"), 40, 10, 2, False,
                                                  gate_only=True))
    assert {case: len(seconds) for case, seconds in found.items()} == {"round": 2,
                                                                       "round+hbm": 2}
    assert all(0 < s < 1 for seconds in found.values() for s in seconds)


def test_calls_are_counted_and_residency_adds_few() -> None:
    """A count no load moves: residency known adds its one ask (and what it calls), not a
    second (kvgate.routing.booking.Ledger.held)."""
    plain = asyncio.run(decision_cost.calls_per_decision("round", 20, 10, False))
    known = asyncio.run(decision_cost.calls_per_decision("round+hbm", 20, 10, False))
    assert plain > 50 and 0 < known - plain < 12


def test_unknown_cases_are_named() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown \\['rund'\\]"):
        decision_cost._cases("round,rund")
