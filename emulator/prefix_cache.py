"""vLLM-style prefix cache over chained block hashes (pure, no I/O).

A block's hash covers its parent's hash and its own tokens, so equal hashes mean equal prefixes.
Only full blocks are hashed and cached. A hit is the longest run of cached leading blocks, capped
so that at least one prompt token is computed (the n-1 rule: the model must run on the last token
to produce logits). Blocks no running request holds are evicted least recently used first; like
vLLM's free-block queue, a finished request's blocks are queued tail first, so the end of a prefix
is evicted before its beginning.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

import xxhash


def root_hash(model: str, block_size: int) -> int:
    """Parent hash of a prompt's first block: instances of different models never share blocks."""
    return xxhash.xxh3_64_intdigest(f"kvgate-emulator|{model}|{block_size}".encode())


def block_hashes(tokens: Sequence[int], block_size: int, root: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (a trailing partial block is not hashed)."""
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    # One bytes buffer, sliced per block: avoids building a tuple per block.
    raw = array("Q", tokens[: n_full * block_size]).tobytes()
    width = block_size * 8
    hashes: list[int] = []
    parent = root
    for i in range(n_full):
        h = xxhash.xxh3_64()
        h.update(parent.to_bytes(8, "little"))
        h.update(raw[i * width : (i + 1) * width])
        parent = h.intdigest()
        hashes.append(parent)
    return hashes


def max_hit_blocks(num_tokens: int, block_size: int) -> int:
    """Most leading blocks a prompt of ``num_tokens`` may take from cache (the n-1 rule)."""
    return max(0, num_tokens - 1) // block_size


class PrefixCache:
    """HBM prefix cache: capacity in tokens, reference-counted blocks, LRU over free blocks."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self._refs: dict[int, int] = {}  # every cached block -> number of running requests
        self._free: OrderedDict[int, None] = OrderedDict()  # refcount-0 blocks, LRU first
        self.reserved_blocks = 0  # partial/decode blocks of running requests (never cached)
        self.evictions = 0
        self._inserted = 0

    @property
    def version(self) -> tuple[int, int, int]:
        """Changes whenever the set of cached blocks does (this cache, insertions, evictions)."""
        return id(self), self._inserted, self.evictions

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, block: int) -> bool:
        return block in self._refs

    def match(self, hashes: Sequence[int], limit: int | None = None) -> int:
        """Number of leading ``hashes`` present, at most ``limit`` (does not touch LRU order)."""
        refs = self._refs
        end = len(hashes) if limit is None else min(limit, len(hashes))
        n = 0
        while n < end and hashes[n] in refs:
            n += 1
        return n

    def acquire(self, hashes: Sequence[int], extra_blocks: int = 0) -> None:
        """Pin ``hashes`` for a running request, inserting the missing ones (evicting LRU blocks).

        ``extra_blocks`` reserves room for the request's partial and generated-token blocks.
        Capacity is soft: if every cached block is pinned, the cache grows past it rather than
        failing (vLLM would preempt; the emulator only needs hit rates to be right).
        """
        refs = self._refs
        free = self._free
        new = 0
        for h in hashes:
            count = refs.get(h)
            if count is None:
                refs[h] = 1
                new += 1
            else:
                if count == 0:
                    del free[h]
                refs[h] = count + 1
        self.reserved_blocks += extra_blocks
        self._inserted += new
        if new or extra_blocks:
            self._evict()

    def release(self, hashes: Sequence[int], extra_blocks: int = 0) -> None:
        """Unpin blocks pinned by :meth:`acquire`; blocks reaching zero refs join the LRU queue."""
        refs = self._refs
        free = self._free
        # Tail first, so the end of this prompt is evicted before its shared beginning.
        for h in reversed(hashes):
            count = refs.get(h)
            if count is None:
                continue
            if count <= 1:
                refs[h] = 0
                if count == 1:
                    free[h] = None  # a held block is never in the queue: this appends
                else:
                    free.move_to_end(h)
            else:
                refs[h] = count - 1
        self.reserved_blocks = max(0, self.reserved_blocks - extra_blocks)
        self._evict()

    def _evict(self) -> None:
        refs = self._refs
        free = self._free
        excess = min(len(free), len(refs) + self.reserved_blocks - self.capacity_blocks)
        if excess > 0:
            victims = list(islice(free, excess))
            for h in victims:
                del free[h]
                del refs[h]
            self.evictions += excess

    @property
    def pinned_blocks(self) -> int:
        """Blocks held by running requests (cached ones plus reserved partial/decode blocks)."""
        return len(self._refs) - len(self._free) + self.reserved_blocks

    def usage(self) -> float:
        """Fraction of capacity held by running requests, like ``vllm:kv_cache_usage_perc``."""
        if self.capacity_blocks == 0:
            return 0.0
        return min(1.0, self.pinned_blocks / self.capacity_blocks)

    def free_order(self) -> list[int]:
        """Free blocks in eviction order (first is evicted first); for tests and inspection."""
        return list(self._free)
