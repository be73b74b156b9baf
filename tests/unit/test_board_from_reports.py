"""`placement.load_gate.board_from_reports`: an engine's backlog is its fresh report, aged, plus
what this router booked there since that report; the ledger only where no report is fresh."""

from __future__ import annotations

import pytest

from kvgate.config.sections.placement import GateConfig, decision_settings
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.routing.gated import GatedPolicy


def _board(from_reports: bool) -> LoadBoard:
    board = LoadBoard(max_age_s=2.0)
    board.from_reports = from_reports
    return board


def test_off_the_larger_of_ledger_and_report() -> None:
    board = _board(False)
    board.routed("a", 0.0, 10.0)  # the ledger over-booked: the engine reports far less
    board.observe("a", ObservedLoad(1.0, 2.0))
    assert board.backlog_s("a", 1.0) == pytest.approx(9.0)


def test_on_a_fresh_report_caps_the_ledgers_drift() -> None:
    board = _board(True)
    for _ in range(10):  # ten 1 s prefills booked: the engine reports 2 s left
        board.routed("a", 0.0, 1.0)
    board.observe("a", ObservedLoad(1.0, 2.0))
    # The report, plus at most the largest prefill booked before it (it may be running).
    assert board.backlog_s("a", 1.0) == pytest.approx(3.0)
    assert board.backlog_s("a", 1.5) == pytest.approx(2.0)  # both aged by the time since


def test_on_the_ledger_keeps_a_running_prefill_the_report_misses() -> None:
    board = _board(True)
    board.routed("a", 0.0, 4.0)  # in prefill: vLLM counts it running, not waiting
    board.observe("a", ObservedLoad(1.0, 0.0))
    assert board.backlog_s("a", 1.0) == pytest.approx(3.0)


def test_on_what_was_booked_since_the_report_counts() -> None:
    board = _board(True)
    board.observe("a", ObservedLoad(1.0, 2.0))
    board.routed("a", 1.2, 0.5)
    board.routed("a", 1.4, 0.25)
    assert board.backlog_s("a", 1.5) == pytest.approx(1.5 + 0.75)


def test_on_without_a_fresh_report_the_ledger() -> None:
    board = _board(True)
    board.routed("a", 0.0, 10.0)
    assert board.backlog_s("a", 1.0) == pytest.approx(9.0)
    board.observe("a", ObservedLoad(1.0, 2.0))
    assert board.backlog_s("a", 3.5) == pytest.approx(6.5)  # the report is 2.5 s old


def test_on_an_under_booked_engine_shows_its_report() -> None:
    board = _board(True)
    board.routed("a", 0.0, 0.1)  # reloads booked as almost nothing; the engine queues 8 s
    board.observe("a", ObservedLoad(0.5, 8.0))
    assert board.backlog_s("a", 0.5) == pytest.approx(8.0)


def test_forget_drops_the_bookings() -> None:
    board = _board(True)
    board.observe("a", ObservedLoad(1.0, 2.0))
    board.routed("a", 1.2, 5.0)
    board.forget("a")
    board.observe("a", ObservedLoad(1.3, 1.0))
    assert board.backlog_s("a", 1.3) == pytest.approx(1.0)


def test_the_policy_sets_the_board_from_its_config() -> None:
    on, off = LoadBoard(), LoadBoard()
    GatedPolicy(EngineCost(), GateConfig(board_from_reports=True), on)
    GatedPolicy(EngineCost(), GateConfig(), off)
    assert on.from_reports and not off.from_reports
    assert "board_from_reports" not in decision_settings(GateConfig())
    assert decision_settings(GateConfig(board_from_reports=True))["board_from_reports"] is True
