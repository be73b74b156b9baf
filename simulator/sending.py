"""When each request is sent: fixed arrivals in order, merged with later turns of a session, each
due once the previous turn's answer is out plus the user's think time (closed loop)."""

from __future__ import annotations

import heapq

from workload.model import Workload

NEVER = float("inf")


class SendOrder:
    """The requests of a workload in the order a simulation sends them.

    :meth:`next_due` peeks, :meth:`pop` takes the next one, and :meth:`answered` (the request's
    answer is complete or it failed) makes the session's next turn due after its think time.
    ``sent`` and ``answered_at`` record each request's instants for the result."""

    def __init__(self, workload: Workload) -> None:
        requests = workload.requests
        self._think = [r.think_s for r in requests]
        self._following = workload.next_turns()
        self._fixed = [i for i, r in enumerate(requests) if r.think_s is None]
        self._fixed_at = [requests[i].arrival for i in self._fixed]
        self._k = 0
        self._turns: list[tuple[float, int]] = []
        self.sent = [0.0] * len(requests)
        self.answered_at = [0.0] * len(requests)

    def next_due(self) -> float:
        """When the next request is sent (``NEVER`` when none is left or due yet)."""
        due = self._fixed_at[self._k] if self._k < len(self._fixed) else NEVER
        turns = self._turns
        if turns and turns[0][0] < due:  # a fixed arrival wins a tie
            return turns[0][0]
        return due

    def pop(self) -> tuple[float, int]:
        """``(now, index)`` of the next request; call only when :meth:`next_due` is finite."""
        k = self._k
        due = self._fixed_at[k] if k < len(self._fixed) else NEVER
        turns = self._turns
        if turns and turns[0][0] < due:
            now, i = heapq.heappop(turns)
        else:
            now, i = due, self._fixed[k]
            self._k = k + 1
        self.sent[i] = now
        return now, i

    def answered(self, i: int, at: float) -> None:
        """Request ``i`` ended at ``at``: its session's next turn is due after the think time."""
        self.answered_at[i] = at
        after = self._following[i]
        if after >= 0:
            heapq.heappush(self._turns, (at + (self._think[after] or 0.0), after))
