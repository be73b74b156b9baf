"""The DDR pool as the emulator hosts it: the pool's blocks, its links and its faults, on the
fleet's emulated clock.

A load (lookup, then the transfer of the blocks found to the engine's device) returns once the
transfer is over, timed by the same :class:`TransferModel` as the simulator's: transfers in
flight share the device, node and pool links max-min fairly and each pays the fixed cost. The
pool is down or slow in the windows of :class:`PoolFaults` (emulated seconds since the fleet
started): down, it refuses every call (the engine treats that as a miss, as a connector does) and
it comes back empty.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from emulator.clock import EmulatedClock
from emulator.ddr_pool import DdrPool
from emulator.pool_faults import PoolFaults
from emulator.transfer import TransferModel, TransferParams


class PoolUnavailable(Exception):
    """The pool is down (a fault window)."""


class PoolHost:
    """The pool's blocks, transfers and faults; call from the event loop only."""

    def __init__(self, pool: DdrPool, links: TransferParams, faults: PoolFaults,
                 clock: EmulatedClock, kv_bytes_per_token: int) -> None:
        self.pool = pool
        self.transfers = TransferModel(links)
        self.faults = faults
        self.clock = clock
        self.block_bytes = pool.block_size * kv_bytes_per_token
        self.refused = 0
        self._changes = faults.changes()
        self._applied = 0  # how many of ``_changes`` are in effect
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def _up(self) -> bool:
        """Apply the fault windows up to now; whether the pool answers."""
        now = self.clock.now()
        while self._applied < len(self._changes) and self._changes[self._applied] <= now:
            at = self._changes[self._applied]
            self._applied += 1
            factor = self.faults.factor(at)
            if factor > 0:
                self.transfers.set_factor(at, factor)
            if self.faults.recovered_at(at):
                self.pool.clear()
        if self.faults.down(now):
            self.refused += 1
            return False
        return True

    def _check(self) -> None:
        if not self._up():
            raise PoolUnavailable("the DDR pool is down")

    def lookup(self, hashes: Sequence[int], skip: int = 0) -> int:
        """How many of ``hashes`` past the first ``skip`` the pool serves (no transfer)."""
        self._check()
        return self.pool.lookup(hashes, skip, self.clock.now()) if hashes else 0

    def held(self, hashes: Sequence[int]) -> list[int]:
        """Which of ``hashes`` the pool holds; refreshes nothing (diagnostics, and the real-engine
        tier's block files, collected once their keys leave the pool)."""
        self._check()
        return [h for h in hashes if h in self.pool]

    def insert(self, hashes: Sequence[int]) -> int:
        """Put ``hashes``; returns the new blocks."""
        self._check()
        return self.pool.insert(hashes, self.clock.now()) if hashes else 0

    def store(self, hashes: Sequence[int], hbm_blocks: int = 0, ddr_blocks: int = 0) -> int:
        """A prefill is done: write its prompt's blocks as the connector profile says."""
        self._check()
        return self.pool.store(hashes, hbm_blocks, ddr_blocks, self.clock.now())

    def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int = 0,
               ddr_blocks: int = 0) -> int:
        """A request is over: its answer's blocks and end-of-request refresh, as the profile
        says."""
        self._check()
        return self.pool.finish(prompt, answer, hbm_blocks, ddr_blocks, self.clock.now())

    async def load(self, hashes: Sequence[int], device: int, skip: int = 0) -> int:
        """Look ``hashes`` up past the first ``skip`` and move the blocks served to ``device``'s
        HBM; returns how many, once they are there."""
        hits = self.lookup(hashes, skip)
        if hits == 0 or self.clock.time_scale <= 0:  # time scale 0: nothing ever waits
            return hits
        done = asyncio.get_running_loop().create_future()
        tid = self.transfers.start(self.clock.now(), device, hits * self.block_bytes)
        self._waiting[tid] = done
        self._arm()
        await done
        return hits

    def _arm(self) -> None:
        """Wake up when the earliest transfer in flight has its last byte."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        end = self.transfers.next_done()
        if end == math.inf:
            return
        delay = max(0.0, (end - self.clock.now()) * self.clock.time_scale)
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = self.clock.now()
        for tid, ready in self.transfers.finish_due(now):
            done = self._waiting.pop(tid, None)
            if done is not None:
                delay = max(0.0, (ready - now) * self.clock.time_scale)
                loop.call_later(delay, _resolve, done)
        self._arm()

    def close(self) -> None:
        """Stop timing; loads still waiting are cancelled."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for done in self._waiting.values():
            done.cancel()
        self._waiting.clear()

    def stats(self) -> dict[str, float]:
        """The pool's counters plus its links'."""
        return {**self.pool.stats(), "transfers": self.transfers.transfers_started,
                "transfers_in_flight": len(self.transfers),
                "read_bytes": self.transfers.bytes_moved, "refused": self.refused}


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():  # a caller that gave up cancelled it
        done.set_result(None)
