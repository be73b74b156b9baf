"""What each engine's HBM holds, estimated from what the gateway routed there
(kvgate.placement.routed_hbm): last-use order against capacity, evicted least recently used
first and a session's last tokens first, the prefix every session shares held once."""

from __future__ import annotations

import pytest

from kvgate.placement.evictions import MIN_SPAN_S
from kvgate.placement.routed_hbm import RoutedHbm

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def test_sessions_within_capacity_are_held_whole() -> None:
    hbm = RoutedHbm(100)
    hbm.placed(A, "s1", 40, (), 0.0)
    hbm.placed(A, "s2", 60, (), 1.0)
    assert hbm.hbm_tokens(A, "s1", 40) == 40
    assert hbm.hbm_tokens(A, "s2", 60) == 60


def test_past_capacity_the_least_recently_used_leaves_first_its_last_tokens_first() -> None:
    hbm = RoutedHbm(100)
    hbm.placed(A, "s1", 40, (), 0.0)
    hbm.placed(A, "s2", 40, (), 1.0)
    hbm.turn(A, "s1", 40, 2.0)  # s1 used again: s2 is now the least recent
    hbm.placed(A, "s3", 40, (), 3.0)  # 120 > 100: 20 of s2's tokens leave
    assert hbm.hbm_tokens(A, "s2", 40) == 20  # its leading half still there
    assert hbm.hbm_tokens(A, "s1", 40) == 40
    assert hbm.hbm_tokens(A, "s3", 40) == 40
    hbm.placed(A, "s4", 30, (), 4.0)  # 30 more: s2's last 20, then 10 of s1's
    assert hbm.hbm_tokens(A, "s2", 40) == 0
    assert hbm.hbm_tokens(A, "s1", 40) == 30
    hbm.turn(A, "s2", 50, 5.0)  # its context comes back whole, grown, the most recent
    assert hbm.hbm_tokens(A, "s2", 50) == 50
    assert hbm.hbm_tokens(A, "s1", 40) == 0  # 30 + 40 + 30 + 50 > 100: s1 went first


def test_the_answer_is_in_the_callers_units() -> None:
    hbm = RoutedHbm(100)
    hbm.placed(A, "s1", 80, (), 0.0)
    hbm.placed(A, "s2", 60, (), 1.0)  # 40 of s1's 80 left
    assert hbm.hbm_tokens(A, "s1", 160) == 80  # half of it, asked in other units
    assert (hbm.hbm_share(A, "s1"), hbm.hbm_share(A, "s2")) == (0.5, 1.0)  # unit-free
    assert hbm.hbm_share(B, "s1") is None


def test_a_session_not_routed_there_is_not_known() -> None:
    hbm = RoutedHbm(100)
    hbm.placed(A, "s1", 40, (), 0.0)
    assert hbm.hbm_tokens(B, "s1", 40) is None
    assert hbm.hbm_tokens(A, "other", 40) is None
    hbm.placed(B, "s1", 40, (), 1.0)  # moved: its engine is B now
    assert hbm.hbm_tokens(A, "s1", 40) is None
    assert hbm.hbm_tokens(B, "s1", 40) == 40
    hbm.forget(B)  # B left the fleet
    assert hbm.hbm_tokens(B, "s1", 40) is None


def test_what_a_moved_session_left_behind_still_fills_its_old_engine() -> None:
    hbm = RoutedHbm(100)
    hbm.placed(A, "s1", 60, (), 0.0)
    hbm.placed(B, "s1", 60, (), 1.0)
    hbm.placed(A, "s2", 60, (), 2.0)  # s1's blocks on A are still cached: 20 leave
    hbm.placed(A, "s1", 60, (), 3.0)  # back on A: counted once, whole, the most recent
    assert hbm.hbm_tokens(A, "s1", 60) == 60
    assert hbm.hbm_tokens(A, "s2", 60) == 40


def test_the_prefix_every_session_shares_is_held_once_per_engine() -> None:
    harness = list(range(100, 110))  # 10 blocks of 10 tokens shared by every session
    hbm = RoutedHbm(300, block_tokens=10)
    for i in range(8):  # 8 sessions of 100 shared + 20 own tokens: 120 each, 960 in all
        hbm.placed(A, f"s{i}", 120, [*harness, 1000 + i, 2000 + i], float(i))
    # Held: the harness once (100, off the capacity), the first session whole (120: nothing
    # was shared when it came) and 7 × 20 own tokens: 260 > 200, so 60 leave, from s0.
    assert hbm.hbm_tokens(A, "s0", 120) == 60
    for i in range(1, 8):
        assert hbm.hbm_tokens(A, f"s{i}", 120) == 120
    # Counted once per session instead, 960 tokens in 300: five of them would be gone.


def test_a_session_that_shares_nothing_leaves_nothing_shared() -> None:
    hbm = RoutedHbm(1000, block_tokens=10)
    hbm.placed(A, "s0", 100, [1, 2, 3], 0.0)
    hbm.placed(A, "s1", 100, [1, 2, 4], 1.0)  # shares 2 blocks with s0
    assert hbm.shared(A) == 20
    hbm.placed(A, "s2", 100, [9], 2.0)  # shares nothing: nothing is common any more
    hbm.placed(A, "s3", 100, [1, 2, 5], 3.0)
    assert hbm.shared(A) == 0
    assert hbm.shared(B) == 0


def test_its_eviction_rate_is_what_it_estimated_evicted() -> None:
    hbm = RoutedHbm(100, block_tokens=10)
    assert hbm.eviction_rate(A) is None
    for second in range(0, 60):  # 50 tokens a second past a full HBM: 5 blocks a second
        hbm.placed(A, f"s{second}", 50, (), float(second))
        hbm.eviction_rate(A)  # sampled as the gate asks
    assert hbm.eviction_rate(A) == pytest.approx(5.0, rel=0.05)
    assert MIN_SPAN_S < 60


def test_a_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="HBM capacity must be positive, got 0"):
        RoutedHbm(0)
