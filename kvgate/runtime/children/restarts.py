"""When a child process that died is started again, and when it is given up on.

The first restart is almost at once (the gateway's data plane, Envoy, must serve again within
seconds); each further death within the window waits longer, so a child that dies at start-up
(a port another program took, a broken binary) does not spin. A child that died `max_restarts`
times within `window_s` and dies again cannot come back: the supervisor stops there and says
why. Deaths older than the window are forgotten, so a child that crashes once a day is always
restarted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    # Pause before the 1st, 2nd, ... restart within the window; the last one repeats.
    backoff_s: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 4.0)
    max_restarts: int = 5
    window_s: float = 60.0

    def describe(self) -> str:
        return f"{self.max_restarts} restarts within {self.window_s:g} s"


class RestartBudget:
    """One child's recent restarts under a policy."""

    def __init__(self, policy: RestartPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._restarts: deque[float] = deque()  # when each recent restart was granted
        self.total = 0  # restarts granted since the child first started

    def recent(self) -> int:
        """Restarts granted within the window, up to now."""
        cutoff = self._clock() - self.policy.window_s
        while self._restarts and self._restarts[0] < cutoff:
            self._restarts.popleft()
        return len(self._restarts)

    def next_pause(self) -> float | None:
        """The child died: seconds to wait before starting it again (the restart is counted
        now), or None when it has used up its restarts within the window."""
        recent = self.recent()
        if recent >= self.policy.max_restarts:
            return None
        self._restarts.append(self._clock())
        self.total += 1
        backoff = self.policy.backoff_s
        return backoff[min(recent, len(backoff) - 1)]
