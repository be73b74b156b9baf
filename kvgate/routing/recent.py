"""What the load gate remembers between requests: each session's size and last move, and the
mean prefill of the requests it booked."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple


class Seen(NamedTuple):
    tokens: int  # its last prompt's estimated size: what its engine holds of the next one
    moved_at: float | None  # when the load gate last moved it (hysteresis)


class RecentSessions:
    """A bounded memory, two generations like `SessionIds`: when the current one is full, or
    older than ``max_age_s``, it becomes the old one, and a session found there moves back. Per
    replica, never stored: a session it has not seen is priced as if nothing of it were cached.

    ``max_age_s`` (ext_proc: the session's idle TTL): a session idle that long has lost its
    binding and comes back as a new one, so remembering it longer only costs memory; without it
    the memory filled up to its capacity (about 80 MB at 2 × 262,144 sessions), growing for
    hours under steady new sessions (tests/chaos/test_soak.py). The simulator keeps the
    capacity alone, so no figure moved."""

    def __init__(self, capacity: int = 262_144, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._current: dict[str, Seen] = {}
        self._old: dict[str, Seen] = {}
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._clock = clock
        self._since = clock()  # when the current generation began

    def get(self, pool: str, session: str) -> Seen | None:
        key = f"{pool}/{session}"
        seen = self._current.get(key)
        if seen is None:
            seen = self._old.get(key)
        return seen

    def remember(self, pool: str, session: str, tokens: int, moved_at: float | None) -> None:
        key = f"{pool}/{session}"
        if moved_at is None:
            before = self._current.get(key) or self._old.get(key)
            moved_at = None if before is None else before.moved_at
        if key not in self._current and len(self._current) >= self._capacity:
            self._rotate()
        elif self._max_age_s is not None and self._clock() - self._since >= self._max_age_s:
            self._rotate()
        self._current[key] = Seen(tokens, moved_at)

    def _rotate(self) -> None:
        self._old = self._current
        self._current = {}
        self._since = self._clock()

    def __len__(self) -> int:
        return len(self._current) + len(self._old)


class PrefillMix:
    """A running mean of the prefill seconds this replica books per request: the plain mean of
    the first 100, then an exponential one over about the last 100. What a request waiting on
    an engine (`vllm:num_requests_waiting`) is assumed to need."""

    def __init__(self) -> None:
        self.mean_s = 0.0
        self._seen = 0

    def add(self, seconds: float) -> None:
        if self._seen < 100:
            self._seen += 1
            self.mean_s += (seconds - self.mean_s) / self._seen
        else:
            self.mean_s += (seconds - self.mean_s) * 0.01
