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
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

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


class CacheObserver(Protocol):
    """Hears what the cache stores and evicts, in order (vLLM's KV cache events' facts).

    Called synchronously from the cache's own methods; an observer must not call back into it.
    """

    def stored(self, hashes: Sequence[int], start: int) -> None:
        """``hashes[start:]`` were just cached (``hashes``: every block the request holds, so
        ``hashes[start - 1]`` is the first new block's parent when ``start`` > 0)."""

    def removed(self, hashes: Sequence[int]) -> None:
        """``hashes`` were evicted, in the order they left (the first left first)."""

    def cleared(self) -> None:
        """Every cached block was dropped at once (:meth:`PrefixCache.reset`)."""


class _Run:
    """Consecutive cached blocks of one prefix that are held, freed and queued together."""

    __slots__ = ("blocks", "place", "refs")

    def __init__(self, blocks: list[int], refs: int) -> None:
        self.blocks = blocks
        self.refs = refs  # running requests holding every block of it
        self.place = 0  # when free: its entry in the eviction queue (0: none)


class Hold(NamedTuple):
    """The runs one :meth:`PrefixCache.acquire` pinned, valid while no run has been cut."""

    splits: int  # the cache's cuts when acquired
    runs: list[_Run]


class PrefixCache:
    """HBM prefix cache: capacity in tokens, reference-counted blocks, LRU over free blocks.

    Blocks are kept in runs (a prefix tree's edges, keyed by their first block): a request holds,
    frees and queues a few runs rather than every block one by one, which is what makes a fleet
    of thousands of engines quick to simulate. The order of eviction is still vLLM's, block by
    block. This relies on what chained hashes guarantee: a block's hash determines its prefix,
    so a block never follows two different blocks.
    """

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self._runs: dict[int, _Run] = {}  # by first block
        # Free runs, least recently freed first, as (run, place); an entry whose run has been
        # held or freed again since (a different place) is stale and skipped.
        self._queue: deque[tuple[_Run, int]] = deque()
        self._places = 0
        self._cached = 0  # blocks
        self._free = 0  # blocks no running request holds
        self.reserved_blocks = 0  # partial/decode blocks of running requests (never cached)
        self.evictions = 0
        self.version = 0  # goes up whenever the set of cached blocks changes
        self._splits = 0  # runs cut in two so far
        # Hears stores and evictions (KV events); None costs one attribute test per change.
        self.observer: CacheObserver | None = None

    def __len__(self) -> int:
        return self._cached

    def __contains__(self, block: int) -> bool:
        """Whether ``block`` is cached (a scan: for tests and inspection)."""
        return any(block in run.blocks for run in self._runs.values())

    def blocks(self) -> set[int]:
        """Every cached block; for tests and inspection."""
        return {h for run in self._runs.values() for h in run.blocks}

    def match(self, hashes: Sequence[int], limit: int | None = None) -> int:
        """Number of leading ``hashes`` present, at most ``limit`` (does not touch LRU order)."""
        runs = self._runs
        end = len(hashes) if limit is None else min(limit, len(hashes))
        n = 0
        while n < end:
            run = runs.get(hashes[n])
            if run is None:
                break
            size = len(run.blocks)
            if hashes[n : n + size] == run.blocks:
                n += size
                continue
            n += _common(hashes, n, run.blocks)
            break
        return min(n, end)

    def acquire(self, hashes: Sequence[int], extra_blocks: int = 0) -> Hold:
        """Pin ``hashes`` for a running request, inserting the missing ones (evicting LRU blocks).

        ``extra_blocks`` reserves room for the request's partial and generated-token blocks.
        Capacity is soft: if every cached block is pinned, the cache grows past it rather than
        failing (vLLM would preempt; the emulator only needs hit rates to be right). The
        returned hold, given back to :meth:`release`, saves looking the blocks up again.
        """
        runs = self._runs
        held: list[_Run] = []
        n = len(hashes)
        pos = 0
        while pos < n:
            run = runs.get(hashes[pos])
            if run is None:
                break
            size = len(run.blocks)
            if hashes[pos : pos + size] != run.blocks:  # the prompt leaves or ends inside it
                size = _common(hashes, pos, run.blocks)
                run = self._split(run, size)
            if run.refs == 0:
                self._free -= size
            run.refs += 1
            held.append(run)
            pos += size
        new = n - pos
        if new:
            run = runs[hashes[pos]] = _Run(list(hashes[pos:]), 1)
            held.append(run)
            self._cached += new
            self.version += 1
        self.reserved_blocks += extra_blocks
        if new or extra_blocks:
            self._evict()
        if new and self.observer is not None:
            # After the evictions that made room for them, as vLLM allocates then caches.
            self.observer.stored(hashes, pos)
        return Hold(self._splits, held)

    def _split(self, run: _Run, size: int) -> _Run:
        """Cut ``run`` after ``size`` blocks; the first part is returned, the rest stays ``run``
        (keeping its place in the queue: it is where those blocks are in the free order)."""
        self._splits += 1
        blocks = run.blocks
        head = _Run(blocks[:size], run.refs)
        run.blocks = blocks[size:]
        self._runs[blocks[0]] = head
        self._runs[blocks[size]] = run
        return head

    def release(self, hashes: Sequence[int], extra_blocks: int = 0,
                hold: Hold | None = None) -> None:
        """Unpin blocks pinned by :meth:`acquire` (``hold``: what it returned); blocks reaching
        zero refs join the LRU queue."""
        runs = self._runs
        if hold is not None and hold.splits == self._splits:
            held = hold.runs  # still exactly the runs it pinned: no run has been cut since
        else:
            held = []
            n = len(hashes)
            pos = 0
            while pos < n:
                run = runs.get(hashes[pos])
                if run is None or pos + len(run.blocks) > n:
                    break  # not what acquire pinned
                held.append(run)
                pos += len(run.blocks)
        freed: list[_Run] = []
        for run in held:
            if run.refs <= 1:
                if run.refs == 1:
                    self._free += len(run.blocks)
                run.refs = 0
                freed.append(run)
            else:
                run.refs -= 1
        # Tail first, so the end of this prompt is evicted before its shared beginning.
        for run in reversed(freed):
            self._places += 1
            run.place = self._places
            self._queue.append((run, self._places))
        self.reserved_blocks = max(0, self.reserved_blocks - extra_blocks)
        self._evict()
        if len(self._queue) > 2 * len(runs) + 1024:
            self._queue = deque(entry for entry in self._queue if _queued(entry))

    def _evict(self) -> None:
        excess = min(self._free, self._cached + self.reserved_blocks - self.capacity_blocks)
        if excess <= 0:
            return
        queue = self._queue
        self._free -= excess
        self._cached -= excess
        self.evictions += excess
        self.version += 1
        gone: list[int] | None = [] if self.observer is not None else None
        while excess > 0:
            if not _queued(queue[0]):
                queue.popleft()
                continue
            run = queue[0][0]
            blocks = run.blocks
            if len(blocks) > excess:  # its tail goes first
                if gone is not None:
                    gone.extend(reversed(blocks[len(blocks) - excess :]))
                del blocks[len(blocks) - excess :]
                break
            queue.popleft()
            excess -= len(blocks)
            if gone is not None:
                gone.extend(reversed(blocks))
            del self._runs[blocks[0]]
            run.place = 0
        if gone and self.observer is not None:
            self.observer.removed(gone)

    def reset(self) -> bool:
        """Drop every cached block, as vLLM's ``reset_prefix_cache``: only when no running
        request holds any (else nothing changes and the answer is False)."""
        if self.pinned_blocks:
            return False
        self._runs.clear()
        self._queue.clear()
        self._cached = self._free = 0
        self.version += 1
        self._splits += 1  # holds taken before are void
        if self.observer is not None:
            self.observer.cleared()
        return True

    @property
    def pinned_blocks(self) -> int:
        """Blocks held by running requests (cached ones plus reserved partial/decode blocks)."""
        return self._cached - self._free + self.reserved_blocks

    def usage(self) -> float:
        """Fraction of capacity held by running requests, like ``vllm:kv_cache_usage_perc``."""
        if self.capacity_blocks == 0:
            return 0.0
        return min(1.0, self.pinned_blocks / self.capacity_blocks)

    def free_order(self) -> list[int]:
        """Free blocks in eviction order (first is evicted first); for tests and inspection."""
        return [h for entry in self._queue if _queued(entry) for h in reversed(entry[0].blocks)]


def _queued(entry: tuple[_Run, int]) -> bool:
    run, place = entry
    return run.refs == 0 and run.place == place


def _common(hashes: Sequence[int], start: int, blocks: list[int]) -> int:
    """How many of ``blocks`` ``hashes`` has from ``start`` on (the first always matches)."""
    end = min(len(blocks), len(hashes) - start)
    k = 1
    while k < end and hashes[start + k] == blocks[k]:
        k += 1
    return k
