"""`board_from_reports`' bookkeeping kept as bookings arrive (kvgate.placement.since_report)
gives what walking every booking on each read gives: compared over random sequences."""

from __future__ import annotations

import math
import random

import pytest

from kvgate.contract.vllm import EngineFigures
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.placement.since_report import KEPT_BEFORE, BookedSince


class WalkingBoard(LoadBoard):
    """The straightforward rule: every booking kept and walked on each read. The window is the
    bookings of the last 2 x max_age_s (left from the front, as booked); a report's waiting
    requests are the newest that many booked at or before it among the window and the
    KEPT_BEFORE before it, any more at the report's mean. `in_order`: the seconds booked after
    the report added one by one to the aged report, as the board before since_report did; else
    summed first, then added (as the kept sum is)."""

    def __init__(self, max_age_s: float, in_order: bool) -> None:
        super().__init__(max_age_s)
        self.from_reports = True
        self.in_order = in_order
        self.booked: dict[str, list[tuple[float, float]]] = {}
        self.left: dict[str, int] = {}  # how many left the window, per engine

    def routed(self, address: str, now: float, prefill_s: float,
               ready_at: float | None = None) -> None:
        super().routed(address, now, prefill_s, ready_at)
        booked = self.booked.setdefault(address, [])
        booked.append((now, prefill_s))
        left = self.left.get(address, 0)
        while left < len(booked) and now - booked[left][0] > 2 * self.max_age_s:
            left += 1
        self.left[address] = left

    def forget(self, address: str) -> None:
        super().forget(address)
        self.booked.pop(address, None)
        self.left.pop(address, None)

    def _from_report(self, address: str, now: float, seen: ObservedLoad, ledger: float
                     ) -> float:
        booked, left = self.booked.get(address, []), self.left.get(address, 0)
        waiting = seen.figures.waiting
        backlog = seen.backlog_s
        if waiting > 0 and booked:
            newest = [seconds for at, seconds in booked[max(0, left - KEPT_BEFORE):]
                      if at <= seen.at][-waiting:]
            backlog = 0.0
            for seconds in newest:
                backlog += seconds
            if len(newest) < waiting:
                backlog += (waiting - len(newest)) * (seen.backlog_s / waiting)
        report = max(0.0, backlog - max(0.0, now - seen.at))
        after = before = 0.0
        for at, seconds in booked[left:]:
            if at > seen.at:
                if self.in_order:
                    report += seconds
                else:
                    after += seconds
            elif seconds > before:
                before = seconds
        report += after
        unseen = max(0.0, before - max(0.0, now - seen.at))
        return max(report, min(ledger, report + unseen))


def _run(seed: int, disorder: float, steps: int = 3000) -> tuple[list[float], list[float],
                                                                   list[float]]:
    """Random bookings, reports and reads on three engines, mostly forward in time, with
    `disorder` of the bookings made before the previous one; each read on all three boards."""
    rng = random.Random(seed)
    kept, walked, in_order = (LoadBoard(0.5), WalkingBoard(0.5, False),
                              WalkingBoard(0.5, True))
    kept.from_reports = True
    boards = (kept, walked, in_order)
    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    now = 0.0
    for _ in range(steps):
        now += rng.expovariate(20.0)
        address = rng.choice("abc")
        what = rng.random()
        if what < 0.45:
            at = now - rng.uniform(0.0, 0.3) if rng.random() < disorder else now
            seconds = rng.choice((0.0, rng.uniform(0.0, 2.0), rng.uniform(0.0, 0.01)))
            for board in boards:
                board.routed(address, at, seconds)
        elif what < 0.6:
            # Reports as the simulator's scraper gives them: at a tick, now and then older.
            at = math.floor(now / 0.05) * 0.05 - (0.3 if rng.random() < 0.05 else 0.0)
            waiting = rng.choice((0, 0, 1, 3, 20, 200))  # 0 with seconds: a backlog alone
            load = (ObservedLoad(at, waiting * rng.uniform(0.0, 0.5),
                                 EngineFigures.of(waiting=waiting)) if waiting
                    else ObservedLoad(at, rng.uniform(0.0, 3.0)))
            for board in boards:
                board.observe(address, load)
        elif what < 0.603:
            for board in boards:
                board.forget(address)
        else:
            read_at = now + rng.uniform(0.0, 0.1)  # reads need not go forward in time
            for board, values in zip(boards, out, strict=True):
                values.append(board.backlog_s(address, read_at))
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("disorder", [0.0, 0.02])
def test_kept_equals_walking_every_booking(seed: int, disorder: float) -> None:
    kept, walked, in_order = _run(seed, disorder)
    assert len(kept) > 500
    assert kept == walked  # identical, float for float
    # The walk added each booking to the report in turn: the same to rounding.
    assert kept == pytest.approx(in_order, rel=1e-12, abs=1e-12)


def test_a_report_splits_the_bookings_before_and_after_it() -> None:
    since = BookedSince()
    for at, seconds in ((0.0, 3.0), (0.5, 1.0), (1.0, 2.0), (1.5, 0.25)):
        since.book(at, seconds, 4.0)
    assert since.split(0.75) == (2.25, 3.0)
    assert since.split(1.25) == (0.25, 3.0)  # forward
    assert since.split(0.25) == (3.25, 3.0)  # back again
    since.book(4.5, 0.5, 4.0)  # the first booking leaves the window
    assert since.split(1.25) == (0.75, 2.0)


def test_a_booking_out_of_order_is_split_right() -> None:
    since = BookedSince()
    since.book(1.0, 1.0, 4.0)
    assert since.split(0.5) == (1.0, 0.0)
    since.book(0.25, 2.0, 4.0)  # made before the report, booked after one made after it
    assert since.split(0.5) == (1.0, 2.0)
    since.book(4.5, 0.5, 4.0)  # they leave from the front only, as booked
    assert since.split(4.0) == (0.5, 2.0)
    since.book(5.5, 0.25, 4.0)  # both leave: in order again
    assert since.split(5.0) == (0.25, 0.5)
    assert since.split(6.0) == (0.0, 0.5)


def test_the_newest_booked_before_a_report_are_what_waits() -> None:
    since = BookedSince()
    for at, seconds in ((0.0, 3.0), (0.5, 1.0), (1.0, 2.0), (1.5, 0.25)):
        since.book(at, seconds, 4.0)
    assert since.waiting_s(1.25, 2) == (3.0, 2)  # 1.0 and 2.0: the 3 s one is in prefill
    assert since.waiting_s(1.25, 5) == (6.0, 3)  # only three booked before the report
    assert since.waiting_s(1.25, 0) == (0.0, 0)
    since.book(9.0, 0.5, 4.0)  # the rest leave the window, still kept for a waiting queue
    assert since.waiting_s(9.5, 2) == (0.75, 2)


def test_memory_stays_one_window() -> None:
    since = BookedSince()
    for i in range(10_000):
        since.book(i * 0.01, 1.0, 1.0)
        if i % 7 == 0:
            since.split(i * 0.01 - 0.5)
    assert len(since._at) <= 2 * (101 + 64) + 64
