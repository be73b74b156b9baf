"""What the load gate remembers of sessions: bounded by a capacity and, in ext_proc, by the idle
TTL, so a steady stream of new sessions does not grow a replica's memory for hours."""

from __future__ import annotations

from kvgate.routing.recent import RecentSessions, Seen


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_session_idle_past_twice_the_age_is_forgotten_and_one_in_use_is_not() -> None:
    clock = Clock()
    recent = RecentSessions(max_age_s=10.0, clock=clock)
    recent.remember("p", "idle", 100, None)
    recent.remember("p", "busy", 200, 5.0)
    for now in (6.0, 12.0, 18.0, 24.0):  # "busy" keeps coming back; "idle" never does
        clock.now = now
        recent.remember("p", "busy", 200, None)
        recent.remember("p", f"new-{now:g}", 1, None)
    assert recent.get("p", "idle") is None
    assert recent.get("p", "busy") == Seen(200, 5.0)  # its last move is kept as it comes back
    assert len(recent) <= 6


def test_without_an_age_only_the_capacity_bounds_it() -> None:
    clock = Clock()
    recent = RecentSessions(capacity=2, clock=clock)
    recent.remember("p", "a", 1, None)
    clock.now = 1e9
    recent.remember("p", "b", 2, None)
    assert recent.get("p", "a") == Seen(1, None)  # time alone forgets nothing
    recent.remember("p", "c", 3, None)  # the current generation was full: a and b are old now
    recent.remember("p", "d", 4, None)
    recent.remember("p", "e", 5, None)  # full again: a and b are gone
    assert recent.get("p", "a") is None and recent.get("p", "c") == Seen(3, None)
