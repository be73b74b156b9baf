"""The shared DDR KV pool model (MemCache / Mooncake Store stand-in); pure, no I/O.

Keyed by block hash with its own capacity in tokens and LRU eviction at watermarks, as MemCache
evicts: once the pool holds more than ``high`` of its capacity, least recently used blocks go until
it holds ``low`` (MemCache's defaults: 90 % and 80 %). Only the keys are stored (an ordered dict of
ints to ``None``): about 127 bytes per block, so 1M blocks fit in ~130 MB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

HIGH_WATERMARK = 0.9  # MemCache's defaults (docs/benchmarks.md)
LOW_WATERMARK = 0.8


class DdrPool:
    """Block-hash keyed LRU set with a capacity in tokens and high/low eviction watermarks."""

    def __init__(self, capacity_tokens: int, block_size: int, high: float = HIGH_WATERMARK,
                 low: float = LOW_WATERMARK) -> None:
        if not 0 < low <= high <= 1:
            raise ValueError(f"pool watermarks must satisfy 0 < low <= high <= 1, got "
                             f"low {low:g}, high {high:g}")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self.high_blocks = int(high * self.capacity_blocks)
        self.low_blocks = int(low * self.capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.lookups = 0
        self.hit_blocks = 0
        self.inserted_blocks = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def lookup(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` present; those are touched (most recently used)."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            n += 1
        self.lookups += 1
        self.hit_blocks += n
        return n

    def insert(self, hashes: Sequence[int]) -> int:
        """Store ``hashes`` (refreshing present ones), evicting LRU blocks; returns new blocks."""
        blocks = self._blocks
        new = 0
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                new += 1
        if len(blocks) > self.high_blocks:
            while len(blocks) > self.low_blocks:
                blocks.popitem(last=False)
                self.evictions += 1
        self.inserted_blocks += new
        return new

    def clear(self) -> None:
        """Forget every block (a pool that restarted without its metadata)."""
        self._blocks.clear()

    def stats(self) -> dict[str, int]:
        """Counters and occupancy, for the pool service's /stats and tests."""
        return {
            "blocks": len(self._blocks),
            "capacity_blocks": self.capacity_blocks,
            "high_watermark_blocks": self.high_blocks,
            "low_watermark_blocks": self.low_blocks,
            "block_size": self.block_size,
            "lookups": self.lookups,
            "hit_blocks": self.hit_blocks,
            "inserted_blocks": self.inserted_blocks,
            "evictions": self.evictions,
        }
