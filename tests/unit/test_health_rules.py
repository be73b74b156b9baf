"""The health guard and the loop-lag monitor: pure logic."""

from __future__ import annotations

import pytest

from control_plane.health.guard import allowed_failures, guard
from control_plane.health.lag import LoopLag


@pytest.mark.parametrize(("size", "fraction", "limit"), [
    (4, 0.5, 2), (5, 0.5, 2), (1, 0.5, 0), (2, 0.5, 1), (10, 0.3, 3), (3, 1.0, 3), (4, 0.0, 0),
])
def test_allowed_failures(size: int, fraction: float, limit: int) -> None:
    assert allowed_failures(size, fraction) == limit


def test_guard_fails_first_come_up_to_the_limit_and_holds_the_rest() -> None:
    verdict = guard(["c", "a", "b"], failed=set(), limit=2)
    assert verdict.failed == {"c", "a"} and verdict.held == ("b",)


def test_guard_keeps_failed_engines_failed_and_frees_room_as_they_recover() -> None:
    assert guard(["b", "a", "c"], failed={"a", "c"}, limit=2).held == ("b",)
    after_a_recovers = guard(["b", "c"], failed={"a", "c"}, limit=2)
    assert after_a_recovers.failed == {"b", "c"} and after_a_recovers.held == ()


def test_lag_counts_only_noticeable_late_wakeups_in_the_window() -> None:
    lag = LoopLag()
    lag.record(10.0, 0.001)  # noise
    lag.record(10.5, 0.3)
    lag.record(11.0, 0.4)
    lag.record(12.0, 0.2)
    assert lag.stalled_between(10.4, 11.5) == pytest.approx(0.7)
    assert lag.stalled_between(9.0, 10.2) == 0.0
