"""The shared DDR KV pool model (MemCache / Mooncake Store / LMCache / vLLM's CPU offload
stand-in); pure, no I/O.

Keyed by block hash with its own capacity in tokens. What a lookup refreshes, what a request
writes and how the pool evicts come from its connector profile (:mod:`emulator.pool_profiles`).
Only the keys are kept, in the order they would be evicted: about 127 bytes per block under LRU,
so 1M blocks fit in ~130 MB. Under leases that order is the lease's end, ascending: blocks put
and never read (whose end is their write time) in one ordered dict, leased ones in another.

Every call takes ``now`` in emulated seconds (leases run out in emulated time); a profile
without leases ignores it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from emulator.pool_profiles import Eviction, LookupScope, PoolProfile, Refresh, StoreScope
from emulator.pool_profiles import by_name as profile_by_name


class DdrPool:
    """Block-hash keyed pool with a capacity in tokens, filled and evicted as ``profile`` says."""

    def __init__(self, capacity_tokens: int, block_size: int,
                 profile: PoolProfile | str | None = None, high: float | None = None,
                 low: float | None = None) -> None:
        self.profile = (profile if isinstance(profile, PoolProfile)
                        else profile_by_name(profile))
        high = self.profile.high_watermark if high is None else high
        low = self.profile.low_watermark if low is None else low
        if not 0 < low <= high <= 1:
            raise ValueError(f"pool watermarks must satisfy 0 < low <= high <= 1, got "
                             f"low {low:g}, high {high:g}")
        self.block_size = block_size
        self.chunk = self.profile.chunk_blocks(block_size)
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self.high_blocks = int(high * self.capacity_blocks)
        self.low_blocks = int(low * self.capacity_blocks)
        self._leases = self.profile.eviction is Eviction.LEASE
        # LRU: every block, least recently used first. Leases: blocks put and never leased, by
        # write time (their lease_timeout then); ``_leased``: the others, by lease end.
        self._blocks: OrderedDict[int, float] = OrderedDict()  # -> write time (leases only)
        self._leased: OrderedDict[int, float] = OrderedDict()
        self.lookups = 0
        self.hit_blocks = 0
        self.inserted_blocks = 0
        self.evictions = 0
        self.dropped_puts = 0

    def __len__(self) -> int:
        return len(self._blocks) + len(self._leased)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks or block in self._leased

    def keys(self) -> list[int]:
        """The blocks held, the next to be evicted first (for tests comparing two pools)."""
        if not self._leases:
            return list(self._blocks)
        return [h for h, _ in self._eviction_order(math.inf)]

    # ---- what a connector does --------------------------------------------------------------

    def lookup(self, hashes: Sequence[int], skip: int = 0, now: float = 0.0) -> int:
        """How many of ``hashes`` (the prompt's blocks, up to the hit cap) past the first
        ``skip`` (the engine's HBM hit) the pool serves, looked up and refreshed as the profile
        says."""
        profile = self.profile
        start = 0 if profile.lookup_scope is LookupScope.PROMPT else min(skip, len(hashes))
        end = start
        for h in hashes[start:]:
            if h not in self:
                break
            end += 1
        end -= end % self.chunk  # a chunk is hit whole or not at all
        served = max(0, end - skip)
        refresh = profile.lookup_refresh
        if refresh is Refresh.HITS:
            self._touch(hashes[start:end])
        elif refresh is Refresh.LOADED:
            self._touch(hashes[skip : skip + served])
        elif refresh is Refresh.LEASE_ALL:
            self._lease(hashes[start:], now)
        self.lookups += 1
        self.hit_blocks += served
        return served

    def held_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` a lookup from block 0 would find (whole
        chunks); a pure query, nothing refreshed or leased."""
        found = 0
        for h in hashes:
            if h not in self:
                break
            found += 1
        return found - found % self.chunk

    def store(self, prompt: Sequence[int], hbm_blocks: int = 0, ddr_blocks: int = 0,
              now: float = 0.0) -> int:
        """A request's prefill is done (``hbm_blocks`` of its prompt came from HBM,
        ``ddr_blocks`` then from the pool): put the blocks the profile offers that the pool
        lacks. Returns the new blocks."""
        offered = self._offered(prompt, hbm_blocks, ddr_blocks)
        if self.profile.store_leases:  # the existence check before the put
            self._lease(offered, now)
        return self.insert(offered, now)

    def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int = 0,
               ddr_blocks: int = 0, now: float = 0.0) -> int:
        """A request is over: one refresh of the blocks it loaded or offered, and its decode
        blocks ``answer`` written, if the profile does either. Returns the new blocks."""
        profile = self.profile
        if profile.touch_at_end:  # the blocks it loaded, and those it offered
            start, full = self._offer_range(len(prompt), hbm_blocks, ddr_blocks)
            self._touch(prompt[hbm_blocks if start else 0 : full])
        return self.insert(answer, now) if profile.store_decode and answer else 0

    def _offer_range(self, blocks: int, hbm_blocks: int, ddr_blocks: int) -> tuple[int, int]:
        """[start, end) of a prompt's blocks a store offers: whole chunks, from the first block,
        or past a load from the pool where the profile says so (start 0: no such skip)."""
        full = blocks - blocks % self.chunk
        if self.profile.store_scope is StoreScope.PAST_LOAD and ddr_blocks:
            return hbm_blocks + ddr_blocks, full
        return 0, full

    def _offered(self, prompt: Sequence[int], hbm_blocks: int, ddr_blocks: int) -> Sequence[int]:
        start, full = self._offer_range(len(prompt), hbm_blocks, ddr_blocks)
        return prompt[start:full]

    # ---- the pool itself --------------------------------------------------------------------

    def insert(self, hashes: Iterable[int], now: float = 0.0) -> int:
        """Put the ``hashes`` the pool lacks (a put of one it holds refreshes nothing, in every
        profile), making room as the profile says; returns the new blocks."""
        new = 0
        blocks = self._blocks
        for h in hashes:
            if h in self:
                continue
            if len(self) >= self.capacity_blocks and not self._make_room(now):
                self.dropped_puts += 1  # nothing may go: the put fails, as a full store's does
                continue
            blocks[h] = now
            new += 1
        self.inserted_blocks += new
        if len(self) > self.high_blocks:
            self._evict(now)
        return new

    def _make_room(self, now: float) -> bool:
        self._evict(now, at_least=1)
        return len(self) < self.capacity_blocks

    def _evict(self, now: float, at_least: int = 0) -> None:
        held = len(self)
        if not self._leases:
            goal = max(at_least, held - self.low_blocks)
            blocks = self._blocks
            for _ in range(min(goal, held)):
                blocks.popitem(last=False)
            self.evictions += min(goal, held)
            return
        # Mooncake's BatchEvict: at least the ratio, more as far as usage is past the mark.
        capacity = max(1, self.capacity_blocks)
        share = max(self.profile.evict_ratio, (held - self.high_blocks) / capacity
                    + self.profile.evict_ratio)
        goal = max(at_least, math.ceil(held * share))
        doomed = [h for h, _ in zip(self._eviction_order(now), range(goal), strict=False)]
        for h, leased in doomed:
            del (self._leased if leased else self._blocks)[h]
        self.evictions += len(doomed)

    def _eviction_order(self, now: float) -> Iterator[tuple[int, bool]]:
        """(block, leased) by lease end ascending, only those whose lease ran out by ``now``:
        the two ordered dicts merged (a put's end is its write time, never after now)."""
        fresh = iter(self._blocks.items())
        leased = iter(self._leased.items())
        f = next(fresh, None)
        lease = next(leased, None)
        while f is not None:
            if lease is not None and lease[1] <= now and lease[1] < f[1]:
                yield lease[0], True
                lease = next(leased, None)
            else:
                yield f[0], False
                f = next(fresh, None)
        while lease is not None and lease[1] <= now:
            yield lease[0], True
            lease = next(leased, None)

    def _touch(self, hashes: Sequence[int]) -> None:
        """Make ``hashes`` most recently used, the head last if the profile walks tail first."""
        blocks = self._blocks
        for h in (reversed(hashes) if self.profile.head_last else hashes):
            if h in blocks:
                blocks.move_to_end(h)

    def _lease(self, hashes: Iterable[int], now: float) -> None:
        """A read lease on every block of ``hashes`` the pool holds."""
        end = now + self.profile.lease_s
        leased, fresh = self._leased, self._blocks
        for h in hashes:
            if h in leased:
                if end > leased[h]:
                    leased[h] = end
                    leased.move_to_end(h)
            elif h in fresh:
                del fresh[h]
                leased[h] = end

    def clear(self) -> None:
        """Forget every block (a pool that restarted without its metadata)."""
        self._blocks.clear()
        self._leased.clear()

    def stats(self) -> dict[str, int]:
        """Counters and occupancy, for the pool service's /stats and tests."""
        return {
            "blocks": len(self),
            "capacity_blocks": self.capacity_blocks,
            "high_watermark_blocks": self.high_blocks,
            "low_watermark_blocks": self.low_blocks,
            "block_size": self.block_size,
            "lookups": self.lookups,
            "hit_blocks": self.hit_blocks,
            "inserted_blocks": self.inserted_blocks,
            "evictions": self.evictions,
            "dropped_puts": self.dropped_puts,
        }
