"""A collector round on a replica's load board: kept as columns and read per engine on demand,
it answers exactly what a figure put on the board one by one would (the same instant, backlog,
gauges), round after round; an engine the next round lacks keeps its last figure until it ages
out, as before; a forgotten engine stays forgotten until a round reports it again."""

from __future__ import annotations

import pytest

from kvgate.contract.vllm import GAUGES, EngineFigures
from kvgate.placement.live import LoadBoard, ObservedLoad, ObservedRound

MEAN_S = 0.25  # seconds of prefill booked per waiting request


def _round(now: float, engines: dict[str, tuple[int, int, float, float]],
           index: dict[str, int] | None = None) -> ObservedRound:
    """engines: endpoint → (waiting, running, kv_usage, age_s)."""
    index = index if index is not None else {e: i for i, e in enumerate(engines)}
    rows = list(engines.values())
    columns = {"waiting": [r[0] for r in rows], "running": [r[1] for r in rows],
               "kv_usage": [r[2] for r in rows]}
    return ObservedRound(index, now, [r[3] for r in rows], [columns[g.name] for g in GAUGES],
                         MEAN_S)


def test_a_round_reads_as_the_same_figures_put_one_by_one() -> None:
    engines = {"10.0.0.1:1": (4, 2, 0.5, 0.2), "10.0.0.2:1": (0, 1, 0.1, 0.05)}
    by_round, one_by_one = LoadBoard(max_age_s=1.0), LoadBoard(max_age_s=1.0)
    by_round.observe_round(_round(100.0, engines))
    for address, (waiting, running, kv, age) in engines.items():
        one_by_one.observe(address, ObservedLoad(100.0 - age, waiting * MEAN_S, EngineFigures.of(
            waiting=waiting, running=running, kv_usage=kv)))
    for now in (100.0, 100.3, 100.9, 101.1):
        for address in engines:
            assert by_round.observed(address, now) == one_by_one.observed(address, now)
            assert by_round.backlog_s(address, now) == one_by_one.backlog_s(address, now)
    assert by_round.observed("10.0.0.1:1", 100.0) == ObservedLoad(
        99.8, 1.0, EngineFigures.of(waiting=4, running=2, kv_usage=0.5))
    assert by_round.observed("10.0.0.9:1", 100.0) is None  # not in the round


def test_the_next_round_replaces_it_and_an_engine_it_lacks_ages_out() -> None:
    board = LoadBoard(max_age_s=1.0)
    board.observe_round(_round(10.0, {"a:1": (1, 0, 0.0, 0.0), "b:1": (2, 0, 0.0, 0.0)}))
    board.observe_round(_round(10.1, {"a:1": (5, 1, 0.3, 0.0)}))  # b left the collector's set
    seen = board.observed("a:1", 10.1)
    assert seen is not None and seen.figures.waiting == 5
    kept = board.observed("b:1", 10.5)  # its last figure, never read before, still counts
    assert kept is not None and kept.figures.waiting == 2 and kept.at == 10.0
    assert board.observed("b:1", 11.05) is None  # until it is older than max_age_s


def test_rounds_of_the_same_engines_share_one_index() -> None:
    board, index = LoadBoard(max_age_s=1.0), {"a:1": 0}
    board.observe_round(_round(1.0, {"a:1": (1, 0, 0.0, 0.0)}, index))
    board.observe_round(_round(1.1, {"a:1": (3, 0, 0.0, 0.05)}, index))
    seen = board.observed("a:1", 1.1)
    assert seen is not None and (seen.figures.waiting, seen.at) == (3, pytest.approx(1.05))


def test_a_forgotten_engine_stays_forgotten_until_a_round_reports_it() -> None:
    board = LoadBoard(max_age_s=1.0)
    board.observe_round(_round(5.0, {"a:1": (3, 0, 0.0, 0.0)}))
    board.routed("a:1", 5.0, 2.0)
    assert board.backlog_s("a:1", 5.0) == 2.0
    board.forget("a:1")  # it failed: its queue is gone
    assert board.observed("a:1", 5.0) is None and board.backlog_s("a:1", 5.0) == 0.0
    board.observe_round(_round(5.1, {"a:1": (1, 0, 0.0, 0.0)}))
    seen = board.observed("a:1", 5.1)
    assert seen is not None and seen.figures.waiting == 1


def test_a_newer_scrape_wins_over_an_older_round_and_the_reverse() -> None:
    board = LoadBoard(max_age_s=1.0)
    board.observe_round(_round(2.0, {"a:1": (3, 0, 0.0, 0.5)}))  # read at 1.5
    board.observe("a:1", ObservedLoad(1.8, figures=EngineFigures.of(waiting=7)))
    seen = board.observed("a:1", 2.0)
    assert seen is not None and seen.figures.waiting == 7
    board.observe_round(_round(2.1, {"a:1": (1, 0, 0.0, 0.0)}))  # read at 2.1
    seen = board.observed("a:1", 2.1)
    assert seen is not None and seen.figures.waiting == 1
