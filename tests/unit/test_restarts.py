"""When `kvgate up` starts a dead child again, and when it gives up on it."""

from __future__ import annotations

from kvgate.runtime.children.restarts import RestartBudget, RestartPolicy
from kvgate_cli.up.supervise import how_it_ended


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_grows_then_it_gives_up_after_five_restarts_within_a_minute() -> None:
    clock = Clock()
    budget = RestartBudget(RestartPolicy(), clock)
    pauses = []
    for _ in range(5):
        pauses.append(budget.next_pause())
        clock.now += 5.0
    assert pauses == [0.1, 0.5, 1.0, 2.0, 4.0]
    assert budget.next_pause() is None  # a 6th death within 60 s: it cannot come back
    assert budget.total == 5


def test_deaths_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    budget = RestartBudget(RestartPolicy(max_restarts=2, window_s=60.0), clock)
    assert budget.next_pause() == 0.1
    clock.now += 30.0
    assert budget.next_pause() == 0.5
    clock.now += 31.0  # the first restart is now 61 s old
    assert budget.recent() == 1
    assert budget.next_pause() == 0.5  # backoff from what is recent
    assert budget.next_pause() is None
    assert budget.total == 3


def test_how_a_child_ended_is_said_in_words() -> None:
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(1) == "exited with code 1"
    assert how_it_ended(None) == "did not start"
    assert RestartPolicy().describe() == "5 restarts within 60 s"
