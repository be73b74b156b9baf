"""A bounded memory in two generations, for what the hot path memoises per session (the session
ids' normalisation, the load gate's memory of sessions)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Generations(Generic[K, V]):
    """What is put goes into the current generation; when that is full, or older than
    ``max_age_s``, it becomes the old one and the one before is dropped. A key found only in the
    old generation is still answered, and moves back when put again, so what is in use stays
    however much passes by. The bound and the age are checked when a key new to the current
    generation is put, never on a read nor on a put of a key it holds: the clock is not read
    for what is already there.

    ``max_age_s`` (ext_proc: the session's idle TTL): a session idle that long has lost its
    binding and comes back as a new one, so keeping it longer only costs memory. Without it,
    memories sized for a busy gateway filled for hours under steady new sessions
    (tests/chaos/test_soak.py: the gate's memory, then the session-id memo)."""

    def __init__(self, capacity: int, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.current: dict[K, V] = {}  # read directly on hot paths (a hit costs one lookup)
        self._old: dict[K, V] = {}
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._clock = clock
        self._since = clock()  # when the current generation began

    def find(self, key: K, default: V) -> V:
        """The key's value, from either generation; ``default`` if neither holds it."""
        if key in self.current:
            return self.current[key]
        return self._old.get(key, default)

    def put(self, key: K, value: V) -> None:
        if key not in self.current and (
                len(self.current) >= self._capacity
                or (self._max_age_s is not None
                    and self._clock() - self._since >= self._max_age_s)):
            self._old, self.current = self.current, {}
            self._since = self._clock()
        self.current[key] = value

    def __len__(self) -> int:
        return len(self.current) + len(self._old)
