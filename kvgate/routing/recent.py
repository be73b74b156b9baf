"""What the load gate remembers between requests: each session's size and last move. The mean
prefill of the requests it booked is `kvgate.fleet.prefill_mix.PrefillMix` (the engines'
figures read it too)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from kvgate.generations import Generations


class Seen(NamedTuple):
    tokens: int  # its last prompt's estimated size: what its engine holds of the next one
    moved_at: float | None  # when the load gate last moved it (hysteresis)


class RecentSessions:
    """A bounded memory in two generations (:class:`Generations`; ext_proc ends one every idle
    TTL too, ``max_age_s``). Per replica, never stored: a session it has not seen is priced as
    if nothing of it were cached. The simulator keeps the capacity alone."""

    def __init__(self, capacity: int = 262_144, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: Generations[str, Seen | None] = Generations(capacity, max_age_s, clock)

    def get(self, pool: str, session: str) -> Seen | None:
        return self._seen.find(f"{pool}/{session}", None)

    def remember(self, pool: str, session: str, tokens: int, moved_at: float | None) -> None:
        key = f"{pool}/{session}"
        if moved_at is None:
            before = self._seen.find(key, None)
            moved_at = None if before is None else before.moved_at
        self._seen.put(key, Seen(tokens, moved_at))

    def __len__(self) -> int:
        return len(self._seen)

