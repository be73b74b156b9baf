"""Emulated time for the live server: wall time = emulated time x time scale."""

from __future__ import annotations

import asyncio
import time


class EmulatedClock:
    """Maps the event loop's monotonic clock to emulated seconds.

    ``time_scale`` is wall seconds per emulated second: 1 is real time, 1/60 runs an hour in a
    minute, 0 never waits (emulated time then equals wall time, and nothing sleeps).
    """

    def __init__(self, time_scale: float) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.time_scale = time_scale
        self._origin = time.monotonic()

    def now(self) -> float:
        """Current emulated time in seconds."""
        wall = time.monotonic() - self._origin
        return wall / self.time_scale if self.time_scale > 0 else wall

    async def sleep_until(self, emulated: float) -> None:
        """Wait until emulated time ``emulated`` (returns at once when the scale is 0)."""
        if self.time_scale <= 0:
            return
        delay = (emulated - self.now()) * self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)
