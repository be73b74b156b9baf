"""The Content-Length bound as a regex: exactly 0..N, whatever N."""

from __future__ import annotations

import re

import pytest

from control_plane.resources.digits import at_most


@pytest.mark.parametrize("limit", [0, 1, 9, 10, 11, 19, 20, 99, 100, 101, 190, 555, 1000, 1024,
                                   2099, 4096, 9999, 10000, 65536])
def test_matches_exactly_zero_to_limit(limit: int) -> None:
    pattern = re.compile(at_most(limit))
    for n in range(0, 2 * limit + 200):
        assert bool(pattern.fullmatch(str(n))) == (n <= limit), (limit, n)


def test_large_limits_leading_zeros_and_non_numbers() -> None:
    limit = 4 * 1024 * 1024
    pattern = re.compile(at_most(limit))
    for n in (0, 7, 99_999, 999_999, 1_000_000, limit - 1, limit, limit + 1, 5_000_000,
              9_999_999, 10_000_000, 41_943_040, 10**12):
        assert bool(pattern.fullmatch(str(n))) == (n <= limit), n
    assert pattern.fullmatch("000123")
    for text in ("", "-1", "1e3", " 12", "12 ", "0x10", "4194304,4194304"):
        assert not pattern.fullmatch(text), text


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 0"):
        at_most(-1)
