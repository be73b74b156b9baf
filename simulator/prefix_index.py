"""A router's approximate prefix index: per engine, the prompt blocks the router itself sent
there, least recently used forgotten past a capacity. It is what llm-d's approximate
prefix-cache scorer and Dynamo's KV router without KV events keep; it never sees the engine's
true cache (its evictions, the DDR pool).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """Per engine, an LRU set of block hashes. A prompt's blocks are chained (block k's hash
    covers blocks 0..k), and they are recorded last first, so the first blocks are always the
    most recent: what an engine holds of a prompt is a prefix, found by binary search."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"prefix index capacity must be >= 1 block, got {capacity_blocks}")
        self.capacity = capacity_blocks
        self._engines: dict[str, OrderedDict[int, None]] = {}

    def match(self, address: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` the router believes `address` holds."""
        blocks = self._engines.get(address)
        if not blocks or not hashes:
            return 0
        lo, hi = 0, len(hashes)  # hashes[:lo] held; hashes[hi:] not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def record(self, address: str, hashes: Sequence[int]) -> None:
        """The router sent a prompt of these blocks to `address`."""
        blocks = self._engines.setdefault(address, OrderedDict())
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def forget(self, address: str) -> None:
        self._engines.pop(address, None)
