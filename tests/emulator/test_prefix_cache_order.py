"""The prefix cache against a plain model of vLLM's free-block queue, over random requests.

The cache keeps its eviction order per release (for speed); the model below keeps it per block, as
vLLM does, one Python step at a time. Every operation must leave both with the same blocks, the
same eviction order and the same counters.
"""

from __future__ import annotations

import random

import pytest

from emulator.prefix_cache import Hold, PrefixCache


class FreeBlockQueue:
    """Reference: refcounts, and a list of free blocks, least recently freed first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.refs: dict[int, int] = {}
        self.free: list[int] = []
        self.reserved = 0
        self.evictions = 0

    def acquire(self, hashes: list[int], extra: int) -> None:
        for h in hashes:
            if self.refs.get(h) == 0:
                self.free.remove(h)
            self.refs[h] = self.refs.get(h, 0) + 1
        self.reserved += extra
        self.evict()

    def release(self, hashes: list[int], extra: int) -> None:
        for h in reversed(hashes):
            if h not in self.refs:
                continue
            if self.refs[h] <= 1:
                if h in self.free:
                    self.free.remove(h)
                self.refs[h] = 0
                self.free.append(h)
            else:
                self.refs[h] -= 1
        self.reserved = max(0, self.reserved - extra)
        self.evict()

    def evict(self) -> None:
        while self.free and len(self.refs) + self.reserved > self.capacity:
            del self.refs[self.free.pop(0)]
            self.evictions += 1


def chain(rng: random.Random, sessions: list[list[int]]) -> list[int]:
    """A prompt: a shared first block, then some of a session's blocks, which grow (as chained
    hashes do, a block always follows the same block)."""
    if not sessions or rng.random() < 0.2:
        sessions.append([])
    blocks = rng.choice(sessions)
    blocks += [rng.randrange(1 << 40) for _ in range(rng.randrange(0, 5))]
    return [7, *blocks[: rng.randrange(len(blocks) + 1)]]


@pytest.mark.parametrize("seed", range(12))
def test_the_cache_evicts_exactly_as_vllms_free_block_queue(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([4, 16, 64, 4096])  # 4096: never full, the queue is compacted instead
    cache, model = PrefixCache(capacity, 1), FreeBlockQueue(capacity)
    sessions: list[list[int]] = []
    running: list[tuple[list[int], int, Hold]] = []
    for _ in range(1500):
        if running and (len(running) > 6 or rng.random() < 0.5):
            hashes, extra, hold = running.pop(rng.randrange(len(running)))
            # With its hold, or found again by its hashes (as a caller without one would).
            cache.release(hashes, extra, hold if rng.random() < 0.7 else None)
            model.release(hashes, extra)
        else:
            hashes, extra = chain(rng, sessions), rng.randrange(3)
            assert cache.match(hashes) == next(
                (k for k, h in enumerate(hashes) if h not in model.refs), len(hashes))
            hold = cache.acquire(hashes, extra)
            model.acquire(hashes, extra)
            running.append((hashes, extra, hold))
        assert cache.free_order() == model.free
        assert len(cache) == len(model.refs) and cache.blocks() == set(model.refs)
        assert cache.evictions == model.evictions
        assert cache.pinned_blocks == len(model.refs) - len(model.free) + model.reserved


def test_a_cache_that_never_fills_keeps_a_bounded_queue() -> None:
    cache = PrefixCache(capacity_tokens=1 << 20, block_size=1)
    prompt = list(range(100))
    for _ in range(5000):
        cache.acquire(prompt)
        cache.release(prompt)
    assert cache.free_order() == prompt[::-1]
    assert len(cache._queue) <= 1024 + 2  # stale entries are dropped, not kept for each release
