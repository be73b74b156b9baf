"""How late the event loop runs: a probe that timed out while the loop itself was stalled says
nothing about the engine (its answer may sit unread in the socket), so it does not count.

Measured rather than avoided: probing from a thread would not help when the whole process is
starved of CPU (same GIL, same CPU quota), and lateness catches both a busy loop and a starved
process.
"""

from __future__ import annotations

import asyncio
from collections import deque

import structlog

log = structlog.get_logger("kvgate.health")

TICK = 0.05  # seconds between the monitor's wake-ups
NOTICEABLE = 0.02  # lateness below this is ordinary scheduling noise
LOG_STALL = 1.0  # a stall this long is logged


class LoopLag:
    """Wakes every TICK and keeps how late each wake-up was (the last few minutes of it)."""

    def __init__(self, keep: int = 4096) -> None:
        self._late: deque[tuple[float, float]] = deque(maxlen=keep)  # (woke at, seconds late)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + TICK
            await asyncio.sleep(TICK)
            self.record(loop.time(), loop.time() - due)

    def record(self, woke_at: float, late: float) -> None:
        if late < NOTICEABLE:
            return
        self._late.append((woke_at, late))
        if late >= LOG_STALL:
            log.warning("event_loop_stalled", seconds=round(late, 3))

    def stalled_between(self, start: float, end: float) -> float:
        """Seconds the loop was seen stalled by wake-ups between `start` and `end` (loop time).
        A stall that began before `start` counts whole: erring towards "inconclusive"."""
        total = 0.0
        for woke_at, late in reversed(self._late):
            if woke_at < start:
                break
            if woke_at <= end:
                total += late
        return total
